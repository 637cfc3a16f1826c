"""A --min-shape torch.export cannot keep (the model's code narrows the range: a stride-32 layer whose
output must not be 1 wide, as in a torchvision ResNet at 32x32) is refused in one line naming the
dimension, the sizes that work and the --min-shape to give, not torch.export's constraint text."""

from __future__ import annotations

from tests.helpers import assert_refused

MODEL = """
import torch
from torch import nn


class Strided(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1, stride=32)
        self.bn = nn.BatchNorm2d(4)
        self.p = nn.AdaptiveAvgPool2d(1)
        self.f = nn.Linear(4, 2)

    def forward(self, x):
        return self.f(self.p(self.bn(self.c(x))).flatten(1))


def make():
    torch.manual_seed(0)
    return Strided().eval()
"""

SHAPES = ("--min-shape", "1x3x32x32", "--opt-shape", "1x3x64x64", "--max-shape", "1x3x96x96")


def test_a_range_torch_export_narrows_names_the_min_shape_that_works(cli, tmp_path):
    (tmp_path / "strided.py").write_text(MODEL)
    msg = assert_refused(
        cli, "export", "strided:make", "--target", "exported_program", *SHAPES, "-o", "s.pt2",
        match=("dimension 2 of", "33..96", "--min-shape 1x3x33x33"), where=tmp_path,
    )  # fmt: skip
    assert "L['x']" not in msg and "Constraints violated" not in msg
    code, out, err = cli(
        "export", "strided:make", "--target", "exported_program", "--min-shape", "1x3x33x33",
        "--opt-shape", "1x3x64x64", "--max-shape", "1x3x96x96", "-o", "s.pt2",
    )  # fmt: skip
    assert code == 0, err


def test_an_unreadable_guard_leaves_the_message_alone():
    from ptopt.core.inputspec import InputSpec
    from ptopt.formats.capture import shape_range_fix

    spec = InputSpec("x", (1, 3, 32, 32), (1, 3, 64, 64), (1, 3, 96, 96))
    text = (
        "  - Not all values of h = L['x'].size()[2] in the specified range 32 <= h <= 96 satisfy the "
        "generated guard __import__('os').getcwd() != 1."
    )
    assert shape_range_fix(text, [spec]) is None
    assert shape_range_fix("some other failure", [spec]) is None
    ok = text.replace("__import__('os').getcwd()", "(1 + (((-1) + L['x'].size()[2]) // 32))")
    assert "takes 33..96" in shape_range_fix(ok, [spec])
