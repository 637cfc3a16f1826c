"""A tiny CNN in a module that imports torchvision at the top, as timm's model modules do: unpickling it in
another process imports torchvision, which beside the CPU torch needs ``ptopt.core.hf.ensure_torchvision_ops``
first (``operator torchvision::nms does not exist`` otherwise). Import it only after calling that."""

from __future__ import annotations

import torch
import torchvision  # noqa: F401 - the point: importing this module imports torchvision
from torch import nn


class VisionCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


def vision_cnn() -> nn.Module:
    torch.manual_seed(0)
    return VisionCNN().eval()
