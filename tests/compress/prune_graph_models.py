"""Tiny models with the structures of issue 18 for structured pruning (``tests.compress.prune_graph_models:NAME``):
squeeze-excitation + stochastic depth + depthwise conv, GroupNorm, grouped conv, concatenation,
``nn.MultiheadAttention``, and tiny Hugging Face BERT / timm ViT (those need their libraries)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SEBlock(nn.Module):
    """EfficientNet's MBConv in small: expand → depthwise → squeeze-excitation (``x * scale``,
    broadcast over H×W) → project, stochastic depth on the residual branch."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.expand = nn.Conv2d(8, 16, 1)
        self.bn1 = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.se_reduce = nn.Conv2d(16, 4, 1)
        self.se_expand = nn.Conv2d(4, 16, 1)
        self.project = nn.Conv2d(16, 8, 1)
        self.gn = nn.GroupNorm(4, 8)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchvision.ops import stochastic_depth

        x = F.silu(self.stem(x))
        h = F.silu(self.bn1(self.expand(x)))
        h = F.silu(self.dw(h))
        scale = torch.sigmoid(self.se_expand(F.silu(self.se_reduce(h.mean((2, 3), keepdim=True)))))
        h = self.project(h * scale)
        x = x + stochastic_depth(h, 0.2, "row", self.training)
        x = F.relu(self.grouped(F.relu(self.gn(x))))
        return self.fc(x.mean((2, 3)))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def se_block() -> SEBlock:
    from tests.compat.models import ensure_torchvision_ops

    ensure_torchvision_ops()  # torchvision's stochastic_depth (REFERENCE.md: its CUDA build here)
    torch.manual_seed(0)
    return SEBlock().eval()


class MHAEncoder(nn.Module):
    """Token ids → embedding → ``nn.MultiheadAttention`` (residual) → FFN → mean → classifier."""

    def __init__(self, vocab: int = 50, dim: int = 16, heads: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.fc1 = nn.Linear(dim, 32)
        self.fc2 = nn.Linear(32, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        h = h + self.fc2(F.gelu(self.fc1(h)))
        return self.head(h.mean(1))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.randint(0, 50, (batch, 6), generator=torch.Generator().manual_seed(0))


def mha_encoder() -> MHAEncoder:
    torch.manual_seed(0)
    return MHAEncoder().eval()


def tiny_bert() -> nn.Module:
    """BertForSequenceClassification: 2 layers, hidden 32, 4 heads, FFN 64."""
    from tests.compat.models import bert_classifier

    return bert_classifier(100, hidden=32, layers=2, heads=4, ffn=64, positions=32)


def tiny_vit() -> nn.Module:
    """timm ViT: 16 px, patch 8, 2 blocks, dim 32, 4 heads."""
    from tests.compat.models import ensure_torchvision_ops

    ensure_torchvision_ops()
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(
        img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5
    ).eval()


def token_batch(batch: int = 3, seq: int = 8, vocab: int = 100) -> dict[str, torch.Tensor]:
    """``input_ids`` with an ``attention_mask`` (row i has i padded positions at the end)."""
    ids = torch.randint(1, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, seq, dtype=torch.long)
    for i in range(batch):
        if i:
            mask[i, seq - i :] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


class ConvNormAct(nn.Module):
    """timm's wrapper: a convolution, its norm and activation; its forward hands its input on."""

    def __init__(self, cin: int, cout: int, k: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, padding=k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class CrossStage(nn.Module):
    """timm's ``CrossStage`` (cspresnet50, CSPDarkNet): expanded channels split in two at a size its code
    holds (``self.expand_chs // 2``); one half through the blocks, then both concatenated again."""

    def __init__(self, c: int):
        super().__init__()
        self.expand_chs = 2 * c
        self.conv_exp = ConvNormAct(c, 2 * c)
        self.blocks = nn.Sequential(ConvNormAct(c, c, 3), ConvNormAct(c, c))
        self.conv_transition = ConvNormAct(2 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_exp(x)
        xs, xb = x.split(self.expand_chs // 2, dim=1)
        xb = self.blocks(xb)
        return self.conv_transition(torch.cat([xs, xb], dim=1))


class LiteralCrossStage(CrossStage):
    """A ``CrossStage`` whose code splits at a number written in it: no attribute can follow."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_exp(x)
        xs, xb = x.split(8, dim=1)
        xb = self.blocks(xb)
        return self.conv_transition(torch.cat([xs, xb], dim=1))


class CspNet(nn.Module):
    def __init__(self, c: int = 8, classes: int = 5, stage: type = CrossStage):
        super().__init__()
        self.stem = ConvNormAct(3, c, 3)
        self.stages = nn.Sequential(stage(c), stage(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


def csp_net() -> CspNet:
    """Two CSP stages (``CrossStage``) wrapped in ``ConvNormAct`` layers, as timm's cspresnet50."""
    torch.manual_seed(0)
    return CspNet().eval()


def csp_net_literal() -> CspNet:
    """``csp_net`` whose stages split at a literal size (``LiteralCrossStage``)."""
    torch.manual_seed(0)
    return CspNet(stage=LiteralCrossStage).eval()
