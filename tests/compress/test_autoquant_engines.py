"""Accuracy-aware quantization on the pt2e engine (layers left float through X86InductorQuantizer's
module-name config, candidates timed compiled by Inductor) and with ``--engine auto`` (both searched,
the faster answer within the goal kept). Tiny CNN, one or two candidates per engine."""

from __future__ import annotations

import json

DATA = dict(calib_data="builtin:digits:train", eval_data="builtin:digits:test")


def test_api_pt2e_search_leaves_layers_float_by_module_name(tmp_path):
    from ptopt.compress.quantize.autoquant import autoquantize
    from ptopt.core.modelref import load_model

    out = tmp_path / "m.int8.pt2"
    found = autoquantize(
        "tests.helpers:tiny_cnn", "static", out, accuracy_budget=5.0, tuning_budget=1, engine="pt2e",
        compile=False, calibration_batches=2, exclude=("fc",), progress=False, **DATA,
    )  # fmt: skip
    assert {r["layer"] for r in found.sensitivity} == {"conv1", "conv2"}  # fc: excluded by the user
    assert found.candidates and all(c.latency_ms > 0 for c in found.candidates)
    art = found.artifact
    assert art.format == "exported_program" and art.config["engine"] == "pt2e"
    assert found.met and found.best.float_layers == ()
    floats = {"fc"}
    assert set(art.config["float_modules"]) == floats
    # in the written graph a float layer's weight comes straight in; an int8 one's is dequantized
    ep = load_model(out).info["exported_program"]
    int8_weight = {}
    for n in ep.graph.nodes:
        if n.op == "call_function" and str(n.target) in ("aten.conv2d.default", "aten.linear.default"):
            module = list(n.meta["nn_module_stack"].values())[-1][0].split(".")[-1]
            int8_weight[module] = "dequantize" in str(getattr(n.args[1], "target", ""))
    assert int8_weight.keys() == {"conv1", "conv2", "fc"}
    assert {m for m, q in int8_weight.items() if not q} == floats, int8_weight


def test_cli_auto_compares_both_engines(cli, tmp_path):
    out = tmp_path / "m.int8.pt"
    code, stdout, err = cli(
        "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--engine", "auto",
        "--calib-data", DATA["calib_data"], "--eval-data", DATA["eval_data"], "--calibration-batches", "2",
        "--accuracy-budget", "5", "--tuning-budget", "1", "--no-progress", "-o", out,
    )  # fmt: skip
    assert code in (0, 1), err
    assert "engine: " in stdout and "search p50 ms" in stdout
    # the engine that won names the file: fx's TorchScript stays m.int8.pt, PT2E's package is m.int8.pt2
    (written,) = [p for p in tmp_path.iterdir() if p.name in ("m.int8.pt", "m.int8.pt2")]
    assert f"wrote {written}" in stdout
    side = json.loads(written.with_name(written.name + ".ptopt.json").read_text())
    choice = side["extra"]["engine_choice"]
    assert set(choice["search_latency_ms"]) == {"fx", "pt2e"} and choice["chosen"] in ("fx", "pt2e")
    assert written.suffix == (".pt2" if choice["chosen"] == "pt2e" else ".pt")
    assert side["format"] == ("aoti_package" if choice["chosen"] == "pt2e" else "torchscript")
    assert side["config"]["engine"] == choice["chosen"]


def test_auto_output_named_for_the_engine_that_lost_takes_the_winners_suffix(tmp_path):
    """Deterministic: fx cannot trace ``rank_branch``, so PT2E wins; ``-o x.pt`` becomes ``x.pt2``."""
    from ptopt.compress.quantize import quantize

    res = quantize(
        "tests.compress.quant_models:rank_branch", "static", tmp_path / "m.int8.pt", engine="auto",
        calib_data="tests.compress.quant_models:features16", compile=False, progress=False,
    )  # fmt: skip
    assert res.artifact.path == tmp_path / "m.int8.pt2"
    assert res.artifact.format == "exported_program" and not (tmp_path / "m.int8.pt").exists()


def test_analyze_on_the_default_engine_ranks_fx_layers(cli, tmp_path):
    """static's default engine is auto; --analyze ranks one engine's layers: auto's first, fx."""
    code, out, err = cli(
        "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--analyze", "--no-progress",
        "--calib-data", DATA["calib_data"], "--eval-data", DATA["eval_data"],
    )  # fmt: skip
    assert code == 0, err
    assert "Layer sensitivity" in out and "conv1" in out and list(tmp_path.iterdir()) == []
