"""Structured pruning: remove whole output channels and rewrite the model so it is physically smaller.

The channel dependencies are read from the model's own graph (``torch.fx`` trace + shape
propagation), not from per-architecture code:

- a conv (groups=1) or linear *produces* a new channel space (its output channels);
- the next conv / linear *consumes* it (input slice), BatchNorm / LayerNorm slice their parameters;
- a depthwise conv (groups = channels) keeps the channel space: it is pruned with its producer;
- ``a + b`` (and other elementwise ops) joins the channel spaces of a and b: they are pruned together,
  as one group with one shared ranking (residual connections);
- flatten / view folds channels into features: the following linear's inputs are expanded
  (channel c → features c·S … c·S+S-1);
- channels that reach the model's output (classifier outputs) or the input, or meet a parameter
  directly, or are concatenated, are never pruned.

An op the analysis does not know that touches prunable channels is an error naming the op and the
layer: the user can ``--exclude`` that layer. Every group keeps at least one channel.

The analysis is ``ptopt.compress.prune.channel_graph``; this module ranks channels and rewrites the layers.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from typing import Any

from ptopt.compress.prune.channel_graph import _CONV_TYPES, ChannelGraph, ChannelGroup
from ptopt.compress.prune.config import PruneWarning, StructuredPruneConfig, matches
from ptopt.compress.prune.registry import register_pruner
from ptopt.core.errors import UnsupportedModelError

# -- pruning ---------------------------------------------------------------------------------------

#: which graph the channel analysis reads: ``auto`` tries torch.fx first (milliseconds) and falls
#: back to torch.export's ATen graph (seconds) when fx cannot trace the model or meets an op it does
#: not know; ``fx`` / ``export`` force one
GRAPHS = ("auto", "fx", "export")


def channel_importance(modules: dict[str, Any], group: ChannelGroup, criterion: str = "l1") -> Any:
    """One score per channel of the group: the sum over its producing rows (every ``out`` use: a
    layer's filters, or the q, k and v rows of a fused projection) of each row's L1 or L2 norm."""
    import torch

    score = torch.zeros(group.size)
    for name, role, _, offset in group.users:
        if role != "out":
            continue
        w = modules[name].weight.detach()[offset : offset + group.size].flatten(1)
        score += w.abs().sum(1) if criterion == "l1" else w.pow(2).sum(1).sqrt()
    return score


def _expand(keep: Any, inner: int) -> Any:
    import torch

    if inner == 1:
        return keep
    return (keep[:, None] * inner + torch.arange(inner)[None, :]).flatten()


def _slice_param(mod: Any, attr: str, dim: int, idx: Any) -> None:
    import torch

    t = getattr(mod, attr, None)
    if t is None:
        return
    new = t.detach().index_select(dim, idx).clone()
    if isinstance(t, torch.nn.Parameter):
        setattr(mod, attr, torch.nn.Parameter(new, requires_grad=t.requires_grad))
    else:
        setattr(mod, attr, new)


def _dim_size(mod: Any, role: str) -> int:
    """Length of the dimension ``role`` slices (before slicing)."""
    if role == "in":
        return mod.weight.shape[1]
    t = mod.weight if getattr(mod, "weight", None) is not None else mod.running_mean
    return t.shape[0]


def _apply(mod: Any, role: str, idx: Any) -> None:
    kind = type(mod).__name__
    if role == "out":
        _slice_param(mod, "weight", 0, idx)
        _slice_param(mod, "bias", 0, idx)
        if kind == "Linear":
            mod.out_features = len(idx)
        else:
            mod.out_channels = len(idx)
    elif role == "in":
        _slice_param(mod, "weight", 1, idx)
        if kind == "Linear":
            mod.in_features = len(idx)
        else:
            mod.in_channels = len(idx)
    elif role in ("depthwise", "grouped"):
        per_group = mod.in_channels // mod.groups
        _slice_param(mod, "weight", 0, idx)
        _slice_param(mod, "bias", 0, idx)
        mod.in_channels = mod.out_channels = len(idx)
        mod.groups = len(idx) // per_group
    elif role == "norm":
        for attr in ("weight", "bias", "running_mean", "running_var"):
            _slice_param(mod, attr, 0, idx)
        if kind == "LayerNorm":
            mod.normalized_shape = (len(idx),)
        elif kind == "GroupNorm":
            mod.num_groups = len(idx) // (mod.num_channels // mod.num_groups)
            mod.num_channels = len(idx)
        else:
            mod.num_features = len(idx)


def analyse(
    model: Any,
    example_inputs: Any,
    exclude: Iterable[str] = (),
    prune_first_last: bool = False,
    graph: str = "auto",
) -> tuple[Any, list[ChannelGroup], dict[str, str]]:
    """(channel graph, its groups, default exclusions with their reasons) of ``model``.

    ``graph="auto"``: the torch.fx analysis when it traces the model and knows every op; else the
    ATen graph of ``torch.export`` (``ptopt.compress.prune.graph``), which also captures models fx
    cannot trace and knows attention heads. An UnsupportedModelError names why neither works.
    """
    from ptopt.compress.prune.graph import ATenChannelGraph

    kinds = {"fx": [ChannelGraph], "export": [ATenChannelGraph], "auto": [ChannelGraph, ATenChannelGraph]}
    errors: list[UnsupportedModelError] = []
    found = None
    for cls in kinds[graph]:
        try:
            g = cls(model, example_inputs)
            defaults = _default_excluded(g, prune_first_last)
            excluded = {n for n in g.modules if matches(n, exclude)}
            found = (g, g.groups(excluded | set(defaults), defaults), defaults)
        except UnsupportedModelError as e:
            errors.append(e)
            continue
        if any(grp.prunable for grp in found[1]):
            return found  # else the next graph may see more (fx sees a fused attention op as one module)
    if found is not None:
        return found
    fx, ep = (getattr(e, "capture_reason", None) for e in (errors + errors)[:2])
    if len(errors) == 2 and fx and ep:
        raise UnsupportedModelError(
            f"structured pruning needs the model's graph, but torch.fx cannot trace "
            f"{type(model).__name__} ({fx}) and torch.export cannot capture it ({ep}); "
            "l1-unstructured and global pruning need no graph"
        )
    raise errors[-1]


def _default_excluded(graph: Any, prune_first_last: bool) -> dict[str, str]:
    """The first layer the model *runs* (an LSTM/GRU/Embedding before the first prunable layer
    makes that one not the first) and the last linear, with the reason each is kept."""
    defaults: dict[str, str] = {}
    if prune_first_last or not graph.producer_order:
        return defaults
    executed = graph.executed_layers()
    first = graph.producer_order[0] if executed[:1] == graph.producer_order[:1] else None
    if first is not None:
        defaults[first] = f"{first} is the first layer (excluded by default; --prune-first-last prunes it)"
    linears = [n for n in graph.producer_order if type(graph.modules[n]).__name__ == "Linear"]
    if linears and linears[-1] != first:
        defaults[linears[-1]] = f"{linears[-1]} is the last linear (excluded by default)"
    return defaults


def structured_prune(
    model: Any,
    example_inputs: Any,
    amount: float,
    *,
    criterion: str = "l1",
    exclude: Iterable[str] = (),
    prune_first_last: bool = False,
    base_channels: dict[str, int] | None = None,
    graph: str = "auto",
) -> tuple[Any, dict[str, Any]]:
    """Remove ``amount`` of the output channels of every prunable group; returns (new model, report).

    ``amount`` is a fraction of ``base_channels[layer]`` (the channels before the first of several
    gradual rounds) or of the current channels; attention heads and GroupNorm groups go whole. The
    model is deep-copied; the result is the same module class with smaller layers (and fewer heads),
    an ordinary dense nn.Module. ``graph``: see :data:`GRAPHS`.
    """
    import torch

    from ptopt.core.inputspec import call_model

    model = copy.deepcopy(model).eval()
    g, groups, defaults = analyse(model, example_inputs, exclude, prune_first_last, graph)
    modules = g.modules
    if not any(grp.prunable for grp in groups):
        why = [
            f"{', '.join(grp.producers)}: {grp.frozen[0]}" for grp in groups if grp.producers and grp.frozen
        ]
        why = why + list(g.notes) or [
            "the model has no conv or linear layer whose outputs another layer reads"
        ]
        raise UnsupportedModelError(
            "structured pruning found no layer whose output channels can be removed: "
            + "; ".join(why)[:600]
            + " (use --method global or l1-unstructured: they zero weights and need no graph)"
        )
    for note in g.notes:
        warnings.warn(note, PruneWarning, stacklevel=2)
    with torch.no_grad():
        ref = call_model(model, example_inputs)
    layers = _prune_groups(modules, groups, amount, criterion, base_channels)
    model = _runnable(model, g, example_inputs, ref)
    order = {n: i for i, n in enumerate(g.producer_order)}
    layers = dict(sorted(layers.items(), key=lambda kv: order.get(kv[0], len(order))))
    return model, {
        "layers": layers,
        "default_excluded": list(defaults),
        "graph": g.kind,
        "notes": list(g.notes),
        "groups": [
            {"layers": grp.producers, "channels": grp.size, "kept_reason": "; ".join(grp.frozen) or None}
            for grp in groups
            if grp.producers
        ],
    }


def _keep(modules: dict[str, Any], g: ChannelGroup, amount: float, criterion: str, base: dict) -> Any:
    """The channels of ``g`` to keep (whole blocks), or None when none go."""
    import torch

    # the group's size when the first round started: a producer's base output size, scaled to
    # the part of its rows this group owns (a fused q/k/v projection owns a third per group)
    start = max(base.get(n, _out_size(modules[n])) * g.size // _out_size(modules[n]) for n in g.producers)
    blocks, base_blocks = g.size // g.block, max(1, start // g.block)
    n_keep = min(blocks, max(1, base_blocks - int(round(amount * base_blocks))))
    if n_keep >= blocks:
        return None
    score = channel_importance(modules, g, criterion).view(blocks, g.block).sum(1)
    return _expand(torch.sort(torch.topk(score, n_keep).indices).values, g.block)


def _prune_groups(
    modules: dict[str, Any],
    groups: list[ChannelGroup],
    amount: float,
    criterion: str,
    base_channels: dict[str, int] | None,
) -> dict[str, dict[str, Any]]:
    """Rank each prunable group's channels and slice every layer that uses them (each layer's
    dimension once, from the kept channels of every group with a part in it); returns the per-layer
    table (channels before / after, the group, why a group was kept)."""
    import torch

    from ptopt.compress.prune.attention import set_count

    layers: dict[str, dict[str, Any]] = {}
    cuts: dict[tuple[str, str], list[tuple[int, int, int, Any]]] = {}
    counts: list[tuple[ChannelGroup, int]] = []
    for g in groups:
        for n in g.producers:
            layers[n] = {
                "channels_before": _out_size(modules[n]),
                "group": g.producers,
                "kept_reason": "; ".join(g.frozen) or None,
            }
        keep = _keep(modules, g, amount, criterion, base_channels or {}) if g.prunable else None
        if keep is None:
            continue
        counts.append((g, len(keep) // g.block))
        for name, role, inner, offset in g.users:
            cuts.setdefault((name, role), []).append((offset, inner, g.size, keep))
    for (name, role), parts in cuts.items():
        mask = torch.ones(_dim_size(modules[name], role), dtype=torch.bool)
        for offset, inner, size, keep in parts:
            mask[offset * inner : (offset + size) * inner] = False
            mask[offset * inner + _expand(keep, inner)] = True
        _apply(modules[name], role, mask.nonzero().flatten())
    for g, count in counts:
        for module, kind in g.updates:
            set_count(modules[module], kind, count)
    for n, row in layers.items():
        row["channels_after"] = _out_size(modules[n])
    return layers


def _runnable(model: Any, graph: Any, example_inputs: Any, ref: Any) -> Any:
    """The rewritten model, or its rewritten graph when the module's own forward cannot follow the
    new sizes (hard-coded shapes); UnsupportedModelError when neither runs."""
    import torch

    from ptopt.core.inputspec import call_model

    with torch.no_grad():
        try:
            out = call_model(model, example_inputs)
        except Exception:  # noqa: BLE001 - e.g. a forward with hard-coded sizes
            out = None
        if out is not None and _same_shapes(out, ref):
            return model
        gm = graph.rewrite_flattens()
        try:
            call_model(gm, example_inputs)
        except Exception as e:  # noqa: BLE001
            raise UnsupportedModelError(f"structured pruning: the pruned model does not run: {e}") from None
        return gm.eval()


def _same_shapes(out: Any, ref: Any) -> bool:
    """The pruned model's outputs have the shapes of the original's (tensors, tuples, dicts and
    Hugging Face ModelOutputs alike)."""
    import torch

    a = torch.utils._pytree.tree_leaves(out)
    b = torch.utils._pytree.tree_leaves(ref)
    shapes = [tuple(getattr(t, "shape", ())) for t in a], [tuple(getattr(t, "shape", ())) for t in b]
    return len(a) == len(b) and shapes[0] == shapes[1]


def _out_size(mod: Any) -> int:
    return mod.out_features if hasattr(mod, "out_features") else mod.out_channels


def output_channels(model: Any) -> dict[str, int]:
    """Output channels / features of every conv and linear, by name."""
    return {
        n: _out_size(m)
        for n, m in model.named_modules()
        if type(m).__name__ in _CONV_TYPES or type(m).__name__ == "Linear"
    }


@register_pruner(StructuredPruneConfig)
class StructuredPruner:
    """Each round removes channels down to ``(1 - amount_k)`` of the channels the model started with."""

    precision = "fp32"

    def __init__(self, config: StructuredPruneConfig, model: Any, example_inputs: Any):
        self.config = config
        self.example_inputs = example_inputs
        self.base = output_channels(model)
        self.report: dict[str, Any] = {}

    def step(self, model: Any, amount: float) -> Any:
        c = self.config
        model, self.report = structured_prune(
            model,
            self.example_inputs,
            amount,
            criterion=c.criterion,
            exclude=c.exclude,
            prune_first_last=c.prune_first_last,
            base_channels=self.base,
        )
        return model

    def finish(self, model: Any) -> tuple[Any, dict[str, Any]]:
        layers = self.report.get("layers", {})
        after = output_channels(model)
        rows = []
        for name, info in layers.items():
            rows.append(
                {
                    "layer": name,
                    "channels_before": self.base.get(name, info["channels_before"]),
                    "channels_after": after.get(name, info["channels_after"]),
                    "pruned_with": [n for n in info["group"] if n != name],
                    "kept_reason": info["kept_reason"],
                }
            )
        return model, {
            "layers": rows,
            "groups": self.report.get("groups", []),
            "default_excluded": self.report.get("default_excluded", []),
        }
