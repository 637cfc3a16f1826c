"""A user's torchvision model loads in a fresh ``ptopt`` process: a factory module that imports
torchvision, found in the current folder (as ``python -m`` finds it) by the installed ``ptopt``, and a
``torch.save(model)`` of a torchvision model (with ``--allow-pickle``). PyPI's torchvision beside the
CPU torch dies on ``import torchvision`` (``operator torchvision::nms does not exist``, REFERENCE.md);
ptopt registers the op names first (``core.hf.ensure_torchvision_ops``), as it does for transformers.
Each runs in a subprocess: a test worker has imported torchvision already."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="no torchvision")

FACTORY = """import torch
import torchvision


def squeezenet():
    return torchvision.models.squeezenet1_1(num_classes=10)


def samples():
    return {"x": torch.randn(4, 3, 32, 32)}
"""


def test_a_factory_module_in_the_current_folder_that_imports_torchvision(tmp_path):
    """``ptopt inspect tvmodels:squeezenet --data tvmodels:samples`` where tvmodels.py is, no PYTHONPATH."""
    (tmp_path / "tvmodels.py").write_text(FACTORY)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    exe = Path(sys.executable).with_name("ptopt")
    if not exe.is_file():
        pytest.skip(f"no installed ptopt script beside {sys.executable}")
    run = subprocess.run(
        [str(exe), "inspect", "tvmodels:squeezenet", "--data", "tvmodels:samples"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "features.0" in run.stdout and "x3x32x32" in run.stdout


def test_a_pickled_torchvision_model_with_allow_pickle(run_ptopt, tmp_path):
    import torch

    from ptopt.core.hf import ensure_torchvision_ops

    ensure_torchvision_ops()
    import torchvision

    torch.save(torchvision.models.squeezenet1_1(num_classes=10), tmp_path / "sq.pt")
    run = run_ptopt("inspect", "sq.pt", "--allow-pickle", "--input-shape", "1x3x32x32")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "pickle" in run.stdout and "1x10" in run.stdout.replace(" ", "")


DETECTOR = '''
import torch


class Detector(torch.nn.Module):
    """Calls an op torchvision could not load, as a detection model's nms does beside the CPU torch."""

    def forward(self, x):
        raise RuntimeError(
            "Couldn't load custom C++ ops. This can happen if your PyTorch and torchvision versions are "
            "incompatible, or if you had errors while compiling torchvision from source."
        )


def detector():
    return Detector()
'''


def test_a_model_calling_torchvision_ops_that_cannot_load_is_not_called_a_shape_mismatch(cli, tmp_path):
    """`ptopt export` of ssdlite320 said 'the min shape does not fit model ...: Couldn't load custom C++
    ops', blaming the shape for a torchvision that cannot load its C++ ops here."""
    import ptopt
    from ptopt.core.errors import UnsupportedModelError
    from tests.helpers import assert_refused

    (tmp_path / "det_mod_ops.py").write_text(DETECTOR)
    msg = assert_refused(
        cli, "export", "det_mod_ops:detector", "--target", "onnx", "--input-shape", "1x3x32x32", "-o",
        tmp_path / "d.onnx", match="calls torchvision's C++ ops (nms, roi_align",
    )  # fmt: skip
    assert "does not fit" not in msg
    import det_mod_ops

    with pytest.raises(UnsupportedModelError, match="install the torchvision built for this torch"):
        ptopt.export(det_mod_ops.detector(), "onnx", tmp_path / "d.onnx", input_shapes=["1x3x32x32"])
