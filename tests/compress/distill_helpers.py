"""Tiny teacher/student pairs for the distillation and trainer tests (1×8×8 digits)."""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers import TinyCNN


def tiny_student() -> TinyCNN:
    """Half the width of ``tests.helpers:tiny_cnn``: a student for it."""
    torch.manual_seed(1)
    return TinyCNN(width=4)


def five_class_student() -> TinyCNN:
    """Outputs 5 logits where the teacher has 10: cannot be distilled from it."""
    torch.manual_seed(1)
    return TinyCNN(width=4, num_classes=5)


class DropoutMLP(nn.Module):
    """Uses the global RNG in training (dropout), so resuming must restore RNG states exactly."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def dropout_mlp() -> DropoutMLP:
    torch.manual_seed(2)
    return DropoutMLP()


def plain_mlp() -> torch.nn.Module:
    """No BatchNorm, no dropout: trains alike on any number of processes (to float rounding)."""
    torch.manual_seed(3)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
