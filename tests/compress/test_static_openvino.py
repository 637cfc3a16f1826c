"""``--mode static --engine openvino`` (``techniques/static_openvino.py``: NNCF int8 of the OpenVINO IR, an
``.xml`` artifact) and ``--engine auto`` going on to it (``auto_int8``): after the torch engines, or alone
when the output is named ``.xml``. Real NNCF int8 of tiny models."""

from __future__ import annotations

import json

import pytest
import torch

import ptopt
from tests.helpers import assert_refused, tiny_cnn

pytest.importorskip("nncf")

DATA = "builtin:digits:train"


def _calib() -> torch.Tensor:
    return torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(1))


def test_engine_openvino_writes_an_int8_ir_with_its_float_layers_named(tmp_path):
    out = tmp_path / "m.int8.xml"
    res = ptopt.quantize(
        tiny_cnn(), "static", calib_data=_calib(), engine="openvino", output=out, progress=False
    )
    assert res.format == "openvino" and res.config["engine"] == "openvino"
    assert out.exists() and out.with_suffix(".bin").exists()
    assert res.metrics["vs_fp32"]["passed"]
    floats = res.extra["float_layers"]
    assert {"conv1", "conv2", "fc"}.isdisjoint(floats), floats  # NNCF made every Conv / Linear int8
    assert all("not a Linear / Conv" in why for why in floats.values())
    # what the flow measured is what the file computes: the IR loaded back by validate's runner
    from ptopt.validate.runners import open_runner

    runner = open_runner(str(out), "int8")
    runner.prepare(1)
    x = _calib()[:8]
    assert torch.allclose(runner.predict(x), res.model(x), atol=1e-5)


def test_cli_auto_with_an_xml_output_writes_openvino_int8(cli, tmp_path):
    out = tmp_path / "m.xml"
    code, stdout, err = cli(
        "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--calib-data", DATA, "-o", out,
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    side = json.loads(out.with_name(out.name + ".ptopt.json").read_text())
    assert side["format"] == "openvino" and side["config"]["engine"] == "openvino"
    assert [e["engine"] for e in side["extra"]["auto_int8"]["engines"]] == ["openvino"]  # asked for by .xml
    assert side["extra"]["engine_choice"]["chosen"] == "openvino"
    assert side["metrics"]["vs_fp32"]["passed"]


def test_auto_goes_on_to_openvino_after_the_torch_engines(cli, tmp_path):
    """A model no torch engine quantizes within the rule: the refusal names what openvino reached too
    (its IR conversion is torch.export's, which this model defeats)."""
    assert_refused(
        cli, "quantize", "tests.compress.quant_models:gated_one_layer", "--mode", "static",
        "--calib-data", "tests.compress.quant_models:features16", "-o", tmp_path / "g.pt", "--no-progress",
        match=("holds the int8 rule on no engine", "fx: no set", "torch.export (for the OpenVINO IR) cannot"),
        where=tmp_path,
    )  # fmt: skip


def test_exclude_keeps_layers_float_and_a_torch_output_names_the_xml_auto_writes(tmp_path):
    """``--exclude fc``: its op an ``nncf.IgnoredScope``; ``-o NAME.pt`` when openvino's IR is the one that
    held: written as NAME.xml (and said)."""
    from ptopt.compress.quantize.flow import winner_output

    res = ptopt.quantize(
        tiny_cnn(), "static", calib_data=_calib(), engine="openvino", exclude=["fc"], progress=False
    )
    assert "--exclude" in res.extra["float_layers"]["fc"] and "conv1" not in res.extra["float_layers"]
    assert 0.1 < res.extra["int8_share"]["parameters"] < 0.5  # fc holds most of tiny_cnn's weights
    assert winner_output(res, "auto", tmp_path / "m.int8.pt") == tmp_path / "m.int8.xml"
    assert winner_output(res, "openvino", tmp_path / "m.int8.xml") == tmp_path / "m.int8.xml"


@pytest.mark.parametrize(
    "args, match",
    [
        (["--engine", "openvino", "-o", "m.pt"], ("--engine openvino writes a .xml file", "-o NAME.xml")),
        (["--engine", "openvino", "--no-compile", "-o", "m.xml"], ("--no-compile",)),
        (["--engine", "openvino", "--per-tensor", "-o", "m.xml"], ("per-channel", "drop --per-tensor")),
        (
            ["--engine", "fx", "-o", "m.xml"],
            ("quantize writes", "OpenVINO IR (.xml: --engine openvino or auto)"),
        ),
        (["-o", "m.onnx"], ("ptopt export MODEL --target onnx --precision int8",)),
        (
            ["--engine", "openvino", "--min-cosine", "0.99", "--eval-data", DATA, "-o", "m.xml"],
            ("searches on --engine fx or pt2e", "--accuracy-control"),
        ),
    ],
)
def test_bad_openvino_requests_are_one_line_refusals(cli, tmp_path, args, match):
    assert_refused(
        cli, "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--calib-data", DATA, *args,
        match=match, where=tmp_path,
    )  # fmt: skip
