"""Tiny models for the accuracy-aware quantization tests (``tests.compress.autoquant_models:NAME``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FragileMLP(nn.Module):
    """An MLP on 1×8×8 digits whose middle layer ``fragile`` breaks under int8 on purpose.

    ``fc1`` emits one channel at a constant ~500 that ``fragile`` ignores (zero weights): in float it
    changes nothing, but int8 activations of ``fragile``'s input get a scale 1000× too coarse for the
    channels that matter, so quantizing ``fragile`` (or the activation feeding it) wrecks the output.
    """

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fragile = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 10)
        with torch.no_grad():
            self.fc1.weight[0].zero_()
            self.fc1.bias[0] = 500.0
            self.fragile.weight[:, 0] = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(torch.flatten(x, 1)))
        h = F.relu(self.fragile(h))
        return self.fc3(h)

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.rand(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def fragile_mlp() -> FragileMLP:
    torch.manual_seed(0)
    return FragileMLP()


def tokens(n: int = 32, seq: int = 32) -> dict[str, torch.Tensor]:
    """Keyword inputs for ``ptopt.models.minilm:minilm_tiny``: random token ids, varied lengths."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 5000, (n, seq), generator=g)
    lengths = torch.randint(4, seq + 1, (n,), generator=g)
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    ids[:, 0] = 101
    return {"input_ids": ids * mask, "attention_mask": mask}
