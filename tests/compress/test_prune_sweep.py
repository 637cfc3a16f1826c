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


class _KeywordLinear(torch.nn.Module):
    """timm EVA's attention: ``F.linear(x, weight=self.qkv.weight, bias=qkv_bias)``, the weight by name;
    with ``own_bias=False`` the bias a parameter of its own (EVA's ``q_bias`` / ``v_bias``)."""

    def __init__(self, own_bias: bool) -> None:
        super().__init__()
        self.own_bias = own_bias
        self.stem = torch.nn.Linear(8, 16)
        self.fc1 = torch.nn.Linear(16, 32, bias=own_bias)
        self.fc1_bias = None if own_bias else torch.nn.Parameter(torch.randn(32))
        self.fc2 = torch.nn.Linear(32, 24)
        self.fc3 = torch.nn.Linear(24, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.fc1.bias if self.own_bias else self.fc1_bias
        h = F.linear(self.stem(x), weight=self.fc1.weight, bias=bias)
        return self.fc3(torch.relu(self.fc2(torch.relu(h))))


def keyword_linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return _KeywordLinear(own_bias=True).eval()


def foreign_bias() -> torch.nn.Module:
    torch.manual_seed(0)
    return _KeywordLinear(own_bias=False).eval()


def _channels(res) -> dict[str, int]:
    return {row["layer"]: row["channels_after"] for row in res.extra["layers"]}


def test_a_linear_given_its_weight_by_name_is_followed(cli, tmp_path):
    """``F.linear(x, weight=W)`` was an IndexError (tuple index out of range; exit 3 on timm
    eva02_tiny_patch14_224): the weight was read as the second positional argument."""
    x = torch.randn(3, 8)
    res = prune(keyword_linear(), "structured", 0.5, input_shapes=["2x8"])
    assert _channels(res)["fc1"] == 16 and _channels(res)["fc2"] == 12
    assert torch.allclose(res.model(x), res.model(x)) and res.model(x).shape == (3, 4)
    code, out, err = cli(
        "prune",
        "tests.compress.test_prune_sweep:keyword_linear",
        "--method",
        "structured",
        "--amount",
        "0.5",
        "--input-shape",
        "2x8",
        "-o",
        tmp_path / "k.pt",
    )
    assert code == 0, err
    assert torch.jit.load(str(tmp_path / "k.pt"))(x).shape == (3, 4)


def test_a_bias_held_outside_the_layer_keeps_its_outputs():
    """A layer called with a bias of another module's (EVA's ``q_bias``) keeps its outputs: cutting them
    left the bias full width ('the pruned model does not run: The expanded size ... (16) must match ...
    (32)'); the layers around it are still pruned."""
    x = torch.randn(3, 8)
    res = prune(foreign_bias(), "structured", 0.5, input_shapes=["2x8"])
    assert res.model.fc1.weight.shape == (32, 16) and _channels(res)["fc2"] == 12
    assert res.model(x).shape == (3, 4)
