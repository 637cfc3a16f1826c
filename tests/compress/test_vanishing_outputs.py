"""A model whose fp32 outputs vanish (|y| ~ 1e-10: a random-init EfficientNet-B0 gives ~3e-13) fails
the int8 rule at cosine 0 on every engine; the refusal says why (it said only "min cosine 0.0000")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ptopt
from ptopt.core.errors import PtoptError
from ptopt.export.parity import vanishing

MODEL, DATA = f"{__name__}:vanishing_model", f"{__name__}:images"
CLAUSE = "the fp32 outputs vanish (largest |value| "


def vanishing_model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
    with torch.no_grad():
        for layer in (m[0], m[3]):
            layer.weight.mul_(1e-5)
            layer.bias.mul_(1e-12)
    return m.eval()


def images() -> torch.Tensor:
    return torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def test_vanishing_names_only_outputs_below_the_floor():
    assert vanishing(8.2e-11).startswith(CLAUSE + "8.2e-11)")
    assert vanishing(1e-3) is None and vanishing(None) is None


def test_int8_refusal_says_the_fp32_outputs_vanish(cli, tmp_path):
    args = ("quantize", MODEL, "--mode", "static", "--engine", "fx", "--calib-data", DATA, "-q")
    code, out, err = cli(*args, "-o", tmp_path / "q.pt")
    assert code == 2, out
    assert "worst-sample cosine 0.000000 < 0.99 (sample 0; " + CLAUSE in err, err
    assert err.count("\n") == 1  # one line
    with pytest.raises(PtoptError, match=r"on no engine.*\); the fp32 outputs vanish \(largest"):
        ptopt.quantize(vanishing_model(), "static", calib_data=images(), progress=False)
