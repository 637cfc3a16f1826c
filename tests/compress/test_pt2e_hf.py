"""Static int8 of Hugging Face encoders through the PT2E engine (issue 18): torch.fx cannot trace HF
BERT, torch.export can. A tiny random-weight BertForSequenceClassification (2 layers, hidden 128,
4 heads, vocab 1000, 32 tokens) calibrated on padded batches (``attention_mask`` with zeros):
its encoder's Linear layers int8, the package takes any batch and sequence length up to the
model's 64 positions, and it keeps a worst-sample cosine >= 0.95 on masked batches it never saw.

Two BERT packages are compiled (the Python API and the CLI, ~1-3 min each on 2 loaded cores) and
one tiny MLP's (auto's fallback); the rest runs without compiling."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_refused

pytest.importorskip("transformers")
pytest.importorskip("torchao")

MODEL = "tests.compress.hf_models:bert"
DATA = "tests.compress.hf_models:bert_tokens"
#: the task head: random weights give it tiny logits whose int8 noise breaks the 0.99 rule
HEAD = ("bert.pooler.dense", "classifier")


def _masked_batches():
    """Padded batches the model was not calibrated on, at several batch sizes and lengths."""
    from tests.compress.hf_models import bert_tokens

    return [bert_tokens(n, seq, seed=7 + n)["x"] for n, seq in ((1, 32), (5, 17), (8, 64), (3, 9))]


def _worst_cosine(fp32, int8) -> float:
    worst = 1.0
    with torch.no_grad():
        for x in _masked_batches():
            assert (x["attention_mask"] == 0).any() or x["input_ids"].shape[0] == 1
            ref, got = fp32(**x).logits, int8(**x)
            got = got["logits"] if isinstance(got, dict) else getattr(got, "logits", got)
            worst = min(worst, float(F.cosine_similarity(ref, got, dim=-1).min()))
    return worst


def test_token_inputs_get_a_dynamic_sequence_up_to_the_position_limit():
    from ptopt.compress.quantize.pt2e import token_sequence_specs
    from ptopt.core.inputspec import specs_from_example
    from tests.compress.hf_models import bert, bert_tokens

    model = bert()
    specs = token_sequence_specs(model, specs_from_example(bert_tokens(4)["x"]), "keyword")
    assert [(s.name, s.min_shape, s.max_shape) for s in specs] == [
        ("input_ids", (1, 1), (64, 64)),
        ("attention_mask", (1, 1), (64, 64)),
    ]
    images = specs_from_example(torch.rand(2, 3, 8, 8))
    assert token_sequence_specs(model, images, "positional") == images  # not token inputs: as given


@pytest.fixture(scope="module")
def api_result(tmp_path_factory):
    import ptopt
    from tests.compress.hf_models import bert, bert_tokens

    out = tmp_path_factory.mktemp("bert") / "bert.int8.pt2"
    res = ptopt.quantize(
        bert(),
        "static",
        out,
        calib_data=bert_tokens()["x"],
        engine="pt2e",
        exclude=list(HEAD),
        progress=False,
    )
    return res, out


def test_api_bert_static_int8_with_masks(api_result):
    from tests.compress.hf_models import bert

    res, out = api_result
    assert out.is_file() and res.format == "aoti_package" and res.precision == "int8"
    assert res.metrics["vs_fp32"]["passed"] and res.metrics["min_cosine"] >= 0.99  # the int8 rule, as is
    assert _worst_cosine(bert(), res.model) >= 0.95
    floats = res.extra["float_layers"]
    assert "bert.embeddings.word_embeddings" in floats and "bert.encoder.layer.0.output.LayerNorm" in floats
    assert not any(n.startswith("bert.encoder") and "dense" in n for n in floats)  # the encoder's Linears
    assert res.extra["int8_share"]["layers"] == 12
    assert [s.max_shape for s in res.inputs] == [(64, 64), (64, 64)]  # batch and sequence dynamic
    assert res.extra["pt2e"]["batches_probed"][0] == 1


def test_package_loads_and_runs_without_transformers(api_result):
    """The package returns a plain dict (not transformers' ModelOutput), so it loads where
    transformers is not imported, at a batch and length it was not calibrated on."""
    import subprocess
    import sys

    _, out = api_result
    code = (
        "import sys, torch; from ptopt.formats.aoti import load_aoti; m = load_aoti(sys.argv[1]); "
        "ids = torch.randint(1, 1000, (3, 40)); mask = torch.ones(3, 40, dtype=torch.long); mask[1, 30:] = 0; "
        "y = m(input_ids=ids, attention_mask=mask); assert 'transformers' not in sys.modules; "
        "print(type(y).__name__, sorted(y), tuple(y['logits'].shape))"
    )
    run = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "dict ['logits'] (3, 3)"


def test_cli_fx_refusal_names_pt2e_and_its_suggestion_runs(cli, tmp_path):
    from ptopt.core.modelref import load_model
    from tests.compress.hf_models import bert

    args = ("quantize", MODEL, "--mode", "static", "--calib-data", DATA, "--no-progress")
    msg = assert_refused(
        cli, *args, "--engine", "fx", "-o", tmp_path / "bert.int8.pt", where=tmp_path, match="cannot trace"
    )
    assert "add --engine pt2e" in msg
    out = tmp_path / "bert.int8.pt2"
    excludes = [a for n in HEAD for a in ("--exclude", n)]
    # --no-compile: the compiled package of this BERT is api_result's (compiling it twice costs ~15 s)
    code, stdout, err = cli(*args, "--engine", "pt2e", *excludes, "--no-compile", "-o", out)
    assert code == 0, err
    assert "ExportedProgram int8" in stdout and "int8: 12 of" in stdout
    side = json.loads(out.with_name(out.name + ".ptopt.json").read_text())
    assert side["metrics"]["vs_fp32"]["passed"]
    assert _worst_cosine(bert(), load_model(out, allow_pickle=True).module) >= 0.95


def _holds(prep, config, floats) -> bool:
    """Whether the converted int8 graph with ``floats`` kept float meets the int8 rule against fp32
    on the data the advice judges on (eagerly, as the advice does)."""
    from ptopt.compress.fidelity import INT8_VS_FP32, fidelity_data, measure_fidelity
    from ptopt.compress.quantize import engine_pt2e, pt2e

    module, _ = pt2e.linearized(prep.module, ())
    candidate = config.replace(float_modules=tuple(floats))
    batches = pt2e.calibration_batches(candidate, prep.calib)
    converted = engine_pt2e.quantize_static(module, pt2e.specs_of(prep), prep.style, candidate, batches)
    data = fidelity_data(prep.evald, prep.calib, prep.train, example=prep.example)
    return measure_fidelity(prep.module, converted, data, **INT8_VS_FP32)["passed"]


@pytest.mark.parametrize("seven_bit", [False, True], ids=["8-bit-activations", "7-bit-activations"])
def test_pt2e_advice_keeps_the_head_float(monkeypatch, seven_bit):
    """A whole-int8 BERT breaks the 0.99 rule on random weights: the refusal names the fewest layers
    nearest the output (the task head) that, kept float, make it hold (judged on the q/dq graph,
    without compiling), and doing what it says holds.

    How many depends on the CPU: X86InductorQuantizer uses 7-bit activations where the CPU has no
    VNNI (``engine_pt2e.reduce_range``), and there ``bert.pooler.dense`` must stay float with
    ``classifier``; with 8 bits (AVX512-VNNI) ``classifier`` alone holds. Both quantizers run here."""
    import re

    from ptopt.compress.quantize import engine_pt2e
    from ptopt.compress.quantize.flow import prepare
    from ptopt.compress.quantize.pt2e import advise
    from ptopt.compress.quantize.resolve import resolve_config
    from tests.compress.hf_models import bert, bert_tokens

    monkeypatch.setattr(engine_pt2e, "reduce_range", lambda: seven_bit)
    config, _ = resolve_config("static", None, {"engine": "pt2e"})
    prep = prepare(config, bert(), None, False, (), bert_tokens()["x"])
    advice = advise(config, prep)
    floats = re.findall(r"--exclude (\S+)", advice)
    assert floats and tuple(floats) == HEAD[-len(floats) :], advice  # the head, nearest the output first
    assert f"float_modules={tuple(floats)!r}" in advice
    assert _holds(prep, config, floats), advice  # what it says holds
    if len(floats) > 1:  # and one layer fewer does not (advice is asked for after a failure: k >= 1)
        assert not _holds(prep, config, floats[1:]), advice


def test_fx_refusal_without_pt2e_when_export_cannot_capture(cli, tmp_path):
    msg = assert_refused(
        cli, "quantize", "tests.compress.quant_models:untraceable", "--mode", "static", "--engine", "fx",
        "--calib-data", "builtin:digits:train", "-o", tmp_path / "m.pt", where=tmp_path, match="cannot trace",
    )  # fmt: skip
    assert "--engine pt2e" not in msg


def test_auto_falls_back_to_pt2e_when_fx_cannot_trace(cli, tmp_path):
    out = tmp_path / "m.int8.pt2"
    code, stdout, err = cli(
        "quantize", "tests.compress.quant_models:rank_branch", "--mode", "static", "--engine", "auto",
        "--calib-data", "tests.compress.quant_models:features16", "--no-progress", "--no-compile", "-o", out,
    )  # fmt: skip
    # --no-compile: the engine's choice is what is checked (the package's compile: api_result above, 5 g++
    # builds fewer here)
    assert code == 0, err
    assert "engine: pt2e (torch.fx cannot trace the model" in stdout
    assert "the whole-model int8 holds the int8 rule)" in stdout
    side = json.loads(out.with_name(out.name + ".ptopt.json").read_text())
    assert side["format"] == "exported_program" and side["extra"]["engine_choice"]["chosen"] == "pt2e"


@pytest.mark.parametrize(
    "args, match",
    [
        (["--engine", "pt2e", "--exclude", "bert.nope"], "--exclude bert.nope"),
        (["--engine", "pt2e", "--per-tensor"], ("per-channel", "--engine fx")),
    ],
    ids=["bad-exclude", "per-tensor"],
)
def test_cli_bert_pt2e_bad_input(cli, tmp_path, args, match):
    assert_refused(
        cli, "quantize", MODEL, "--mode", "static", "--calib-data", DATA, *args, "-o", tmp_path / "b.pt2",
        where=tmp_path, match=match,
    )  # fmt: skip
