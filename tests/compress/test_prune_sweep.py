"""Defects a sweep of torchvision / timm image architectures found in structured pruning, each on a
tiny model of the construct that broke."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ptopt.compress.prune import PruneWarning, prune
from ptopt.compress.prune.techniques.structured import structured_prune

COSINE = "tests.compress.test_prune_sweep:cosine_attention"


class _CosineAttention(torch.nn.Module):
    """Swin V2's scaled cosine attention: q and k L2-normalised over their channels (``F.normalize``:
    ``linalg_vector_norm(x, 2.0, [-1], True)`` in the ATen graph, its order before its dims)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(8, 24)
        self.q, self.k, self.v = (torch.nn.Linear(24, 16) for _ in range(3))
        self.proj = torch.nn.Linear(16, 24)
        self.head = torch.nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        q, k = F.normalize(self.q(h), dim=-1), F.normalize(self.k(h), dim=-1)
        h = h + self.proj((q @ k.transpose(-2, -1)).softmax(-1) @ self.v(h))
        return self.head(h.mean(1) * h.norm(2.0, -1).mean(1, keepdim=True))


def cosine_attention() -> torch.nn.Module:
    torch.manual_seed(0)
    return _CosineAttention().eval()


def test_a_norm_reads_its_dims_after_its_order():
    """The ATen graph's ``linalg_vector_norm(x, 2.0, [-1], True)`` was read as dims=2.0: TypeError
    ('float' object is not iterable), exit 3 on torchvision swin_v2_t."""
    x = torch.randn(2, 6, 8)
    pruned, _ = structured_prune(cosine_attention(), x, 0.5, graph="export")
    assert pruned(x).shape == (2, 5)
    with pytest.warns(PruneWarning, match="normalize"):  # torch.fx's graph: q and k kept, said
        res = prune(cosine_attention(), "structured", 0.5, input_shapes=["2x6x8"])
    assert res.metrics["parameters_after"] < res.metrics["parameters_before"]
    assert res.model(x).shape == (2, 5)


def test_cli_prunes_cosine_attention(cli, tmp_path):
    code, out, err = cli(
        "prune",
        COSINE,
        "--method",
        "structured",
        "--amount",
        "0.5",
        "--input-shape",
        "2x6x8",
        "-o",
        tmp_path / "c.pt",
    )
    assert code == 0, err
    assert torch.jit.load(str(tmp_path / "c.pt"))(torch.randn(3, 6, 8)).shape == (3, 5)
