"""Bad input to `ptopt export` and to `ptopt.export(...)`: exit 2 / a typed PtoptError, one clear
line, nothing written."""

from __future__ import annotations

import pytest
import torch

from ptopt.core.errors import DataError, ShapeMismatchError, UnsupportedModelError, UsageError
from tests.helpers import SUFFIX, assert_refused, tiny_cnn

MODELS = "tests.export.export_models"

CLI_CASES = [
    (["--target", "onnx", "--min-shape", "8x1x8x8", "--opt-shape", "4x1x8x8"], "min > opt at dimension 0"),
    (["--target", "onnx", "--opt-shape", "4x1x8x8", "--max-shape", "2x1x8x8"], "opt > max at dimension 0"),
    (["--target", "torchscript", "--opt-shape", "4x8x8"], "has rank 3, but the model takes rank 4"),
    (["--target", "coreml"], "unknown target 'coreml'"),
    (
        ["--target", "torchscript", "--precision", "int8"],
        "--precision int8 is not available for --target torchscript",
    ),
    (
        ["--target", "exported_program", "--precision", "int8"],
        "quantize first: ptopt quantize MODEL --mode static --engine pt2e --no-compile",
    ),
    (["--target", "onnx", "--precision", "int8"], "needs calibration data: pass --data"),
    (["--target", "onnx", "--dynamic-batch", "4:2:8"], "min > opt"),
    (["--target", "onnx", "--int8-method", "magic"], "unknown int8 ONNX method 'magic'"),
    (
        ["--target", "onnx", "--input-shape", "2x1x8x8", "--min-shape", "1x1x8x8", "--max-shape", "4x1x8x8"],
        "--input-shape and --min-shape/--max-shape both give the input shapes",
    ),
]


@pytest.mark.parametrize(
    "args, message",
    CLI_CASES,
    ids=[
        "min>opt",
        "opt>max",
        "rank",
        "target",
        "int8-torchscript",
        "ep-int8",
        "int8-no-data",
        "batch",
        "int8-method",
        "input-shape-and-range",
    ],
)
def test_bad_options_exit_2_nothing_written(cli, tmp_path, tiny_cnn_factory, args, message):
    out = tmp_path / "out" / f"m{SUFFIX.get(args[1], '.bin')}"  # a file name its target writes
    assert_refused(cli, "export", tiny_cnn_factory, *args, "-o", out, match=message, where=tmp_path)


@pytest.mark.parametrize(
    "model, target, message",
    [
        (f"{MODELS}:with_solver", "onnx", ("linalg_eigh", "module 'solver' (Solver)")),
        (f"{MODELS}:str_output", "torchscript", "returns a str"),
        (f"{MODELS}:str_output", "exported_program", "returns a str"),
        (f"{MODELS}:numpy_forward", "exported_program", "torch.export cannot capture"),
        (f"{MODELS}:numpy_forward", "onnx", "torch.export cannot capture"),
    ],
    ids=["unsupported-op", "str-output-ts", "str-output-pt2", "numpy-pt2", "numpy-onnx"],
)
def test_model_that_cannot_be_captured(cli, tmp_path, model, target, message):
    assert_refused(
        cli,
        "export",
        model,
        "--target",
        target,
        "-o",
        tmp_path / f"m{SUFFIX[target]}",
        match=message,
        where=tmp_path,
    )


def test_nan_data_is_refused(cli, tmp_path, tiny_cnn_factory):
    x = torch.randn(16, 1, 8, 8)
    x[3, 0, 2, 2] = float("nan")
    torch.save({"x": x}, tmp_path / "nan.pt")
    args = (
        "--target",
        "onnx",
        "--precision",
        "int8",
        "--data",
        tmp_path / "nan.pt",
        "-o",
        tmp_path / "m.onnx",
    )
    assert_refused(cli, "export", tiny_cnn_factory, *args, match="NaN", where=tmp_path)


def _nan_batch() -> torch.Tensor:
    x = torch.randn(8, 1, 8, 8)
    x[0, 0, 0, 0] = float("nan")
    return x


PY_CASES = [
    (dict(target="coreml"), UsageError, "unknown target"),
    (dict(target="onnx", min_shape="1x8", max_shape="4x8"), ShapeMismatchError, "rank"),
    (dict(target="onnx", input_shapes=torch.randn(2, 3, 8, 8)), ShapeMismatchError, "does not fit model"),
    (dict(target="torchscript", input_shapes="2x3x8x8"), ShapeMismatchError, "does not fit model"),
    (dict(target="onnx", data=_nan_batch()), DataError, "NaN"),
    (dict(target="onnx", precision="int8", data=[_nan_batch()]), DataError, "NaN"),
    (dict(target="onnx", input_shapes=3.5), UsageError, "input_shapes"),
    (dict(target="onnx", input_shapes="1x1x8x8", input_specs=[]), UsageError, "not both"),
    (
        dict(target="onnx", input_shapes=["2x1x8x8"], opt_shape="2x1x8x8"),
        UsageError,
        "--input-shape and --opt-shape",
    ),
]


@pytest.mark.parametrize(
    "kwargs, error, message",
    PY_CASES,
    ids=[
        "target",
        "rank",
        "wrong-tensor",
        "wrong-shape-string",
        "nan",
        "nan-calib",
        "bad-type",
        "both",
        "input-shape-and-opt",
    ],
)
def test_python_api_refuses_bad_input(tmp_path, kwargs, error, message):
    from ptopt.export.api import export

    out = tmp_path / f"m{SUFFIX.get(kwargs['target'], '.out')}"
    assert_refused(export, tiny_cnn(), output=out, **kwargs, match=message, where=tmp_path, error=error)


@pytest.mark.parametrize(
    "factory, target",
    [("str_output", "onnx"), ("numpy_forward", "exported_program")],
    ids=["str-output", "numpy"],
)
def test_python_api_refuses_a_module_it_cannot_capture(tmp_path, factory, target):
    from ptopt.export.api import export
    from tests.export import export_models

    module = getattr(export_models, factory)()
    assert_refused(
        export, module, target, input_shapes="2x1x8x8", where=tmp_path, error=UnsupportedModelError
    )


def test_help_states_the_parity_defaults_the_check_uses(cli):
    """--atol's help said "1e-1 int8" (int8's rtol) while an int8 export printed atol 1e-06: the
    defaults are read from the table the check uses."""
    from ptopt.export.parity import DEFAULT_TOLERANCES, INT8_VS_FP32_RTOL

    code, out, _ = cli("export", "--help")
    text = " ".join(out.split())
    assert code == 0
    for precision, (atol, rtol) in DEFAULT_TOLERANCES.items():
        assert f"{atol:g} {precision}" in text.split("--atol")[1].split("--rtol")[0]
        assert f"{rtol:g} {precision}" in text.split("--rtol")[1].split("--min-cosine")[0]
    assert f"{INT8_VS_FP32_RTOL:g} for int8 quantized here from an fp32 source" in text


class _DictOut(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> dict:
        return {"feat": self.fc(x)}


def test_a_torchscript_archive_the_onnx_exporter_refuses_names_the_way_out(cli, tmp_path):
    """A TorchScript archive takes torch's TorchScript ONNX exporter only; a dict output stops it. The
    one line said what failed but not that the original nn.Module exports (through torch.export)."""
    ts = tmp_path / "m.pt"
    torch.jit.save(torch.jit.trace(_DictOut().eval(), torch.randn(2, 4), strict=False), str(ts))
    out = tmp_path / "m.onnx"
    msg = assert_refused(
        cli, "export", ts, "--target", "onnx", "--input-shape", "1x4", "-o", out, match="DictConstruct"
    )
    assert "export the original nn.Module (pkg.module:factory --weights W)" in msg
    assert not (tmp_path / "m.onnx").exists()
