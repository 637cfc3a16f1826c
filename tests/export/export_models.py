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


class StrOutput(nn.Module):
    """Runs in Python but returns a string beside its logits: no model format carries that."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor):
        return self.fc(torch.flatten(x, 1)), "label"

    def example_inputs(self) -> torch.Tensor:
        return torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def str_output() -> StrOutput:
    torch.manual_seed(0)
    return StrOutput()


class NumpyForward(nn.Module):
    """Leaves torch for numpy inside forward: torch.export cannot capture it, a trace bakes it in."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = torch.from_numpy(x.detach().numpy().sum(axis=(1, 2, 3))).float()
        return self.fc(torch.flatten(x, 1)) + side[:, None]

    def example_inputs(self) -> torch.Tensor:
        return torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def numpy_forward() -> NumpyForward:
    torch.manual_seed(0)
    return NumpyForward()


class Cancels(nn.Module):
    """Adds a large constant and takes it away again: exact in fp32, garbage in bf16 (whose step at
    1e4 is 64), so a half-precision artifact of it must fail the parity check."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)
        self.register_buffer("big", torch.tensor(1e4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fc(torch.flatten(x, 1)) + self.big) - self.big

    def example_inputs(self) -> torch.Tensor:
        return torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def cancels() -> Cancels:
    torch.manual_seed(0)
    return Cancels()


class BlockMLP(nn.Module):
    """A transformer block's arithmetic without attention: LayerNorm, Linear-GELU-Linear, residual,
    mean over tokens, a classifier head (8 tokens of width 32)."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(32)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
        return self.head(h.mean(1))

    def example_inputs(self) -> torch.Tensor:
        return torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))


def block_mlp() -> BlockMLP:
    torch.manual_seed(0)
    return BlockMLP()


def linear() -> nn.Module:
    """The smallest model with weights: flatten + Linear(64, 4), on 1×8×8 inputs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 4))
    model.example_inputs = lambda: torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    return model
