"""``silenced(native=True)``: torch's C++ warnings (written to file descriptor 2, past Python's
filters) are dropped, every other line there still reaches the user; and ``ptopt export`` of an int8
TorchScript prints no ``Quantizer.cpp`` deprecation line."""

from __future__ import annotations

import os
import warnings

from ptopt.core.quiet import silenced
from tests.helpers import not_progress

WARN = b"[W1123 03:14:57.904240487 Quantizer.cpp:111] Warning: quantized tensor creation is deprecated\n"


def test_native_warning_lines_dropped_errors_kept(capfd):
    with silenced((), native=True):
        os.write(2, WARN)
        os.write(2, b"[E1123 03:14:57.9 something.cpp:1] a genuine error\n")
        os.write(2, b"plain text\n")
    os.write(2, WARN)  # outside the block: untouched
    err = capfd.readouterr().err
    assert err.count("Quantizer.cpp") == 1
    assert "a genuine error" in err and "plain text" in err


def test_export_of_int8_torchscript_prints_no_cpp_warning(run_ptopt, tmp_path):
    """The sidecar records builtin:digits:train as calibration data, so ONNX re-quantizes (ort_static)."""
    import torch

    from ptopt.core.artifact import Artifact
    from tests.export.test_export_int8 import CALIB, _fx_int8

    path = tmp_path / "tiny.int8.pt"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecations: the quantize step's business
        q, fp32 = _fx_int8()
        torch.jit.save(torch.jit.freeze(torch.jit.trace(q, torch.randn(2, 1, 8, 8))), str(path))
    Artifact(
        path, "torchscript", inputs=fp32.input_specs, precision="int8", parent=fp32.parent_record(),
        config={"type": "static", "mode": "static", "backend": "x86", "calib_data": CALIB},
    ).finalize()  # fmt: skip
    out = run_ptopt("export", path, "--target", "onnx", "-o", tmp_path / "tiny.int8.onnx")
    assert out.returncode == 0, out.stderr
    assert "Quantizer.cpp" not in out.stderr and not_progress(out.stderr) == [], out.stderr


def test_a_failing_trace_of_an_fx_graph_module_prints_nothing(capfd):
    """torch.fx's GraphModule prints its own traceback to stderr when its code raises; ptopt's trace (which
    quantize's fx engine runs, ``--engine auto`` as a probe) reports the failure in its one message only."""
    import pytest
    import torch

    from ptopt.core.errors import UnsupportedModelError
    from ptopt.formats.capture import trace

    class MatMul(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return torch.relu(x @ self.w)  # an op of the graph's own code: where fx prints from

    gm = torch.fx.symbolic_trace(MatMul())
    with pytest.raises(UnsupportedModelError, match="torch.jit.trace cannot trace MatMul"):
        trace(gm, torch.randn(2, 3), "positional")  # 3 features into a 4x4 matrix
    assert "Traceback" not in capfd.readouterr().err
