"""Tiny models with the patterns structured pruning must follow (``tests.compress.prune_models:NAME``).

All take 1×8×8 digits (``builtin:digits``) and are small enough to prune and fine-tune in a second.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TinyMobile(nn.Module):
    """MobileNet-like: stem, inverted residual (expand → depthwise → project, ``x + out``), a conv
    whose output is flattened into a hidden linear, and the classifier."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.expand = nn.Conv2d(8, 16, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.project = nn.Conv2d(16, 8, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(8)
        self.conv = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.bn4 = nn.BatchNorm2d(8)
        self.fc1 = nn.Linear(8 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self.bn0(self.stem(x)))
        out = F.relu6(self.bn1(self.expand(x)))
        out = F.relu6(self.bn2(self.depthwise(out)))
        x = x + self.bn3(self.project(out))
        x = F.relu(self.bn4(self.conv(x)))
        x = x.view(x.size(0), -1)
        return self.fc2(F.relu(self.fc1(x)))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def tiny_mobile() -> TinyMobile:
    torch.manual_seed(0)
    return TinyMobile().eval()


class Untraceable(TinyMobile):
    """Control flow on tensor values: torch.fx cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            x = x * 2
        return super().forward(x)


def untraceable() -> Untraceable:
    torch.manual_seed(0)
    return Untraceable().eval()


class Unresolvable(TinyMobile):
    """The expand conv's channels go through an op the pruner does not follow (``channel_shuffle``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self.bn0(self.stem(x)))
        out = torch.channel_shuffle(F.relu6(self.bn1(self.expand(x))), 2)
        out = F.relu6(self.bn2(self.depthwise(out)))
        x = x + self.bn3(self.project(out))
        x = F.relu(self.bn4(self.conv(x)))
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def unresolvable() -> Unresolvable:
    torch.manual_seed(0)
    return Unresolvable().eval()


class Concat(nn.Module):
    """Two branches concatenated along channels (kept whole), then a prunable conv and classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.a = nn.Conv2d(8, 6, 3, padding=1)
        self.b = nn.Conv2d(8, 6, 1)
        self.mix = nn.Conv2d(12, 12, 3, padding=1)
        self.fc = nn.Linear(12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        x = torch.cat([F.relu(self.a(x)), F.relu(self.b(x))], dim=1)
        x = F.relu(self.mix(x))
        return self.fc(x.mean((2, 3)))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def concat() -> Concat:
    torch.manual_seed(0)
    return Concat().eval()


class LeNet(nn.Module):
    """Hard-coded flatten size (``x.view(-1, 16 * 2 * 2)``), as in the classic tutorials."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.view(-1, 16 * 2 * 2)
        return self.fc2(F.relu(self.fc1(x)))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def lenet() -> LeNet:
    torch.manual_seed(0)
    return LeNet().eval()


class GruClassifier(nn.Module):
    """A GRU over 8 steps of 8 features, then a Linear head: the first layer that runs is the GRU,
    not ``head.0``. Declares no input shape (a factory model: pruning needs ``--input-shape``)."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 32, batch_first=True)
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def gru_classifier() -> GruClassifier:
    torch.manual_seed(0)
    return GruClassifier().eval()


class Rolled(nn.Module):
    """A block whose expanding conv's channels go through ``torch.channel_shuffle`` (unknown to the
    pruner)."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.expand = nn.Conv2d(c, 2 * c, 1)
        self.project = nn.Conv2d(2 * c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(torch.channel_shuffle(F.relu(self.expand(x)), 2))


class RolledStack(nn.Module):
    """Stem, three ``Rolled`` blocks, a prunable conv, a classifier: three groups kept (their channels
    reach an op the pruner does not follow), the rest pruned."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.blocks = nn.Sequential(Rolled(), Rolled(), Rolled())
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(self.blocks(F.relu(self.stem(x)))))
        return self.fc(x.mean((2, 3)))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.rand(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def rolled_stack() -> RolledStack:
    torch.manual_seed(0)
    return RolledStack().eval()
