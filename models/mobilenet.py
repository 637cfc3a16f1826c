"""MobileNetV2-style CNN for 1×32×32 digits: depthwise-separable inverted residual blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4):
        super().__init__()
        hidden = cin * expand
        self.expand = nn.Conv2d(cin, hidden, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.project = nn.Conv2d(hidden, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu6(self.bn1(self.expand(x)))
        out = F.relu6(self.bn2(self.depthwise(out)))
        out = self.bn3(self.project(out))
        return x + out if self.use_residual else out


class MobileNet(nn.Module):
    #: (out_channels, stride) per block
    CONFIG = ((16, 1), (24, 2), (24, 1), (48, 2), (48, 1), (96, 1))

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 32, stem: int = 16):
        super().__init__()
        self.in_channels, self.image_size = in_channels, image_size
        self.stem = nn.Conv2d(in_channels, stem, 3, 2, 1, bias=False)  # 32×32 → 16×16
        self.bn = nn.BatchNorm2d(stem)
        blocks, cin = [], stem
        for cout, stride in self.CONFIG:
            blocks.append(InvertedResidual(cin, cout, stride))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Conv2d(cin, 192, 1, bias=False)
        self.bn_head = nn.BatchNorm2d(192)
        self.classifier = nn.Linear(192, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self.bn(self.stem(x)))
        x = self.blocks(x)
        x = F.relu6(self.bn_head(self.head(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.classifier(x)

    def example_inputs(self, batch: int = 1) -> torch.Tensor:
        return torch.randn(
            batch,
            self.in_channels,
            self.image_size,
            self.image_size,
            generator=torch.Generator().manual_seed(0),
        )


def mobilenet() -> MobileNet:
    return MobileNet()
