"""The ONNX exporter's refusal names its cause and a way out that works (found by a sweep of timm
models: maxvit_pico_rw_256's 'Failed to decompose the FX graph ... This is step 2/3 ... Next steps:.')."""

from __future__ import annotations

import pytest
import torch

import ptopt
from ptopt.core.errors import UnsupportedModelError

MODEL = "tests.export.test_onnx_exporter_refusal:small_cnn"

# torch 2.13's ConversionError text when its decomposition step fails (timm maxvit, dynamic batch)
_BANNER = (
    "Failed to decompose the FX graph for ONNX compatibility. \x1b[96mThis is step 2/3\x1b[0m of exporting "
    "the model to ONNX. Next steps:\n- Create an issue in the PyTorch GitHub repository against the "
    "\x1b[96m*torch.export*\x1b[0m component and attach the full error stack as well as reproduction scripts."
    "\n\n## Exception summary\n\n<class 'ValueError'>: Cannot view a tensor with shape torch.Size([16*s77, 4, "
    "2, 32]) and strides (256, 32, 128, 1) as a tensor with shape (16*s77, 2, 2, 64)!\n\nWhile executing "
    "%view_32 : [num_users=1] = call_function[target=torch.ops.aten.view.default](args = (%t, [2, 2, -1]))"
)


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 2)
    )


@pytest.fixture
def failing_decomposition(monkeypatch):
    """torch.export's ONNX exporter (dynamo=True) fails as it does on timm maxvit; the TorchScript
    exporter (dynamo=False) runs for real."""
    from torch.onnx._internal.exporter._errors import ConversionError

    real = torch.onnx.export

    def export(*args, dynamo=True, **kwargs):
        if dynamo:
            raise ConversionError(_BANNER) from ValueError(_BANNER.split("<class 'ValueError'>: ")[1])
        return real(*args, dynamo=dynamo, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", export)


def _model() -> torch.nn.Module:
    return small_cnn().eval()


def test_the_refusal_names_the_cause_and_the_older_exporter(failing_decomposition, tmp_path):
    with pytest.raises(UnsupportedModelError) as info:
        ptopt.export(_model(), "onnx", tmp_path / "m.onnx", input_shapes=["1x3x8x8"], progress=False)
    msg = str(info.value)
    assert "Cannot view a tensor with shape" in msg
    assert "Next steps" not in msg and "step 2/3" not in msg and "\x1b" not in msg
    assert "--opset 17" in msg


def test_cli_refusal_and_its_way_out(failing_decomposition, cli, tmp_path):
    code, out, err = cli(
        "export", MODEL, "--target", "onnx", "--input-shape", "1x3x8x8", "-o", tmp_path / "m.onnx"
    )
    assert code == 2 and "Cannot view a tensor" in err and "--opset 17" in err, err
    code, out, err = cli(
        "export",
        MODEL,
        "--target",
        "onnx",
        "--opset",
        "17",
        "--input-shape",
        "1x3x8x8",
        "-o",
        tmp_path / "m.onnx",
    )
    assert code == 0, err
    assert (tmp_path / "m.onnx").exists()


def lazy_cnn() -> torch.nn.Module:
    """A factory's model whose last layer takes its size on the first call (``nn.LazyLinear``)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(2)
    )


def test_a_layer_built_on_the_first_call_exports(cli, tmp_path):
    """The first batch ran under inference_mode, so a lazy layer's weight became an inference tensor and
    torch.export refused it: 'Inference tensors cannot be saved for backward' (exit 2)."""
    code, out, err = cli(
        "export",
        f"{MODEL[: MODEL.index(':')]}:lazy_cnn",
        "--target",
        "onnx",
        "--input-shape",
        "1x3x8x8",
        "-o",
        tmp_path / "l.onnx",
    )
    assert code == 0, err
    assert "cosine 1.000000" in out
