"""Tiny models for the quantization tests, importable as ``tests.compress.quant_models:NAME``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TinyLSTM(nn.Module):
    """An 8×8 digit read as 8 rows of 8 pixels (takes the N×1×8×8 tensors of builtin:digits)."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.lstm = nn.LSTM(8, hidden, batch_first=True)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x.reshape(x.shape[0], 8, 8))
        out, _ = self.gru(out)
        return self.fc(out[:, -1])

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.rand(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def tiny_lstm() -> TinyLSTM:
    torch.manual_seed(0)
    return TinyLSTM()


class Gate(nn.Module):
    """Branches on the data: symbolic tracing (FX) cannot follow it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.gate = Gate()
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        x = self.gate(x)
        return self.fc(torch.flatten(x, 1))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.rand(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def untraceable() -> Untraceable:
    torch.manual_seed(0)
    return Untraceable()
