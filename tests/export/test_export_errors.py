"""Bad input to `ptopt export`: exit 2, one clear line, nothing written."""

from __future__ import annotations

import pytest

CASES = [
    (["--target", "onnx", "--min-shape", "8x1x8x8", "--opt-shape", "4x1x8x8"], "min > opt at dimension 0"),
    (["--target", "onnx", "--opt-shape", "4x1x8x8", "--max-shape", "2x1x8x8"], "opt > max at dimension 0"),
    (["--target", "torchscript", "--opt-shape", "4x8x8"], "has rank 3, but the model takes rank 4"),
    (["--target", "coreml"], "unknown target 'coreml'"),
    (
        ["--target", "torchscript", "--precision", "int8"],
        "--precision int8 is not available for --target torchscript",
    ),
    (["--target", "onnx", "--precision", "int8"], "needs calibration data: pass --data"),
    (["--target", "onnx", "--dynamic-batch", "4:2:8"], "min > opt"),
]


@pytest.mark.parametrize(
    "args, message",
    CASES,
    ids=["min>opt", "opt>max", "rank", "target", "int8-torchscript", "int8-no-data", "batch"],
)
def test_bad_input_exit_2_nothing_written(cli, tmp_path, tiny_cnn_factory, args, message):
    out = tmp_path / "out" / "m.bin"
    code, stdout, err = cli("export", tiny_cnn_factory, *args, "-o", out)
    assert code == 2, (stdout, err)
    assert message in err and "Traceback" not in err and err.startswith("error:")
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_unsupported_op_names_op_and_module(cli, tmp_path):
    out = tmp_path / "s.onnx"
    code, _, err = cli("export", "tests.export.export_models:with_solver", "--target", "onnx", "-o", out)
    assert code == 2
    assert "linalg_eigh" in err and "module 'solver' (Solver)" in err
    assert list(tmp_path.iterdir()) == []


def test_python_twin_raises_typed_errors(tmp_path, tiny_cnn_factory):
    from ptopt.core.errors import ShapeMismatchError, UsageError
    from ptopt.export.api import export

    with pytest.raises(UsageError, match="unknown target"):
        export(tiny_cnn_factory, "coreml", tmp_path / "x")
    with pytest.raises(ShapeMismatchError, match="rank"):
        export(tiny_cnn_factory, "onnx", tmp_path / "x.onnx", min_shape="1x8", max_shape="4x8")
    assert list(tmp_path.iterdir()) == []
