"""``ptopt quantize --mode weight-only --engine openvino`` and its folder (``ptopt.formats.openvino_lm``):
the stateful IR computes what the torch model computes (perplexity, greedy tokens with the cache, a
second sequence after the first), NNCF's int8 / int4 weights shrink it, the folder loads back through
``ptopt.load_model`` and plain OpenVINO, ``validate`` runs it in OpenVINO, ``optimize`` has it as a
candidate; bad input gets one line and exit 2 (small seeded Llama from a config: mechanics, not quality)."""

from __future__ import annotations

import json

import pytest
import torch

import ptopt
from ptopt.core.errors import UsageError
from tests.compress.hf_models import llama
from tests.helpers import assert_refused

pytest.importorskip("openvino")
pytest.importorskip("nncf")

VOCAB = 300


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    root = tmp_path_factory.mktemp("ovlm")
    model = llama(VOCAB, hidden=64).eval()
    model.save_pretrained(root / "llama")
    g = torch.Generator().manual_seed(5)
    torch.save(torch.randint(0, VOCAB, (400,), generator=g), root / "eval.pt")
    return root, model


@pytest.fixture(scope="module")
def int8(lm):
    """The int8 quantization of the API (in memory, measured on the eval ids), shared by the tests."""
    root, _ = lm
    return ptopt.quantize(f"hf:{root / 'llama'}", "weight-only", None, bits=8, engine="openvino",
                          eval_data=root / "eval.pt", progress=False)  # fmt: skip


def _greedy(module, prompt, new):
    from ptopt.core.lm import cache_keyword

    key, tokens = cache_keyword(module), []
    with torch.inference_mode():
        out = module(input_ids=prompt, use_cache=True)
        for _ in range(new):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(int(nxt))
            out = module(input_ids=nxt, use_cache=True, **{key: out[key]})
    return tokens


def test_the_stateful_ir_computes_what_the_model_computes(lm):
    from ptopt.core.lm import generation_speed, perplexity
    from ptopt.formats.openvino_lm import OpenVINOLM, convert

    _, model = lm
    ids = torch.load(lm[0] / "eval.pt")[:200]
    ov_model = convert(model)
    assert [p.get_any_name() for p in ov_model.inputs] == [
        "input_ids",
        "attention_mask",
    ]  # the cache is state
    runner = OpenVINOLM(ov_model, model.config, threads=1, precision="f32")
    got, want = perplexity(runner, ids, context=64, stride=32), perplexity(model, ids, context=64, stride=32)
    assert got["tokens"] == want["tokens"]
    assert got["perplexity"] == pytest.approx(want["perplexity"], rel=1e-4)
    for start in (0, 20):  # a second sequence starts from an empty cache
        prompt = ids[start : start + 12].reshape(1, -1)
        assert _greedy(runner, prompt, 8) == _greedy(model, prompt, 8)
    with pytest.raises(ValueError, match="one sequence at a time"):
        runner(input_ids=ids[:1].reshape(1, 1), use_cache=True, past_key_values=3)
    assert generation_speed(runner, ids[:12], 4)["decode_tokens_per_s"] > 0
    assert runner.precision == "f32"


@pytest.mark.parametrize("bits", [8, 4])
def test_api_quantize_writes_a_folder_that_loads_back(lm, int8, tmp_path, bits):
    import openvino as ov

    from ptopt.core.lm import perplexity, weight_bytes
    from ptopt.core.modelref import load_model

    root, model = lm
    res = int8 if bits == 8 else ptopt.quantize(
        f"hf:{root / 'llama'}", "weight-only", None, bits=4, engine="openvino", group_size=32,
        eval_data=root / "eval.pt", progress=False,
    )  # fmt: skip
    m = res.metrics
    assert m["weight_bytes"] < (0.3 if bits == 8 else 0.35) * m["fp32_weight_bytes"]
    assert abs(m["perplexity_increase_pct"]) < (1 if bits == 8 else 5)
    res.save(tmp_path / "q")
    names = sorted(p.name for p in (tmp_path / "q").iterdir())
    assert names == ["config.json", "openvino_lm.json", "openvino_model.bin", "openvino_model.xml"]
    art = json.loads((tmp_path / "q.ptopt.json").read_text())
    assert art["format"] == "openvino_lm" and art["precision"] == f"int{bits}"
    record = art["extra"]["weight_only"]
    assert (
        record["nncf_mode"] == ("int8_asym" if bits == 8 else "int4_sym") and record["engine"] == "openvino"
    )
    loaded = load_model(tmp_path / "q")
    assert loaded.format == "openvino_lm" and weight_bytes(loaded.module) == m["weight_bytes"]
    ids = torch.load(root / "eval.pt")
    assert perplexity(loaded.module, ids)["perplexity"] == pytest.approx(m["perplexity"], rel=1e-3)
    assert ov.Core().read_model(tmp_path / "q" / "openvino_model.xml").inputs  # plain OpenVINO reads it


@pytest.mark.parametrize("cap", ["AVX2", "AVX512_CORE"])
def test_the_int8_folder_runs_in_a_process_capped_below_vnni(lm, int8, tmp_path, cap):
    """A process capped below VNNI (as a CPU without it: ``ONEDNN_MAX_CPU_ISA``) runs the int8 folder with
    the plugin's plain weight decompression: the plugin picks the dynamic int8 quantization of activations
    from the CPU itself and, under the cap, then found no kernel for it ("could not create a primitive
    descriptor"). Its perplexity is the uncapped one's."""
    import os
    import subprocess
    import sys

    from ptopt.core.lm import perplexity

    root, _ = lm
    int8.save(tmp_path / "q")
    code = (
        "import sys, torch\n"
        "from ptopt.core.lm import perplexity\n"
        "from ptopt.core.modelref import load_model\n"
        "m = load_model(sys.argv[1]).module\n"
        "print(m.compiled.get_property('DYNAMIC_QUANTIZATION_GROUP_SIZE'), m.precision)\n"
        "print(perplexity(m, torch.load(sys.argv[2]))['perplexity'])\n"
    )
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=cap)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "q"), str(root / "eval.pt")],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    props, ppl = done.stdout.split("\n")[:2]
    assert props.split() == ["0", "f32"]  # no dynamic quantization, f32: what a CPU at the cap gets
    here = perplexity(int8.model, torch.load(root / "eval.pt"))["perplexity"]
    assert float(ppl) == pytest.approx(here, rel=0.02)


def test_exclude_keeps_the_named_layer_float(lm, int8):
    from ptopt.formats.openvino_lm import compressed_matrices

    root, _ = lm
    name = "model.layers.0.mlp.down_proj"
    res = ptopt.quantize(f"hf:{root / 'llama'}", "weight-only", None, bits=8, engine="openvino",
                         exclude=(name,), progress=False)  # fmt: skip
    every = int8
    assert res.extra["weight_only"]["float_layers"] == {name: "--exclude"}
    counts = res.extra["weight_only"]["compressed_matrices"]
    assert sum(counts.values()) == sum(every.extra["weight_only"]["compressed_matrices"].values()) - 1
    assert counts == compressed_matrices(res.model.ov_model)
    extra = 128 * 64 * 4 - 128 * 64  # the matrix in fp32 instead of int8 (its scales aside)
    assert res.model.weight_bytes - every.model.weight_bytes == pytest.approx(extra, rel=0.1)


def test_cli_quantize_then_validate_in_openvino(cli, lm, tmp_path):
    root, _ = lm
    out = tmp_path / "llama.int8-ov"
    code, stdout, err = cli("quantize", f"hf:{root / 'llama'}", "--mode", "weight-only", "--bits", "8",
                            "--engine", "openvino", "--eval-data", root / "eval.pt", "-o", out)  # fmt: skip
    assert code == 0, err
    assert "NNCF int8_asym, OpenVINO with" in stdout and "weight matrices stored as" in stdout
    assert "perplexity on" in stdout and (out / "openvino_model.xml").is_file()
    code, stdout, err = cli("validate", f"hf:{root / 'llama'}", out, "--data", root / "eval.pt", "--rounds", "1",
                            "--prompt-tokens", "16", "--new-tokens", "4", "--json", tmp_path / "r.json")  # fmt: skip
    assert code == 0, err
    rows = json.loads((tmp_path / "r.json").read_text())["artifacts"]
    mine = next(r for r in rows if r["format"] == "openvino_lm")
    assert mine["runtime"] == "openvino" and mine["precision"] == "int8"
    assert mine["lm"]["decode_tokens_per_s"] > 0 and mine["lm"]["perplexity"] > 0


def test_bad_input_gets_one_line_and_nothing_written(cli, lm, tmp_path):
    root, _ = lm
    base = ("quantize", f"hf:{root / 'llama'}", "--mode", "weight-only", "--engine", "openvino")
    cases = (
        (("--bits", "4", "--method", "gptq"), "--method rtn"),
        (("--bits", "8", "--group-size", "64"), "drop --group-size"),
        (("--bits", "8", "--decode-step", "32"), "--engine torchao"),
        (("--bits", "8", "--exclude", "no.such.layer"), "no such module"),
    )
    for extra, match in cases:
        assert_refused(cli, *base, *extra, "-o", tmp_path / "x", match=match, where=tmp_path)
    assert_refused(cli, "quantize", "zoo:resnet", "--mode", "weight-only", "--engine", "openvino", "-o",
                   tmp_path / "y", match="causal language model", where=tmp_path)  # fmt: skip
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((root / "llama" / "config.json").read_text())
    (broken / "openvino_lm.json").write_text('{"bits": 8}')
    (broken / "openvino_model.xml").write_text("<net>not an IR</net>")
    assert_refused(cli, "validate", f"hf:{root / 'llama'}", broken, "--data", root / "eval.pt",
                   match="not a readable OpenVINO IR", where=tmp_path)  # fmt: skip
    with pytest.raises(UsageError, match="--method rtn"):
        ptopt.quantize(root / "llama", "weight-only", None, bits=8, method="awq", engine="openvino")


def test_optimize_has_the_openvino_candidates(lm, tmp_path):
    root, _ = lm
    res = ptopt.optimize(
        root / "llama", eval_data=root / "eval.pt", max_perplexity_increase=5,
        candidates="int8-wo-openvino", rounds=1, output=tmp_path / "out", progress=False,
    )  # fmt: skip
    rows = {r["name"]: r for r in res.report["candidates"]}
    assert list(rows) == ["fp32", "int8-wo-openvino"]
    ov = rows["int8-wo-openvino"]
    assert ov["status"] == "kept" and ov["decode_tokens_per_s"] > 0 and ov["perplexity_unseen"] > 0
    assert ov["weight_bytes"] < 0.3 * rows["fp32"]["weight_bytes"]
    if res.report["winner"] == "int8-wo-openvino":
        assert (tmp_path / "out" / "best" / "openvino_model.xml").is_file()
