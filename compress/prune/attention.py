"""Attention heads after structured pruning: the modules kept whole, and the head-count attributes
that follow the pruned projections.

Heads are found from the graph (``ptopt.compress.prune.layout``): a ``view`` that splits a
projection's channels into ``(heads, head_dim)`` and an attention that mixes each head's own
positions make the head a unit; q, k and v (and grouped-query kv heads) are tied by the attention op.
What the graph cannot say is which of the module's attributes hold the head count or the width
its ``forward`` uses (timm's ``reshape(B, N, 3, self.num_heads, self.head_dim)``, GPT-2's
``split(self.split_size)``): :func:`follow_heads` sets the attributes with those well-known names
whose value was the old count or a multiple of it (``HEAD_ATTRS``, ``WIDTH_ATTRS``: the width of all
heads, scaled), and the pruned model is
then checked against the unpruned one with the removed channels masked out
(``techniques/structured.py``), so an attribute missed shows up as an error, not as a wrong model.

``nn.MultiheadAttention`` is kept whole: its forward derives ``head_dim`` from ``embed_dim``, the
width of its *input*, so no head can go without changing the model's hidden size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: attributes that hold a number of heads (of the module that splits its projection into heads)
HEAD_ATTRS = (
    "num_heads",
    "n_heads",
    "n_head",
    "num_attention_heads",
    "num_key_value_heads",
    "num_kv_heads",
    "heads",
)
#: attributes that hold the width of all heads together (``heads * head_dim``)
WIDTH_ATTRS = (
    "all_head_size",
    "inner_dim",
    "attn_dim",
    "split_size",
    "val_attn_dim",
    "out_dim_projection",
    "out_dim_keys_values",
)


@dataclasses.dataclass(frozen=True)
class AttentionUnit:
    """A module kept whole (``kind == "whole"``), and why."""

    path: str
    kind: str = "whole"
    reason: str = ""


def attention_unit(path: str, module: Any) -> AttentionUnit | None:
    """The unit ``module`` is when it must be kept whole, else None."""
    import torch

    if isinstance(module, torch.nn.MultiheadAttention):
        return AttentionUnit(
            path,
            reason="nn.MultiheadAttention derives head_dim from embed_dim, the width of its input: "
            "its heads cannot be removed without changing the model's hidden size",
        )
    return None


def follow_heads(modules: dict[str, Any], splits: list[tuple[str, int, int, int]]) -> list[str]:
    """Set the head-count / width attributes of each module in ``splits`` (``(module path, stride,
    old count, new count)``: the module split channels into ``old count`` blocks of ``stride``, and
    ``new count`` are left). Returns what was changed (``path.attr: old → new``), for the report."""
    changes: dict[tuple[str, str], tuple[int, int]] = {}
    conflicts: set[tuple[str, str]] = set()
    for path, stride, old, new in splits:
        mod = modules.get(path)
        if mod is None or old == new:
            continue
        for attr in (*HEAD_ATTRS, *WIDTH_ATTRS):
            value = getattr(mod, attr, None)
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            if attr in HEAD_ATTRS and value != old:
                continue
            if attr in WIDTH_ATTRS and (value % old or value < old * stride // 4):
                continue  # a width is heads x (a per-head width: q/k and v may differ, as in LeViT)
            key, change = (path, attr), (value, value // old * new)
            if key in changes and changes[key] != change:
                conflicts.add(key)
            changes[key] = change
    done = []
    for (path, attr), (before, after) in changes.items():
        if (path, attr) not in conflicts:
            setattr(modules[path], attr, after)
            done.append(f"{path}.{attr}: {before} → {after}" if path else f"{attr}: {before} → {after}")
    return done


def joint_targets(graph: Any, keep: dict[int, Any], cls: str) -> dict[int, int] | None:
    """``group index -> units to keep`` for the width that modules of type ``cls`` read, so that each
    reads ``kept heads x head size`` channels: a forward that derives its head size from its input's
    width (``x.view(n, t, self.heads, d // self.heads)``, torchvision Swin's ``C // num_heads``) runs when
    its heads and the width it reads are cut together. ``keep``: ``group index -> kept units`` chosen so
    far. None when no such width is found, or two modules ask different sizes of one."""
    from ptopt.compress.prune.layers import inside_type
    from ptopt.compress.prune.layout import plain
    from ptopt.compress.prune.spaces import Use

    def groups_of(space: int, n: int) -> set[int]:
        return set(graph.resolve(Use(space, "", "", plain(0, n), n))[0].tolist()) - {-1}

    targets: dict[int, int] = {}
    for path, space, stride, count in graph.head_splits:
        if not path or not inside_type(graph.modules, path, cls):
            continue
        heads = groups_of(space, stride * count)
        if len(heads) != 1 or graph.all_groups[next(iter(heads))].units != count:
            continue  # not a split into heads (a fused qkv's three parts)
        (h,) = heads
        width = (len(keep[h]) if h in keep else count) * stride
        inside = [u for u in graph.uses if u.role == "in" and (u.module + ".").startswith(path + ".")]
        found = sorted({gi for u in inside for gi in groups_of(u.space, u.n)} - heads)
        reads = [(gi, graph.all_groups[gi]) for gi in found if graph.all_groups[gi].size == stride * count]
        if any(not grp.prunable or (width * grp.units) % grp.size for _, grp in reads):
            targets[h] = count  # a width that cannot follow (a layer kept): the heads stay
            continue
        for gi, grp in reads:
            if targets.setdefault(gi, width * grp.units // grp.size) != width * grp.units // grp.size:
                return None
    return targets or None
