"""Static int8 (graph mode): CLI and Python twin on tiny models."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from ptopt.core.artifact import Artifact, sidecar_path

TINY = "tests.helpers:tiny_cnn"
CALIB = "builtin:digits:train"
EVAL = "builtin:digits:test"


def _jit_load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))


def test_static_cli_writes_int8_torchscript(cli, tmp_path: Path) -> None:
    out = tmp_path / "tiny.int8.pt"
    recipe = tmp_path / "recipe.yaml"
    code, stdout, stderr = cli(
        "quantize",
        TINY,
        "--mode",
        "static",
        "--calib-data",
        CALIB,
        "--eval-data",
        EVAL,
        "--calibration-batches",
        "4",
        "--no-progress",
        "-o",
        out,
        "--save-recipe",
        recipe,
    )
    assert code == 0, stderr
    assert "TorchScript int8" in stdout and "accuracy on builtin:digits:test" in stdout
    # 4 batches of 32: fewer than FEW_CALIBRATION_SAMPLES, said once on stderr
    assert stderr.count("int8 activation ranges fitted on 128 calibration samples") == 1, stderr
    art = Artifact.load(out)
    assert art.format == "torchscript" and art.precision == "int8"
    assert art.config["type"] == "quantize-static" and art.config["mode"] == "static"
    assert art.config["calib_data"] == CALIB and art.config["backend"] == "x86"
    assert art.config["observer"] == "histogram" and art.config["per_channel"] is True
    assert art.extra["calibration"]["batches"] == 4 and art.extra["calibration"]["samples"] == 128
    assert art.extra["float_layers"] == {}
    assert art.parent["path"] == TINY
    ort = art.extra["onnx_quantization"]
    assert (
        ort["calib_data"] == CALIB
        and ort["method"] == "quantize_static"
        and ort["calibrate_method"] == "Entropy"
    )
    assert {"fp32_accuracy", "int8_accuracy", "accuracy_drop_points"} <= set(art.metrics)
    assert art.size_bytes < art.metrics["fp32_torchscript_bytes"]
    # deploys without ptopt: plain torch.jit.load, int8 kernels, any batch size
    m = _jit_load(out)
    assert "quantized::conv2d" in str(m.graph) or "quantized::conv2d" in str(m.inlined_graph)
    assert m(torch.rand(5, 1, 8, 8)).shape == (5, 10)
    assert "quantize:" in recipe.read_text() and CALIB in recipe.read_text()


@pytest.mark.parametrize("samples,warned", [(255, True), (256, False)])
def test_few_calibration_samples_are_warned_about(capsys, samples: int, warned: bool) -> None:
    from types import SimpleNamespace

    from ptopt.cli.quantize import _warn_few_samples

    cal = {"batches": 8, "samples": samples, "data": CALIB, "observer": "histogram", "per_channel": True}
    _warn_few_samples(SimpleNamespace(extra={"calibration": cal}))
    err = capsys.readouterr().err
    assert (f"fitted on {samples} calibration samples" in err) is warned, err


@pytest.mark.parametrize(
    "observer,per_channel",
    [("minmax", True), ("percentile", False), ("entropy", True)],
    ids=["minmax-per-channel", "percentile-per-tensor", "entropy"],
)
def test_static_python_api_observers(tmp_path: Path, observer: str, per_channel: bool) -> None:
    from ptopt.compress.quantize import quantize
    from ptopt.core.data import load_data
    from tests.helpers import tiny_cnn

    calib = load_data(CALIB).take(64)
    art = quantize(
        tiny_cnn(),
        "static",
        tmp_path / "q.pt",
        calib_data=calib,
        observer=observer,
        per_channel=per_channel,
        calibration_batches=2,
        batch_size=32,
        progress=False,
    )
    assert art.config["observer"] == ("histogram" if observer == "entropy" else observer)
    assert art.config["per_channel"] is per_channel
    assert "calib_data" not in art.config  # a Dataset object is not a reference
    assert art.extra["calibration"]["samples"] == 64
    m = _jit_load(tmp_path / "q.pt")
    x = torch.rand(3, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(m(x), tiny_cnn().eval()(x), atol=0.3)


def test_exclude_keeps_module_float(cli, tmp_path: Path) -> None:
    out = tmp_path / "q.pt"
    code, stdout, stderr = cli(
        "quantize",
        TINY,
        "--mode",
        "static",
        "--calib-data",
        CALIB,
        "--exclude",
        "fc",
        "--calibration-batches",
        "2",
        "--no-progress",
        "--json",
        "-o",
        out,
    )
    assert code == 0, stderr
    side = json.loads(stdout)
    assert "int8 activation ranges fitted on 64 calibration samples" in stderr  # --json: stderr still says it
    assert side["extra"]["float_layers"] == {"fc": "excluded (--exclude / float_modules)"}
    assert side["config"]["float_modules"] == ["fc"]


def test_untraceable_module_can_be_excluded(tmp_path: Path) -> None:
    from ptopt.compress.quantize import quantize

    art = quantize(
        "tests.compress.quant_models:untraceable",
        "static",
        tmp_path / "q.pt",
        calib_data=CALIB,
        exclude=["gate"],
        calibration_batches=2,
        progress=False,
    )
    assert "conv" not in art.extra["float_layers"]
    assert _jit_load(tmp_path / "q.pt")(torch.rand(2, 1, 8, 8)).shape == (2, 10)


@pytest.mark.parametrize("backend", ["fbgemm", "qnnpack"])
def test_other_backends(tmp_path: Path, backend: str) -> None:
    from ptopt.compress.quantize import quantize

    art = quantize(
        TINY,
        "static",
        tmp_path / "q.pt",
        calib_data=CALIB,
        backend=backend,
        calibration_batches=2,
        progress=False,
    )
    assert art.config["backend"] == backend and art.extra["onnx_quantization"]["reduce_range"] == (
        backend == "fbgemm"
    )


def test_configs_round_trip() -> None:
    from ptopt.compress.quantize import DynamicQuantConfig, QATConfig, StaticQuantConfig
    from ptopt.core.config import config_from_dict

    for cfg in (
        StaticQuantConfig(observer="percentile", float_modules=("a.b",)),
        DynamicQuantConfig(layers=("lstm",), per_channel=False),
        QATConfig(epochs=2, backend="qnnpack"),
    ):
        assert config_from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_qconfig_mapping_expresses_candidates() -> None:
    """What accuracy-aware search varies: float modules, per-tensor vs per-channel, observer."""
    from ptopt.compress.quantize import StaticQuantConfig
    from ptopt.compress.quantize import engine_fx as engine

    cfg = StaticQuantConfig(observer="minmax", per_channel=False, float_modules=("layers.0", "fc"))
    mapping = engine.build_qconfig_mapping(cfg)
    assert mapping.module_name_qconfigs == {"layers.0": None, "fc": None}
    pc = engine.build_qconfig_mapping(StaticQuantConfig(observer="percentile"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # upstream: reduce_range will be deprecated
        assert mapping.global_qconfig.weight().qscheme == torch.per_tensor_symmetric
        assert type(mapping.global_qconfig.activation()).__name__ == "MinMaxObserver"
        assert pc.global_qconfig.weight().qscheme == torch.per_channel_symmetric
        assert isinstance(pc.global_qconfig.activation(), engine.PercentileObserver)


def test_sidecar_written_atomically_with_artifact(tmp_path: Path) -> None:
    from ptopt.compress.quantize import quantize

    out = tmp_path / "sub" / "q.pt"
    quantize(TINY, "static", out, calib_data=CALIB, calibration_batches=1, progress=False)
    assert sidecar_path(out).is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["q.pt", "q.pt.ptopt.json"]


def test_fx_without_a_named_observer_calibrates_with_its_own_the_histogram():
    from ptopt.compress.quantize import engine_fx
    from ptopt.compress.quantize.config import StaticQuantConfig

    cfg = StaticQuantConfig(engine="fx")
    assert cfg.observer is None  # the config names none: the engine decides, with or without .observed()
    assert "HistogramObserver" in repr(engine_fx.build_qconfig(cfg).activation)
    assert "MinMaxObserver" in repr(engine_fx.build_qconfig(cfg, qat=True).activation)
