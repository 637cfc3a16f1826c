"""PT2E int8 without compiling (``--engine pt2e --no-compile``): the int8 ExportedProgram ``.pt2``,
run by validate's ExportedProgram runner and exported from; and PT2E QAT end to end through the CLI.

No AOTInductor compile here: each test quantizes the tiny CNN in a few seconds."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import assert_refused, tiny_cnn

QUANT = ("tests.helpers:tiny_cnn", "--engine", "pt2e", "--no-progress")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """``ptopt quantize ... --mode static --engine pt2e --no-compile -o tiny.int8.pt2`` (via the API's twin)."""
    import ptopt

    out = tmp_path_factory.mktemp("pt2e-program") / "tiny.int8.pt2"
    res = ptopt.quantize(
        "tests.helpers:tiny_cnn", "static", calib_data="builtin:digits:train", eval_data="builtin:digits:test",
        calibration_batches=4, engine="pt2e", compile=False, progress=False, output=out,
    )  # fmt: skip
    return res, out


def test_api_writes_the_int8_exported_program(program):
    from ptopt.core.modelref import load_model

    res, out = program
    assert res.format == "exported_program" and res.precision == "int8"
    assert res.config["engine"] == "pt2e" and res.config["compile"] is False
    assert res.metrics["parity"]["passed"] and res.extra["pt2e"]["compiled"] is False
    loaded = load_model(out)  # no --allow-pickle: a program, not native code
    ops = {str(n.target) for n in loaded.info["exported_program"].graph.nodes if n.op == "call_function"}
    assert any("quantize_per_tensor" in o for o in ops) and any("dequantize_per_channel" in o for o in ops)
    ep = loaded.info["exported_program"]  # the int8 weights only: not their fp32 source beside them
    held = {k: v.dtype for k, v in {**ep.state_dict, **ep.constants}.items() if v.dim() >= 2}
    assert held and set(held.values()) == {torch.int8}, held
    from ptopt.core.data import load_data

    x = load_data("builtin:digits:test").first_batch(16).x  # like the calibration data
    with torch.no_grad():
        got, ref = loaded.module(x), tiny_cnn().eval()(x)
    assert torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0) > 0.98


def test_cli_no_compile_then_validate_and_export(cli, tmp_path):
    out = tmp_path / "m.int8.pt2"
    code, stdout, err = cli(
        "quantize", *QUANT, "--mode", "static", "--no-compile", "--calib-data", "builtin:digits:train",
        "--calibration-batches", "2", "-o", out,
    )  # fmt: skip
    assert code == 0, err
    assert "ExportedProgram int8" in stdout
    assert json.loads((tmp_path / "m.int8.pt2.ptopt.json").read_text())["format"] == "exported_program"
    code, stdout, err = cli(
        "validate", "tests.helpers:tiny_cnn", out, "--data", "builtin:digits:test", "--max-samples", "64",
        "--batch-sizes", "1", "--threads", "1", "--min-iters", "3", "--min-seconds", "0.01", "--rounds", "2",
        "--json", "r.json", "-q",
    )  # fmt: skip
    assert code == 0, err
    row = json.loads((tmp_path / "r.json").read_text())["artifacts"][0]
    assert (
        row["format"] == "exported_program"
        and row["runtime"] == "torch.export"
        and row["precision"] == "int8"
    )
    assert row["agreement"]["top1_agreement"] > 0.9
    code, stdout, err = cli("export", out, "--target", "onnx", "-o", "m.int8.onnx")
    assert code == 0, err
    assert (tmp_path / "m.int8.onnx").exists()


def test_no_compile_is_refused_off_pt2e(cli, tmp_path):
    assert_refused(
        cli, "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--engine", "fx", "--no-compile",
        "--calib-data", "builtin:digits:train", "-o", tmp_path / "m.pt",
        match=("--no-compile", "--engine fx"), where=tmp_path,
    )  # fmt: skip


def test_cli_pt2e_qat_on_labelled_data(cli, tmp_path):
    """``ptopt quantize --mode qat --engine pt2e``: prepare_qat_pt2e, the trainer on labels, convert."""
    out = tmp_path / "qat.int8.pt2"
    code, stdout, err = cli(
        "quantize", *QUANT, "--mode", "qat", "--no-compile", "--train-data", "builtin:digits:train",
        "--eval-data", "builtin:digits:test", "--epochs", "1", "--max-steps", "6", "--lr", "1e-3", "-o", out,
    )  # fmt: skip
    assert code == 0, err
    # 6 of the epoch's 23 steps: said so, not "1 epoch(s)" (a pass over all the samples)
    assert "QAT: 6 optimizer steps of 64 samples (--max-steps, within epoch 1) on 1438 samples" in stdout
    assert "accuracy on builtin:digits:test" in stdout
    side = json.loads((tmp_path / "qat.int8.pt2.ptopt.json").read_text())
    assert side["config"]["mode"] == "qat" and side["config"]["engine"] == "pt2e"
    training = side["extra"]["training"]
    assert training["engine"] == "pt2e" and training["epochs"] == 1 and training["max_steps"] == 6
    assert training["history"][-1]["steps"] == 6  # --max-steps stops the epoch early
    assert side["metrics"]["parity"]["passed"]
