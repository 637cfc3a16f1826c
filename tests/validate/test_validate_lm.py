"""``ptopt validate`` for causal language models on text (issue 28): perplexity, decode/prefill
tokens/s, weight bytes, bytes on disk and peak memory of a reference and its weight-only artifacts;
the perplexity and tokens/s gates; every report format; bad input. Small seeded Llama folders
(mechanics, not quality); the timing is as short as it goes and never asserted."""

from __future__ import annotations

import json

import pytest
import torch

import ptopt
from ptopt.core.errors import GateFailedError
from ptopt.core.hf import load_causal_lm
from ptopt.core.lm import perplexity
from ptopt.formats.hf import load_weight_only
from tests.compress.hf_models import llama, word_tokenizer
from tests.helpers import assert_refused

VOCAB = 512
#: the shortest timing: one round, a 16-token prompt, 3 new tokens
FAST = ("--rounds", "1", "--prompt-tokens", "16", "--new-tokens", "3")
CNN = "tests.helpers:tiny_cnn"
FAST_API = {"rounds": 1, "prompt_tokens": 16, "new_tokens": 3, "progress": None}


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """{"ref": fp32 folder (with a word tokenizer), "int8": its weight-only folder, "bare": a folder
    without a tokenizer, "other": a weight-only folder of a 256-token vocabulary, "ids": 700 token ids,
    "text": the same ids as text, "wide": ids past the vocabulary}."""
    root = tmp_path_factory.mktemp("vallm")
    llama(VOCAB).save_pretrained(root / "llama")
    word_tokenizer(root / "llama", VOCAB)
    llama(VOCAB).save_pretrained(root / "bare")
    ptopt.quantize(root / "llama", "weight-only", root / "llama.int8")
    ptopt.quantize(root / "llama", "weight-only", root / "llama.int4", bits=4, group_size=64)
    llama(256).save_pretrained(root / "small")
    ptopt.quantize(root / "small", "weight-only", root / "small.int8")
    ids = torch.randint(1, VOCAB, (700,), generator=torch.Generator().manual_seed(3))
    torch.save(ids, root / "eval.pt")
    (root / "eval.txt").write_text(" ".join(f"w{i}" for i in ids.tolist()), encoding="utf-8")
    torch.save(torch.tensor([1, 2, VOCAB + 5]), root / "wide.pt")
    return {"ref": root / "llama", "int8": root / "llama.int8", "bare": root / "bare", "other": root / "small.int8",
            "ids": root / "eval.pt", "text": root / "eval.txt", "wide": root / "wide.pt", "int4": root / "llama.int4",
            "root": root}  # fmt: skip


def test_api_perplexity_is_core_lm_perplexity(lm):
    res = ptopt.validate(
        lm["ref"], [lm["int8"]], lm["ids"], context=128, stride=64, max_perplexity_increase=5, **FAST_API
    )
    ids = torch.load(lm["ids"])
    want_ref = perplexity(load_causal_lm(lm["ref"]), ids, 128, 64)
    want_int8 = perplexity(load_weight_only(lm["int8"]), ids, 128, 64)
    ref, art = res.reference["lm"], res.entry("llama.int8")["lm"]
    assert ref["perplexity"] == pytest.approx(want_ref["perplexity"], rel=1e-9)
    assert art["perplexity"] == pytest.approx(want_int8["perplexity"], rel=1e-9)
    assert art["perplexity_increase_pct"] == pytest.approx(100 * (art["perplexity"] / ref["perplexity"] - 1))
    assert (
        res.data["task"] == "causal-lm"
        and res.data["lm"]["context"] == 128
        and res.data["lm"]["stride"] == 64
    )
    assert res.data["lm"]["scored_tokens"] == want_ref["tokens"] == 699
    assert res.passed and res.best == "llama.int8" and res.failed_gates == []
    assert art["decode_tokens_per_s"] > 0 and art["prefill_tokens_per_s"] > 0 and art["rounds"] == 1
    assert art["weight_bytes"] < 0.5 * ref["weight_bytes"]
    files = sorted(p for p in lm["int8"].rglob("*") if p.is_file())
    assert res.entry("llama.int8")["size"]["bytes"] == sum(p.stat().st_size for p in files)
    assert (
        res.entry("llama.int8")["size"]["gzip_bytes"] is None
    )  # no deflate pass over LM weights (48 s for SmolLM2)
    assert res.entry("llama.int8")["precision"] == "int8" and res.reference["precision"] == "fp32"


def test_api_in_memory_models_and_text_through_the_tokenizer(lm):
    """An in-memory reference, an unsaved weight-only Result, and text the folder's tokenizer reads."""
    q = ptopt.quantize(lm["ref"], "weight-only")
    module = load_causal_lm(lm["ref"])
    ids = torch.load(lm["ids"])
    res = ptopt.validate(module, q, ids, **FAST_API)
    assert res.reference["lm"]["perplexity"] == pytest.approx(perplexity(module, ids)["perplexity"], rel=1e-9)
    assert res.entries[0]["lm"]["perplexity"] == pytest.approx(
        perplexity(q.model, ids)["perplexity"], rel=1e-9
    )
    assert res.data["lm"]["context"] == 512 and res.data["lm"]["stride"] == 256  # core.lm's defaults
    # named by what it is and how it was made (two such results read LlamaForCausalLM, LlamaForCausalLM (2))
    assert res.entries[0]["name"] == "hf_weight_only int8 weight-only torchao rtn (in memory)"
    by_text = ptopt.validate(lm["ref"], lm["int8"], lm["text"], **FAST_API)
    assert by_text.reference["lm"]["perplexity"] == pytest.approx(res.reference["lm"]["perplexity"], rel=1e-9)


def test_cli_every_report_has_the_lm_columns(cli, lm, tmp_path):
    r = {k: tmp_path / f"r.{k}" for k in ("json", "md", "xml", "html")}
    code, out, err = cli("validate", lm["ref"], lm["int8"], "--data", lm["ids"], *FAST, "--max-perplexity-increase", "5",
                         "--json", r["json"], "--markdown", r["md"], "--junit", r["xml"], "--report", r["html"])  # fmt: skip
    assert code == 0, err
    for text in (out, r["md"].read_text(), r["html"].read_text()):
        for column in (
            "perplexity",
            "ppl +%",
            "decode tok/s",
            "prefill tok/s",
            "weight MB",
            "disk MB",
            "peak MB",
        ):
            assert column in text, (column, text[:400])
    assert "context 512, stride 256" in out and "Perplexity vs decode speed" in r["html"].read_text()
    junit = r["xml"].read_text()
    assert 'name="max-perplexity-increase"' in junit and "perplexity: sliding window, context 512" in junit
    data = json.loads(r["json"].read_text())
    assert data["schema"] == "ptopt.validate/1" and data["task"] == "causal-lm"
    lm_entry = data["artifacts"][0]["lm"]
    assert {"perplexity", "perplexity_increase_pct", "decode_tokens_per_s", "prefill_tokens_per_s",
            "decode_spread_pct", "weight_bytes"} <= set(lm_entry)  # fmt: skip
    assert data["gate_results"][0]["gate"] == "max-perplexity-increase" and data["passed"]


def test_cli_a_gate_that_cannot_pass_exits_1_naming_it(cli, lm, tmp_path):
    code, out, err = cli("validate", lm["ref"], lm["int8"], "--data", lm["ids"], *FAST, "--min-tokens-per-s", "1e9",
                         "--max-perplexity-increase", "5", "--junit", tmp_path / "r.xml")  # fmt: skip
    assert code == 1, err
    assert "llama.int8: min-tokens-per-s" in err and "(min 1e+09)" in err
    assert "FAILED llama.int8: min-tokens-per-s: decode" in out
    assert "<failure" in (tmp_path / "r.xml").read_text()  # the reports are written before the exit
    with pytest.raises(GateFailedError, match="min-tokens-per-s"):
        ptopt.validate(
            lm["ref"], lm["int8"], lm["ids"], min_tokens_per_s=1e9, raise_on_failure=True, **FAST_API
        )


def test_cli_options_from_the_environment_are_soft_defaults(cli, lm, tmp_path, monkeypatch):
    """PTOPT_VALIDATE_<OPTION>, as a CI runner sets it for every command: applied where it applies
    (--rounds), left out without a word where it does not (--min-seconds times tensor models) and out of
    the recipe; the same option typed on the command line is still refused."""
    monkeypatch.setenv("PTOPT_VALIDATE_MIN_SECONDS", "0.2")
    monkeypatch.setenv("PTOPT_VALIDATE_ROUNDS", "1")
    args = ("validate", lm["ref"], lm["int8"], "--data", lm["ids"], *FAST[2:])
    code, out, err = cli(*args, "--json", tmp_path / "r.json", "--save-recipe", tmp_path / "r.yaml")
    assert code == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["artifacts"][0]["lm"]["rounds"] == 1
    recipe = (tmp_path / "r.yaml").read_text()
    assert "rounds: 1" in recipe and "min_seconds" not in recipe
    assert_refused(
        cli, *args, "--min-seconds", "0.2", match="--min-seconds applies only to a model on tensor data"
    )


def test_subprocess_loads_an_int4_folder(run_ptopt, lm):
    """A fresh process (no quantization ran in it) reads the int4 weights (torchao's tensor is
    registered as safe to load by ptopt, not by the quantize that wrote it)."""
    out = run_ptopt("validate", lm["ref"], lm["int4"], "--data", lm["ids"], *FAST, "-q")
    assert out.returncode == 0, out.stderr
    assert "llama.int4" in out.stdout and "int4" in out.stdout


BAD = [
    ("no-tokenizer", lambda lm: ("bare", "bare", ["--data", lm["text"]]), ("has none", ".pt or .npy")),
    ("lm-with-images", lambda lm: ("ref", "int8", ["--data", "builtin:digits:test"]), ("causal language model", "float")),
    ("images-model-with-text", lambda lm: (CNN, "int8", ["--data", lm["text"]]), ("is text",)),
    ("text-missing", lambda lm: ("ref", "int8", ["--data", lm["root"] / "none.txt"]), ("no such file",)),
    ("text-not-utf8", lambda lm: ("ref", "int8", ["--data", lm["root"] / "latin1.txt"]), ("not UTF-8",)),
    ("ids-outside-vocab", lambda lm: ("ref", "int8", ["--data", lm["wide"]]), ("outside the model's vocabulary of 512",)),
    ("other-vocab", lambda lm: ("ref", "other", ["--data", lm["ids"]]), ("vocabulary of 256", "512")),
    ("negative-budget", lambda lm: ("ref", "int8", ["--data", lm["ids"], "--max-perplexity-increase", "-1"]), (">= 0",)),
    ("cnn-option-with-lm", lambda lm: ("ref", "int8", ["--data", lm["ids"], "--min-speedup", "1.1"]),
     ("--min-speedup applies only to a model on tensor data",)),
    ("lm-option-with-cnn", lambda lm: (CNN, CNN, ["--data", "builtin:digits:test", "--context", "64"]),
     ("--context applies only",)),
    ("non-lm-artifact", lambda lm: ("ref", "eval.pt", ["--data", lm["ids"]]), ("not a causal language model",)),
    ("past-the-positions",
     lambda lm: ("ref", "int8", ["--data", lm["ids"], "--prompt-tokens", "100000", "--new-tokens", "4000"]),
     ("--prompt-tokens 100000 (the data holds", "positions")),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_exits_2_and_writes_nothing(cli, lm, tmp_path, case):
    _, build, match = case
    (lm["root"] / "latin1.txt").write_bytes("w1 w2 caf\xe9 w3".encode("latin-1"))
    ref, art, rest = build(lm)
    ref, art = (lm.get(x, lm["root"] / x if x.endswith(".pt") else x) for x in (ref, art))
    assert_refused(
        cli, "validate", ref, art, *rest, "--json", tmp_path / "r.json", match=match, where=tmp_path
    )


def test_bad_input_api(lm, tmp_path):
    assert_refused(ptopt.validate, lm["ref"], lm["int8"], lm["ids"], max_perplexity_increase=-1, match=">= 0")
    assert_refused(ptopt.validate, lm["ref"], lm["other"], lm["ids"], match="vocabulary of 256")
    assert_refused(ptopt.validate, lm["ref"], lm["int8"], lm["ids"], batch_sizes="1,8", match="--batch-sizes")
    assert_refused(ptopt.validate, lm["bare"], lm["bare"], lm["text"], match="give token ids instead")


def test_a_language_model_best_is_crowned_only_on_a_clear_timing(cli, lm, tmp_path, monkeypatch):
    """Validate's one timing rule on language models too: most decode timings noisy is a busy machine,
    timed once more; a best whose decode lead is within the noise is not crowned (★ was given to the
    fastest median whatever the spread)."""
    import ptopt.core.lm as core_lm

    calls = []

    def noisy(modules, prompt, new_tokens, rounds):
        calls.append(len(modules))
        return [{"decode": [10.0, 30.0, 10.0, 30.0], "prefill": [1.0] * 4} for _ in modules]

    monkeypatch.setattr(core_lm, "interleaved_generation", noisy)
    code, out, err = cli("validate", lm["ref"], lm["int8"], "--data", lm["ids"], "--rounds", "4", "--prompt-tokens",
                         "16", "--new-tokens", "3", "--json", tmp_path / "r.json")  # fmt: skip
    assert code == 0, err
    data = json.loads((tmp_path / "r.json").read_text())
    assert calls == [2, 2] and "the machine is busy: 2 of 2 timings" in err
    assert data["timing_noise"] == {"noisy_cells": 2, "cells": 2, "retimed": 1, "busy": True}
    assert data["best"] == "llama.int8" and data["best_verdict"] == "noisy" and "spread" in data["best_why"]
    assert not data["artifacts"][0]["best"] and "no clear best" in out and "busy machine" in out

    def calm(modules, prompt, new_tokens, rounds):
        return [{"decode": [100.0 * (1 + i)] * 4, "prefill": [1.0] * 4} for i in range(len(modules))]

    monkeypatch.setattr(core_lm, "interleaved_generation", calm)
    res = ptopt.validate(lm["ref"], [lm["int8"]], lm["ids"], **(FAST_API | {"rounds": 4}))
    assert res.best == "llama.int8" and res.data["best_verdict"] == "clear"
    assert res.entry("llama.int8")["best"] and not res.data["timing_noise"]["busy"]


def _classifier(root):
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    folder = root / "classifier"
    if not folder.exists():
        cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, num_labels=3)  # fmt: skip
        tf.BertForSequenceClassification(cfg).save_pretrained(folder)
    return folder


def test_a_classifier_folder_is_refused_before_anything_is_measured(cli, lm, tmp_path, monkeypatch):
    """The docs promise it: a folder that is no causal LM is refused before the reference is scored (it
    was refused only when loaded, after the reference's perplexity: minutes on a real model)."""
    import ptopt.core.lm as core_lm

    def measured(*a, **k):
        raise AssertionError("a perplexity was measured before the refusal")

    monkeypatch.setattr(core_lm, "perplexity", measured)
    folder = _classifier(lm["root"])
    match = ("classifier", "BertForSequenceClassification", "not a causal language model")
    assert_refused(
        cli, "validate", lm["ref"], folder, "--data", lm["ids"], *FAST, match=match, where=tmp_path
    )
    assert_refused(ptopt.validate, lm["ref"], [lm["int8"], folder], lm["ids"], match=match, **FAST_API)


def test_api_an_in_memory_export_result_is_validated_in_its_runtime(lm):
    """``ptopt.export(lm, "onnx")`` unsaved is a MODEL for the next stage: validate scored it (it said
    '<ptopt.formats.onnx_lm.OnnxLM object at 0x...> is not a causal language model')."""
    exported = ptopt.export(f"hf:{lm['ref']}", "onnx", new_tokens=2, progress=False)
    res = ptopt.validate(lm["ref"], [exported], lm["ids"], **FAST_API)
    (entry,) = [e for e in res.entries if e["role"] == "artifact"]
    assert entry["name"] == "onnx_lm fp32 (in memory)" and entry["runtime"] == "onnxruntime"
    assert abs(entry["lm"]["perplexity_increase_pct"]) < 0.01  # the same fp32 model in another runtime
