"""ResNet-style CNN for 1×32×32 digits: basic blocks with residual ``x + y``, functional ReLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(
        self,
        widths: tuple[int, ...] = (32, 64, 128),
        blocks: tuple[int, ...] = (1, 1, 1),
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 32,
    ):
        super().__init__()
        self.in_channels, self.image_size = in_channels, image_size
        self.stem = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks, strict=False)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, stride=2 if (i > 0 and j == 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.stem(x)))
        x = self.layers(x)
        x = F.adaptive_avg_pool2d(x, 1)
        x = torch.flatten(x, 1)
        return self.fc(x)

    def example_inputs(self, batch: int = 1) -> torch.Tensor:
        return torch.randn(
            batch,
            self.in_channels,
            self.image_size,
            self.image_size,
            generator=torch.Generator().manual_seed(0),
        )


def resnet() -> ResNet:
    """The zoo's ResNet-style CNN (≈0.3 M parameters)."""
    return ResNet()


def resnet_small() -> ResNet:
    """A narrow ResNet (≈1/7 of ``resnet``'s parameters), e.g. a distillation student."""
    return ResNet(widths=(12, 24, 48))
