"""Models for the export tests, importable as ``tests.export.export_models:NAME`` factories."""

from __future__ import annotations

import torch
from torch import nn


class Solver(nn.Module):
    """Calls an op the ONNX exporter has no translation for (an eigen-decomposition)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = x[:, 0, :2, :2]
        return torch.linalg.eigh(g @ g.transpose(1, 2))[0].sum(-1, keepdim=True)


class WithSolver(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)
        self.solver = Solver()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(x, 1)) + self.solver(x)

    def example_inputs(self) -> torch.Tensor:
        return torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def with_solver() -> WithSolver:
    torch.manual_seed(0)
    return WithSolver()


class BatchBaked(nn.Module):
    """Scales by the batch size read as a Python number: a trace bakes the example's batch in."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(x, 1)) * float(x.shape[0])

    def example_inputs(self) -> torch.Tensor:
        return torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def batch_baked() -> BatchBaked:
    torch.manual_seed(0)
    return BatchBaked()
