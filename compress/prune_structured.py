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

The analysis is ``ptopt.compress.channel_graph``; this module ranks channels and rewrites the layers.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from ptopt.compress.channel_graph import _CONV_TYPES, ChannelGraph, ChannelGroup
from ptopt.compress.prune import StructuredPruneConfig, matches, register_pruner
from ptopt.core.errors import UnsupportedModelError

# -- pruning ---------------------------------------------------------------------------------------


def channel_importance(modules: dict[str, Any], group: ChannelGroup, criterion: str = "l1") -> Any:
    """One score per channel of the group: the sum over its producers of each filter's L1 or L2 norm."""
    import torch

    score = torch.zeros(group.size)
    for name in group.producers:
        w = modules[name].weight.detach().flatten(1)
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
    elif role == "depthwise":
        _slice_param(mod, "weight", 0, idx)
        _slice_param(mod, "bias", 0, idx)
        mod.in_channels = mod.out_channels = mod.groups = len(idx)
    elif role == "norm":
        for attr in ("weight", "bias", "running_mean", "running_var"):
            _slice_param(mod, attr, 0, idx)
        if kind == "LayerNorm":
            mod.normalized_shape = (len(idx),)
        else:
            mod.num_features = len(idx)


def structured_prune(
    model: Any,
    example_inputs: Any,
    amount: float,
    *,
    criterion: str = "l1",
    exclude: Iterable[str] = (),
    prune_first_last: bool = False,
    base_channels: dict[str, int] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Remove ``amount`` of the output channels of every prunable group; returns (new model, report).

    ``amount`` is a fraction of ``base_channels[layer]`` (the channels before the first of several
    gradual rounds) or of the current channels. The model is deep-copied; the result is the same
    module class with smaller layers, an ordinary dense nn.Module.
    """
    import torch

    from ptopt.core.inputspec import call_model

    model = copy.deepcopy(model).eval()
    graph = ChannelGraph(model, example_inputs)
    modules = graph.modules
    excluded = {n for n in modules if matches(n, exclude)}
    defaults: dict[str, str] = {}
    if not prune_first_last and graph.producer_order:
        # the first layer the model *runs* (an LSTM/GRU/Embedding before the first prunable layer
        # makes that one not the first), in execution order
        executed = weighted_layers_in_order(graph)
        first = graph.producer_order[0] if executed[:1] == graph.producer_order[:1] else None
        if first is not None:
            defaults[first] = (
                f"{first} is the first layer (excluded by default; --prune-first-last prunes it)"
            )
        linears = [n for n in graph.producer_order if type(modules[n]).__name__ == "Linear"]
        if linears and linears[-1] != first:
            defaults[linears[-1]] = f"{linears[-1]} is the last linear (excluded by default)"
    groups = graph.groups(excluded | set(defaults), defaults)
    if not any(g.prunable for g in groups):
        raise UnsupportedModelError(
            "structured pruning found no layer whose output channels can be removed: "
            + "; ".join(
                f"{', '.join(g.producers)}: {g.frozen[0]}" for g in groups if g.producers and g.frozen
            )[:600]
        )
    with torch.no_grad():
        ref = call_model(model, example_inputs)
    layers = _prune_groups(modules, groups, amount, criterion, base_channels)
    model = _runnable(model, graph, example_inputs, ref)
    order = {n: i for i, n in enumerate(graph.producer_order)}
    layers = dict(sorted(layers.items(), key=lambda kv: order.get(kv[0], len(order))))
    return model, {
        "layers": layers,
        "default_excluded": list(defaults),
        "groups": [
            {"layers": g.producers, "channels": g.size, "kept_reason": "; ".join(g.frozen) or None}
            for g in groups
            if g.producers
        ],
    }


def weighted_layers_in_order(graph: ChannelGraph) -> list[str]:
    """The modules with a weight matrix (conv, linear, recurrent, embedding) in the order the traced
    graph runs them."""
    import torch

    out = []
    for node in graph.gm.graph.nodes:
        if node.op != "call_module" or node.target in out:
            continue
        m = graph.modules[node.target]
        if isinstance(m, torch.nn.RNNBase) or any(p.dim() >= 2 for p in m.parameters(recurse=False)):
            out.append(node.target)
    return out


def _prune_groups(
    modules: dict[str, Any],
    groups: list[ChannelGroup],
    amount: float,
    criterion: str,
    base_channels: dict[str, int] | None,
) -> dict[str, dict[str, Any]]:
    """Rank each prunable group's channels and slice every layer that uses them; returns the
    per-layer table (channels before / after, the group, why a group was kept)."""
    import torch

    before = {n: _out_size(modules[n]) for g in groups for n in g.producers}
    layers: dict[str, dict[str, Any]] = {}
    for g in groups:
        for n in g.producers:
            layers[n] = {
                "channels_before": before[n],
                "channels_after": before[n],
                "group": g.producers,
                "kept_reason": "; ".join(g.frozen) or None,
            }
        if not g.prunable:
            continue
        base = max((base_channels or {}).get(n, g.size) for n in g.producers)
        n_keep = min(g.size, max(1, base - int(round(amount * base))))
        if n_keep >= g.size:
            continue
        score = channel_importance(modules, g, criterion)
        keep = torch.sort(torch.topk(score, n_keep).indices).values
        for name, role, inner in g.users:
            _apply(modules[name], role, _expand(keep, inner))
        for n in g.producers:
            layers[n]["channels_after"] = n_keep
    return layers


def _runnable(model: Any, graph: ChannelGraph, example_inputs: Any, ref: Any) -> Any:
    """The rewritten model, or its rewritten graph when the module's own forward cannot follow the
    new sizes (hard-coded shapes); UnsupportedModelError when neither runs."""
    import torch

    from ptopt.core.inputspec import call_model

    with torch.no_grad():
        try:
            out = call_model(model, example_inputs)
        except Exception:  # noqa: BLE001 - e.g. a forward with hard-coded sizes
            out = None
        if out is not None and getattr(out, "shape", None) == getattr(ref, "shape", None):
            return model
        gm = graph.rewrite_flattens()
        try:
            call_model(gm, example_inputs)
        except Exception as e:  # noqa: BLE001
            raise UnsupportedModelError(f"structured pruning: the pruned model does not run: {e}") from None
        return gm.eval()


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
