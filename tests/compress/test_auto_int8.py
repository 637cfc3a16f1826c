"""``--mode static --engine auto`` (``compress/quantize/auto_int8.py``): the engines in
order, the whole model first, then the most sensitive layers kept float until the int8 rule holds; one
refusal naming what each engine reached when nothing holds. Real quantization of tiny models: a
"massive activation" MLP (``quant_models.OutlierMLP``) whose whole-model int8 breaks on every engine."""

from __future__ import annotations

import json

import torch

import ptopt
from tests.compress.quant_models import outlier_data, outlier_mlp
from tests.helpers import assert_refused

MODEL = "tests.compress.quant_models:outlier_mlp"
DATA = "tests.compress.quant_models:outlier_calib"
#: what the outlier block needs float in graph mode: the layer that writes the massive channel, and the
#: one that reads it
NEEDED = {"block.0", "block.2"}


def _heldout() -> torch.Tensor:
    return torch.randn(64, 16, generator=torch.Generator().manual_seed(5))


def test_auto_keeps_the_most_sensitive_layers_float_until_int8_holds():
    res = ptopt.quantize(
        outlier_mlp(),
        "static",
        calib_data=outlier_data(),
        eval_data=_heldout(),
        engine="auto",
        progress=False,
    )
    assert res.format == "torchscript" and res.config["engine"] == "fx"
    kept = {n: why for n, why in res.extra["float_layers"].items() if "kept float by --engine auto" in why}
    assert set(kept) == NEEDED, res.extra["float_layers"]
    assert all("by int8 sensitivity" in why and "the int8 rule holds" in why for why in kept.values())
    fid = res.metrics["vs_fp32"]
    assert fid["passed"] and fid["data"] == "in-memory evaluation data" and fid["min_cosine"] >= 0.99
    rec = res.extra["auto_int8"]
    assert (
        rec["float_modules"] == ["block.0", "block.2"] and rec["accepted_on"] == "in-memory evaluation data"
    )
    fx, pt2e = rec["engines"]
    assert (fx["engine"], fx["holds"]) == ("fx", True) and fx["trials"][0].startswith("0 float")
    assert (
        pt2e["engine"] == "pt2e" and not pt2e["holds"]
    )  # its whole model missed too; fx's search held first
    assert "with 2 module(s) kept float" in res.extra["engine_choice"]["why"]
    assert res.extra["int8_share"]["parameters"] > 0.1


def test_cli_auto_names_what_stayed_float_and_why(cli, tmp_path):
    out = tmp_path / "o.int8.pt"
    code, stdout, err = cli(
        "quantize", MODEL, "--mode", "static", "--engine", "auto", "--calib-data", DATA, "-o", out
    )
    assert code == 0, err
    assert "engine: fx (" in stdout and "kept float by --engine auto" in stdout
    assert "whole model int8: 0 float: min cosine" in err  # the search's progress, on stderr
    side = json.loads(out.with_name(out.name + ".ptopt.json").read_text())
    assert side["format"] == "torchscript" and side["metrics"]["vs_fp32"]["passed"]
    assert set(side["extra"]["auto_int8"]["float_modules"]) == NEEDED
    assert side["extra"]["auto_int8"]["accepted_on"] is None  # no --eval-data: judged on the calibration data


def test_nothing_holds_is_one_refusal_naming_what_each_engine_reached(cli, tmp_path):
    msg = assert_refused(
        cli, "quantize", "tests.compress.quant_models:gated_one_layer", "--mode", "static", "--engine", "auto",
        "--calib-data", "tests.compress.quant_models:features16", "-o", tmp_path / "g.pt", "--no-progress",
        match=("holds the int8 rule on no engine", "fx: no set of float layers", "torch.export cannot trace"),
        where=tmp_path,
    )  # fmt: skip
    assert "best: 0 float: min cosine" in msg and "--min-cosine" in msg
