"""Attention heads for structured pruning: the attention modules users have, recognised by what they
hold (not by their class name), and how their head count follows the pruned projections.

A head is ``head_dim`` consecutive output rows of each of q, k and v (three blocks of one fused
``qkv`` linear) and the same ``head_dim`` input columns of the output projection: removing head h
removes exactly its terms from the attention output. The module's own forward then runs with fewer
heads once its head-count attributes say so (``set_count``):

- Hugging Face self-attention (BERT, RoBERTa, ... : ``query``/``key``/``value`` linears,
  ``num_attention_heads``, ``attention_head_size``, ``all_head_size``); its output projection is
  the next module's (``BertSelfOutput.dense``), which the graph analysis finds by itself;
- timm ``Attention`` (``qkv`` and ``proj`` linears, ``num_heads``, ``head_dim``, ``attn_dim``);
- ``nn.MultiheadAttention`` is kept whole: its forward derives ``head_dim`` from ``embed_dim``, the
  width of its *input*, so no head can go without changing the model's hidden size.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class AttentionUnit:
    """One attention module as the channel analysis sees it (names are full module paths)."""

    path: str
    kind: str  # hf | timm | whole
    heads: int = 0
    head_dim: int = 0
    #: projections reading the unit's input (q, k, v or the fused qkv)
    inputs: tuple[str, ...] = ()
    #: (projection, row offset) of every q/k/v block: each holds ``heads * head_dim`` rows
    rows: tuple[tuple[str, int], ...] = ()
    #: the output projection inside the unit (timm ``proj``); None: the context leaves the unit
    output: str | None = None
    #: why the unit is kept whole (``kind == "whole"``)
    reason: str = ""

    @property
    def width(self) -> int:
        return self.heads * self.head_dim


def _linear(m: Any) -> bool:
    import torch

    return isinstance(m, torch.nn.Linear)


def attention_unit(path: str, module: Any) -> AttentionUnit | None:
    """The attention unit ``module`` is, or None when it is no attention module ptopt knows."""
    import torch

    if isinstance(module, torch.nn.MultiheadAttention):
        return AttentionUnit(
            path,
            "whole",
            reason="nn.MultiheadAttention derives head_dim from embed_dim, the width of its input: "
            "its heads cannot be removed without changing the model's hidden size",
        )
    names = ("query", "key", "value", "num_attention_heads", "attention_head_size", "all_head_size")
    if all(hasattr(module, n) for n in names) and all(_linear(getattr(module, n)) for n in names[:3]):
        heads, hd = int(module.num_attention_heads), int(module.attention_head_size)
        if any(getattr(module, n).out_features != heads * hd for n in names[:3]):
            return None
        qkv = tuple(f"{path}.{n}" if path else n for n in names[:3])
        return AttentionUnit(path, "hf", heads, hd, qkv, tuple((n, 0) for n in qkv))
    return _timm_unit(path, module)


def _timm_unit(path: str, module: Any) -> AttentionUnit | None:
    import torch

    names = ("qkv", "proj", "num_heads", "head_dim")
    if not all(hasattr(module, n) for n in names) or not (_linear(module.qkv) and _linear(module.proj)):
        return None
    heads, hd = int(module.num_heads), int(module.head_dim)
    width = heads * hd
    if module.qkv.out_features != 3 * width or module.proj.in_features != width:
        return None
    full = f"{path}." if path else ""
    whole = None
    if not hasattr(module, "attn_dim"):
        whole = "its forward reshapes the heads back to the input width"
    elif getattr(module, "gate", None) is not None or not isinstance(
        getattr(module, "norm", torch.nn.Identity()), torch.nn.Identity
    ):
        whole = "it has a gate or a norm over all heads"
    if whole:
        return AttentionUnit(path, "whole", reason=whole)
    qkv = full + "qkv"
    rows = ((qkv, 0), (qkv, width), (qkv, 2 * width))
    return AttentionUnit(path, "timm", heads, hd, (qkv,), rows, output=full + "proj")


def set_count(module: Any, kind: str, count: int) -> None:
    """After pruning: ``module`` (an attention unit of ``kind``) now has ``count`` heads."""
    if kind == "hf":
        module.num_attention_heads = count
        module.all_head_size = count * module.attention_head_size
    elif kind == "timm":
        module.num_heads = count
        module.attn_dim = count * module.head_dim
    else:
        raise ValueError(f"unknown attention kind {kind!r}")
