"""Structured pruning: remove whole output channels and rewrite the model so it is physically smaller.

The channel dependencies are read from the model's own graph (``ptopt.compress.prune.channel_graph``:
torch.fx first, torch.export's ATen graph when fx cannot trace the model or sees less), not from
per-architecture code: a conv / linear produces channels, the layers reading them lose the matching
inputs, norms their entries; residual adds and gates tie channels into one group with one ranking;
flatten / view fold channels into features; attention heads and GroupNorm / conv groups go whole;
channels that reach the model output, meet a tensor no layer made, or reach an op the rules do not
follow are kept (named) and the rest is pruned. Every group keeps at least one unit.

This module ranks each group's units (L1 / L2 norm of the rows that produce them), cuts every
dimension that holds them, sets the head counts that follow (``attention.follow_heads``), and checks
the result: the pruned model must compute what the unpruned one computes with the removed channels
zeroed where layers read them (exact wherever no LayerNorm normalises over pruned channels).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from typing import Any

from ptopt.compress.prune import layers as L
from ptopt.compress.prune.channel_graph import ChannelGraph, ChannelGroup
from ptopt.compress.prune.config import PruneWarning, StructuredPruneConfig, matches
from ptopt.compress.prune.registry import register_pruner
from ptopt.core.errors import UnsupportedModelError

# -- pruning ---------------------------------------------------------------------------------------

#: which graph the channel analysis reads: ``auto`` tries torch.fx first (milliseconds) and falls
#: back to torch.export's ATen graph (seconds) when fx cannot trace the model or sees fewer
#: prunable groups; ``fx`` / ``export`` force one
GRAPHS = ("auto", "fx", "export")


def analyse(
    model: Any,
    example_inputs: Any,
    exclude: Iterable[str] = (),
    prune_first_last: bool = False,
    graph: str = "auto",
    whole: dict[str, str] | None = None,
    kept: dict[str, str] | None = None,
    hidden: bool = False,
    heads: dict[str, str] | None = None,
) -> tuple[Any, list[ChannelGroup], dict[str, str]]:
    """(channel graph, its groups, default exclusions with their reasons) of ``model``.

    ``graph="auto"``: the torch.fx analysis when it traces the model and follows every op; else
    (or when it finds nothing to prune) also the ATen graph of ``torch.export``
    (``ptopt.compress.prune.graph``), and the one that can prune more layers. An
    UnsupportedModelError names why neither works. ``whole``: module types kept whole (type name
    -> why; ``"*"``: every module that splits channels into heads); ``heads``: module types that keep
    only their attention heads (type name -> why; their other channels, a feed-forward's, go).
    ``kept``: layers that keep their output channels (name -> why), as excluded ones do. ``hidden``:
    embedding tables produce channels, so the residual stream they start (the hidden size) is one
    group, pruned where it reaches the output too.
    """
    from ptopt.compress.prune.graph import ATenChannelGraph

    kinds = {"fx": [ChannelGraph], "export": [ATenChannelGraph], "auto": [ChannelGraph, ATenChannelGraph]}
    errors: list[UnsupportedModelError] = []
    found: list[tuple[Any, list[ChannelGroup], dict[str, str]]] = []
    for cls in kinds[graph]:
        try:
            g = cls(model, example_inputs, hidden=hidden)
        except UnsupportedModelError as e:
            errors.append(e)
            continue
        defaults = _default_excluded(g, prune_first_last)
        excluded = {n for n in g.modules if matches(n, exclude)}
        reasons = {**defaults, **(kept or {})}
        found.append((g, g.groups(excluded | set(reasons), reasons, whole or {}, heads or {}), defaults))
        if _prunable_layers(found[-1][1]) and not g.kept_by_op:
            break  # fx saw everything (and is ~10-100x faster than export)
    if found:
        return max(found, key=lambda f: _prunable_layers(f[1]))
    fx, ep = (getattr(e, "capture_reason", None) for e in (errors + errors)[:2])
    if len(errors) == 2 and fx and ep:
        raise UnsupportedModelError(
            f"structured pruning needs the model's graph, but torch.fx cannot trace "
            f"{type(model).__name__} ({fx}) and torch.export cannot capture it ({ep}); "
            "l1-unstructured and global pruning need no graph"
        )
    raise errors[-1]


def _prunable_layers(groups: list[ChannelGroup]) -> int:
    return len({n for g in groups if g.prunable for n in g.producers})


def _default_excluded(graph: Any, prune_first_last: bool) -> dict[str, str]:
    """The first layer the model *runs* (an LSTM/GRU/Embedding before the first prunable layer
    makes that one not the first) and the last linear, with the reason each is kept."""
    defaults: dict[str, str] = {}
    if prune_first_last or not graph.producer_order:
        return defaults
    executed = graph.executed_layers()
    first = graph.producer_order[0] if executed[:1] == graph.producer_order[:1] else None
    if first is not None and L.kind(graph.modules[first]) == "embedding":
        first = None  # the hidden size: --no-prune-hidden keeps it
    if first is not None:
        defaults[first] = f"{first} is the first layer (excluded by default; --prune-first-last prunes it)"
    linears = [n for n in graph.producer_order if L.kind(graph.modules[n]) in ("linear", "conv1d_t")]
    # a base model's last projection makes the hidden size (pruned with it, its output too)
    hidden = bool(linears) and graph._hidden_stream(graph.space_of(linears[-1]))
    if linears and linears[-1] != first and not hidden:
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
    describable: bool = False,
    hidden: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Remove ``amount`` of the output channels of every prunable group; returns (new model, report).

    ``amount`` is a fraction of ``base_channels[layer]`` (the channels before the first of several
    gradual rounds) or of the current channels; attention heads and GroupNorm / conv groups go
    whole. The model is deep-copied; the result is the same module class with smaller layers (and
    fewer heads, its head-count attributes set), an ordinary dense nn.Module; a Hugging Face
    model's config says its new sizes when it can (``describable``: it must, see ``_hf_config``).
    ``graph``: see :data:`GRAPHS`. A causal LM runs without its key/value cache meanwhile. ``hidden``:
    also prune a transformer's hidden size (the residual stream its embeddings start: embeddings,
    every block's input and output projections, norms, a tied output head) as one group.
    """
    settings = dict(criterion=criterion, exclude=exclude, prune_first_last=prune_first_last,
                    base_channels=base_channels or {}, graph=graph, describable=describable,
                    hidden=hidden)  # fmt: skip
    whole: dict[str, str] = {}
    settings["kept"], settings["heads"], settings["joint"], settings["joint_tried"] = {}, {}, {}, set()
    from ptopt.compress.prune.hf_config import no_cache

    for _ in range(MAX_RETRIES):
        try:
            with no_cache(model):
                return _prune_once(model, example_inputs, amount, whole, settings)
        except _KeepLayers as e:
            if set(e.layers) <= set(settings["kept"]):
                raise UnsupportedModelError(f"structured pruning: {next(iter(e.layers.values()))}") from None
            settings["kept"].update(e.layers)
        except _KeepWhole as e:
            if e.cls in whole:
                raise UnsupportedModelError(f"structured pruning: {e.reason}") from None
            if e.heads_inside and e.cls not in settings["joint_tried"]:
                settings["joint"][e.cls] = e.reason  # first heads and width together (d // heads)
                settings["joint_tried"].add(e.cls)
            elif e.heads_inside:  # then its heads alone: its feed-forward may still lose channels
                settings["joint"].pop(e.cls, None)
                settings["heads"][e.cls] = e.reason
            elif e.hidden_cut:  # then the hidden size (a forward that derives sizes from its input's width)
                settings["hidden"], settings["hidden_kept"] = False, f"{e.cls}: {e.reason}"
                settings["heads"].pop(e.cls, None)  # with the width kept, its heads may go again
                settings["joint"].pop(e.cls, None)
                settings["joint_tried"].discard(e.cls)
            else:  # whole supersedes its heads' and width's steps (one note)
                whole[e.cls] = e.reason
                settings["heads"].pop(e.cls, None)
                settings["joint"].pop(e.cls, None)
    kept = [*whole, *settings["heads"], *(["the hidden size"] if settings.get("hidden_kept") else [])]
    raise UnsupportedModelError(
        f"structured pruning: no runnable pruned model after {MAX_RETRIES} tries (kept: {', '.join(kept)})"
    )


#: prunings tried, each cutting a module type's heads and width together, keeping its heads, the hidden
#: size, or the type whole (one whose forward cannot follow)
MAX_RETRIES = 10


class _KeepWhole(Exception):
    """The pruned model does not run (or compute what it should) because modules of type ``cls``
    read a size ptopt cannot change (``"*"``: some attention module): prune again keeping them."""

    def __init__(self, cls: str, reason: str):
        super().__init__(reason)
        self.cls, self.reason = cls, reason
        #: heads were removed inside modules of type ``cls`` and they were not yet kept: keep those first
        self.heads_inside = False
        #: the hidden size was pruned: keep it next
        self.hidden_cut = False


def _kept_whole(cls: str) -> str:
    """How a module type kept whole is named to the user (``"*"``: every module splitting into heads)."""
    return "every attention module keeps its heads" if cls == "*" else f"{cls} kept whole"


class _KeepLayers(Exception):
    """The pruned model's Hugging Face config cannot say these layers' new sizes (name -> why):
    prune again keeping their output channels."""

    def __init__(self, layers: dict[str, str]):
        super().__init__(next(iter(layers.values())))
        self.layers = layers


def _prune_once(model: Any, example_inputs: Any, amount: float, whole: dict[str, str], settings: dict) -> Any:
    import torch

    from ptopt.core.inputspec import call_model

    cache = getattr(getattr(model, "config", None), "use_cache", None)
    model = copy.deepcopy(model).eval()
    g, groups, defaults = analyse(
        model,
        example_inputs,
        settings["exclude"],
        settings["prune_first_last"],
        settings["graph"],
        whole,
        settings["kept"],
        settings.get("hidden", False),
        settings.get("heads"),
    )
    _refuse_if_nothing(g, groups, whole, settings.get("heads", {}), settings.get("describable", False))
    notes = [
        *g.notes,
        *(f"{_kept_whole(cls)}: {why}" for cls, why in whole.items()),
        *(f"{cls} keeps its attention heads: {why}" for cls, why in settings.get("heads", {}).items()),
        *([f"the hidden size kept: {settings['hidden_kept']}"] if settings.get("hidden_kept") else []),
        *filter(None, [g.kept_note()]),
    ]
    keep = _choose(g, groups, amount, settings["criterion"], settings["base_channels"])
    keep = _joint(g, groups, keep, amount, settings, notes)
    kept = _lookup(keep)
    masks = _masks(g, kept)
    before = L.output_channels(model)
    norms = _checked_norms(g, keep, kept)
    with torch.no_grad(), _KeptNorms(model, norms or {}) as hooked:
        _zero_inputs(g.modules, g.uses, masks)
        masked = _narrow_outputs(g, kept, call_model(model, example_inputs), notes)
    shared = _shared_parameters(model)
    _cut(g.modules, g.uses, masks)
    _tie_again(model, shared)
    heads, splits = _follow_heads(g, kept)
    heads += _hf_config(model, splits, before, settings.get("describable", False))
    try:
        model, out = _runnable_following(model, g, kept, example_inputs, masked, heads)
    except _KeepWhole as e:
        e.heads_inside = e.cls not in settings.get("heads", {}) and _heads_cut_in(g, splits, e.cls)
        e.hidden_cut = bool(settings.get("hidden")) and _hidden_cut(g, keep)
        raise
    inexact = any(grp.inexact and i in keep for i, grp in enumerate(g.all_groups))
    exact = not inexact or (norms is not None and hooked.ran)
    if exact:
        _check(out, masked, heads, g)
    for note in notes:
        warnings.warn(note, PruneWarning, stacklevel=3)
    if cache:  # the copy was made without the cache (``no_cache``): it generates with it again
        model.config.use_cache = cache
    return model, _report(g, groups, defaults, before, heads, notes, exact)


def _checked_norms(g: Any, keep: dict[int, Any], kept: dict[int, Any]) -> dict[str, Any] | None:
    """``module -> kept positions`` of every norm over channels that lose some, when each is a leaf
    module over the last dim of a hidden-size group: any norm of a stream an embedding makes (LayerNorm,
    RMSNorm, T5's and Llama's RMSNorm); of one a patch-embedding conv or a Linear makes (Swin's), a
    ``_last_dim_norm``. The check then runs them on the kept channels alone (``_KeptNorms``) and stays
    exact. None when some norm cannot be run so (the pruned model is then not checked)."""
    from ptopt.compress.prune.channel_graph import Use

    out: dict[str, Any] = {}
    for i, grp in enumerate(g.all_groups):
        if not (grp.inexact and i in keep):
            continue
        if not g.hidden:
            return None
        text = any(L.kind(g.modules.get(p)) == "embedding" for p in grp.producers)
        for module, space, n, digits in grp.norms:
            if module is None or not (text or _last_dim_norm(g.modules.get(module))):
                return None
            out[module] = _alive(g, kept, Use(space, "", "", digits, n))
    return out


def _last_dim_norm(module: Any) -> bool:
    """A norm whose forward surely normalizes the last dimension: ``nn.LayerNorm``'s own forward (not a
    subclass's, such as timm's channels-first ``LayerNorm2d``) or ``nn.RMSNorm``'s."""
    from torch import nn

    forward = type(module).forward
    return forward is nn.LayerNorm.forward or forward is getattr(nn, "RMSNorm", nn.LayerNorm).forward


class _KeptNorms:
    """While the unpruned model runs for the check, each norm in ``norms`` (module -> kept positions)
    normalises its kept channels alone, as its pruned twin does; the removed ones come out zero.
    ``ran``: every hooked norm saw inputs of its width (else the check is not exact)."""

    def __init__(self, model: Any, norms: dict[str, Any]):
        self.model, self.norms, self.handles, self.ran = model, norms, [], True

    def __enter__(self) -> _KeptNorms:
        for name, alive in self.norms.items():
            mod = self.model.get_submodule(name)
            twin = copy.deepcopy(mod)
            idx = alive.nonzero().flatten()
            for attr, t in [*twin.named_parameters(recurse=False), *twin.named_buffers(recurse=False)]:
                if t.dim() == 1 and t.shape[0] == len(alive):
                    L.slice_param(twin, attr, 0, idx)
            if hasattr(twin, "normalized_shape"):
                twin.normalized_shape = (len(idx),)
            self.handles.append(mod.register_forward_hook(self._hook(twin, alive)))
        return self

    def _hook(self, twin: Any, alive: Any) -> Any:
        def hook(mod: Any, args: tuple, out: Any) -> Any:
            x = args[0] if args else None
            if getattr(x, "shape", (0,))[-1:] != (len(alive),) or getattr(out, "shape", None) != x.shape:
                self.ran = False
                return None
            result = out.new_zeros(out.shape)
            result[..., alive] = twin(x[..., alive]).to(out.dtype)
            return result

        return hook

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()


def _narrow_outputs(g: Any, kept: dict[int, Any], out: Any, notes: list[str]) -> Any:
    """``out`` with the pruned hidden channels taken out of every output that carries the hidden size
    (a base model's ``last_hidden_state``): the shapes and values the pruned model must give."""
    import torch

    from ptopt.compress.prune.channel_graph import Use

    leaves, spec = torch.utils._pytree.tree_flatten(out)
    infos = g.output_infos
    if len(infos) != len(leaves) or not any(infos):
        return out
    narrowed = []
    for leaf, info in zip(leaves, infos, strict=True):
        if info is not None and isinstance(leaf, torch.Tensor) and len(info.digits) == 1:
            d = info.digits[0]
            alive = _alive(g, kept, Use(info.space, "", "", info.digits, leaf.shape[d.dim]))
            if not bool(alive.all()):
                note = (f"the model's output is narrower: its hidden size {leaf.shape[d.dim]} → "
                        f"{int(alive.sum())} (--no-prune-hidden keeps it)")  # fmt: skip
                if note not in notes:
                    notes.append(note)
                leaf = leaf.index_select(d.dim, alive.nonzero().flatten())
        narrowed.append(leaf)
    return torch.utils._pytree.tree_unflatten(narrowed, spec)


def _shared_parameters(model: Any) -> list[tuple[Any, list[tuple[Any, str]]]]:
    """Every parameter two or more modules hold (a tied embedding and output head, T5's ``shared``
    table and its encoder's), with its (module, attribute) holders."""
    holders: dict[int, tuple[Any, list[tuple[Any, str]]]] = {}
    for mod in model.modules():
        for attr, p in mod.named_parameters(recurse=False):
            holders.setdefault(id(p), (p, []))[1].append((mod, attr))
    return [h for h in holders.values() if len(h[1]) > 1]


def _tie_again(model: Any, shared: list[tuple[Any, list[tuple[Any, str]]]]) -> None:
    """Tied parameters stay one parameter: the holders the cut reached hold the same new tensor (each
    was cut from the one tensor at the same positions); it replaces every holder's."""
    import torch

    for original, holders in shared:
        cut = [getattr(m, a) for m, a in holders if getattr(m, a) is not original]
        if not cut:
            continue
        if any(c.shape != cut[0].shape or not torch.equal(c, cut[0]) for c in cut[1:]):
            raise UnsupportedModelError(
                f"structured pruning: a tied parameter ({holders[0][1]} of {type(holders[0][0]).__name__}) "
                "was cut differently where it is used; --no-prune-hidden keeps the hidden size"
            )
        for mod, attr in holders:
            setattr(mod, attr, cut[0])
            if L.kind(mod) is not None:
                L.sync_sizes(mod)


def _hf_config(model: Any, splits: list, before: dict[str, int], describable: bool) -> list[str]:
    """A Hugging Face model's config says its new sizes (head counts, FFN width) when it can; with
    ``describable`` (the output is a Hugging Face folder) a config that cannot say fewer heads
    (``hidden_size / num_attention_heads`` as the head size) keeps the heads, a layer whose new size it
    cannot say (BERT's pooler) keeps its outputs (pruned again without them: ``_KeepLayers``), and
    anything else it cannot say is an error naming it."""
    from ptopt.compress.prune import hf_config

    if not hf_config.is_hf_model(model):
        return []
    sizes = {n: (b, L.out_size(m)) for n, m in model.named_modules() if n in before for b in [before[n]]}
    config, blockers = hf_config.pruned_config(model, list(splits), sizes)
    if not blockers:
        return [f"config.{c}" for c in hf_config.apply_config(model, config)]
    if not describable:
        return []
    tables = {n: f"{type(model.config).__name__} cannot say the new hidden size ({blockers[0]}): it is kept"
              for n, (b, a) in sizes.items() if b != a and L.kind(model.get_submodule(n)) == "embedding"}  # fmt: skip
    if tables:
        raise _KeepLayers(tables)
    cut = tuple(path + "." for path, _, a, b in splits if a != b)
    why = next((b for b in blockers if b.startswith(cut) or not b.split(" ", 1)[0].count(".")), None)
    if cut and why is not None:  # a tensor of an attention that lost heads, or a config it cannot build
        raise _KeepWhole("*", f"{type(model.config).__name__} cannot describe fewer heads ({why})")
    changed = {layer for layer, (b, a) in sizes.items() if b != a}
    layers = {
        layer: f"{type(model.config).__name__} cannot say {layer}'s new size (the output is a Hugging Face folder)"
        for layer in hf_config.unsaid_layers(model, config, changed)
    }
    if layers:
        raise _KeepLayers(layers)
    raise UnsupportedModelError(
        "structured pruning: the pruned model cannot be a Hugging Face folder: its config cannot say "
        f"{'; '.join(blockers[:2])}; write .pt or .pt2 instead, or --exclude those layers"
    )


def _joint(g: Any, groups: list, keep: dict, amount: float, settings: dict, notes: list[str]) -> dict:
    """``keep`` with the widths that modules of the ``settings["joint"]`` types read cut to their kept
    heads x head size (``attention.joint_targets``), a note per type; as it was when none applies."""
    from ptopt.compress.prune.attention import joint_targets

    targets: dict[int, int] = {}
    for cls in settings.get("joint", {}):
        found = joint_targets(g, keep, cls)
        if found is None:
            continue
        targets |= found
        cut = any(n < g.all_groups[gi].units for gi, n in found.items())
        notes.append(
            f"{cls}: heads and the width it reads cut together (its forward derives the head size from its "
            "input's width)"
            if cut
            else f"{cls} keeps its attention heads: its forward derives the head size from its input's width, "
            "which is kept"
        )
    if not targets:
        return keep
    return _choose(g, groups, amount, settings["criterion"], settings["base_channels"], targets)


def _heads_cut_in(g: Any, splits: list[tuple[str, int, int, int]], cls: str) -> bool:
    """Some module of type ``cls`` (or one inside it) lost attention heads (``splits``: see
    ``_follow_heads``)."""
    return any(new != old and L.inside_type(g.modules, path, cls) for path, _, old, new in splits)


def _hidden_cut(g: Any, keep: dict[int, Any]) -> bool:
    """The group of the hidden size (one an embedding table makes) loses channels."""
    return any(L.kind(g.modules.get(p)) == "embedding" for i in keep for p in g.all_groups[i].producers)


def _refuse_if_nothing(
    g: Any, groups: list[ChannelGroup], whole: dict[str, str], heads: dict[str, str] | None = None,
    folder: bool = False,
) -> None:  # fmt: skip
    """UnsupportedModelError when no group can lose a channel: why (the module types kept whole first,
    with the reason each was, then each layer's), cut at a word; with a Hugging Face ``folder`` as the
    output (its config must say every new size), that writing .pt / .pt2 lifts that limit."""
    from ptopt.core.errors import clip

    if any(grp.prunable for grp in groups):
        return
    why = [f"{_kept_whole(cls)} ({reason})" for cls, reason in whole.items()]
    why += [f"{cls} keeps its attention heads ({reason})" for cls, reason in (heads or {}).items()]
    why += [f"{', '.join(grp.producers)}: {grp.frozen[0]}" for grp in groups if grp.producers and grp.frozen]
    why = why + list(g.notes) or ["the model has no conv or linear layer whose outputs another layer reads"]
    raise UnsupportedModelError(
        "structured pruning found no layer whose output channels can be removed: "
        + clip("; ".join(why), 600)
        + (" (the output is a Hugging Face folder, which holds only the sizes its config can say: write .pt or "
           ".pt2 to prune more, or" if folder else " (use")
        + " --method global or l1-unstructured: they zero weights and need no graph)"
    )  # fmt: skip


def _report(g: Any, groups, defaults, before, heads, notes, exact) -> dict[str, Any]:
    order = {n: i for i, n in enumerate(g.producer_order)}
    layers = {}
    for grp in groups:
        for n in grp.producers:
            layers[n] = {
                "channels_before": before.get(n, 0),
                "channels_after": L.out_size(g.modules[n]),
                "group": grp.producers,
                "kept_reason": "; ".join(grp.frozen) or None,
            }
    layers = dict(sorted(layers.items(), key=lambda kv: order.get(kv[0], len(order))))
    return {
        "layers": layers,
        "default_excluded": list(defaults),
        "graph": g.kind,
        "notes": notes,
        "heads": heads,
        "checked": exact,
        "groups": [
            {
                "layers": grp.producers,
                "channels": grp.size,
                "units": grp.units,
                "kept_reason": "; ".join(grp.frozen) or None,
            }
            for grp in groups
            if grp.producers
        ],
    }


def _choose(
    g: Any, groups: list[ChannelGroup], amount: float, criterion: str, base: dict, targets: dict | None = None
) -> dict[int, Any]:
    """``group index -> kept units`` (sorted) of every group that loses some: the units with the
    largest summed L1 / L2 norm of the rows that produce them. ``targets``: ``group index -> units to
    keep`` instead of ``amount`` (``attention.joint_targets``)."""
    import torch

    index = {id(grp): i for i, grp in enumerate(g.all_groups)}
    scores = {index[id(grp)]: torch.zeros(grp.units) for grp in groups if grp.prunable}
    for use in g.uses:
        if use.role != "out":
            continue
        grps, units = g.resolve(use)
        mod = g.modules[use.module]
        rows = mod.weight.detach().movedim(L.weight_dims(mod)[0], 0)[use.start : use.start + use.n].flatten(1)
        norm = rows.abs().sum(1) if criterion == "l1" else rows.pow(2).sum(1)
        for gi in set(grps.tolist()) & set(scores):
            hit = grps == gi
            scores[gi].index_add_(0, units[hit], norm[hit].float())
    keep = {}
    for grp in groups:
        gi = index[id(grp)]
        if gi not in scores:
            continue
        scale = max(base.get(n, L.out_size(g.modules[n])) / L.out_size(g.modules[n]) for n in grp.producers)
        start = max(1, round(grp.units * scale))
        n_keep = min(grp.units, max(1, start - int(round(amount * start))))
        n_keep = (targets or {}).get(gi, n_keep)
        if n_keep < grp.units:
            keep[gi] = torch.sort(torch.topk(scores[gi], n_keep).indices).values
    return keep


def _lookup(keep: dict[int, Any]) -> dict[int, Any]:
    """``group index -> bool per unit`` (True: kept) for the groups that lose units."""
    import torch

    return {
        k: torch.zeros(int(v.max()) + 1, dtype=torch.bool).index_fill(0, v, True) for k, v in keep.items()
    }


def _alive(g: Any, kept: dict[int, Any], use: Any) -> Any:
    """Per position of ``use``: whether its channel stays."""
    import torch

    grps, units = g.resolve(use)
    alive = torch.ones(use.n, dtype=torch.bool)
    for gi, lookup in kept.items():
        hit = grps == gi
        if bool(hit.any()):
            u = units[hit]
            alive[hit] = (u < len(lookup)) & lookup[u.clamp(max=len(lookup) - 1)]
    return alive


def _masks(g: Any, kept: dict[int, Any]) -> dict[tuple, tuple[Any, Any]]:
    """``use.key -> (mask of kept positions, role)`` for every dimension that loses positions."""
    import torch

    masks: dict[tuple, tuple[Any, Any]] = {}
    for use in g.uses:
        mod = g.modules[use.module]
        if use.key not in masks:
            masks[use.key] = (
                torch.ones(L.dim_size(mod, use.role, use.attr, use.axis), dtype=torch.bool),
                use.role,
            )
        masks[use.key][0][use.start : use.start + use.n] &= _alive(g, kept, use)
    return {k: v for k, v in masks.items() if not bool(v[0].all())}


def _zero_inputs(modules: dict[str, Any], uses: list, masks: dict[tuple, tuple[Any, Any]]) -> None:
    """Zero the input columns that will go: the model then computes what the pruned one should."""
    for (name, role, _, _), (mask, _) in masks.items():
        if role == "in":
            mod = modules[name]
            w = mod.weight.data.movedim(L.weight_dims(mod)[1], 0)
            w[~mask] = 0


def _cut(modules: dict[str, Any], uses: list, masks: dict[tuple, tuple[Any, Any]]) -> None:
    for (name, _, attr, axis), (mask, role) in masks.items():
        L.cut(modules[name], role, mask.nonzero().flatten(), attr, axis)
        mod = modules[name]
        for cache in [a for a, v in vars(mod).items() if a.endswith("_cache") and isinstance(v, dict)]:
            getattr(mod, cache).clear()  # timm LeViT caches its sliced attention biases per device


def _follow_heads(g: Any, kept: dict[int, Any]) -> tuple[list[str], list[tuple[str, int, int, int]]]:
    """The modules that split channels into heads: their head-count attributes follow. Returns what
    was set, and every split as (module, head size, heads before, heads after)."""
    from ptopt.compress.prune.attention import follow_heads
    from ptopt.compress.prune.channel_graph import Use
    from ptopt.compress.prune.layout import plain

    splits = []
    for path, space, stride, count in g.head_splits:
        alive = _alive(g, kept, Use(space, "", "", plain(0, stride * count), stride * count))
        splits.append((path, stride, count, int(alive.view(count, stride).any(1).sum())))
    return follow_heads(g.modules, splits), splits


def _runnable(model: Any, graph: Any, example_inputs: Any, ref: Any) -> tuple[Any, Any]:
    """(the rewritten model, or its rewritten graph when the module's own forward cannot follow the
    new sizes (hard-coded shapes in the model's own code), and its output on ``example_inputs``);
    ``_KeepWhole`` naming the module type whose forward failed; UnsupportedModelError when nothing
    runs. ``ref``: an output of the unpruned model (its shapes)."""
    import torch

    from ptopt.core.inputspec import call_model

    with torch.no_grad():
        try:
            out = call_model(model, example_inputs)
        except Exception as e:  # noqa: BLE001 - e.g. a forward with hard-coded sizes
            out, culprit = None, _culprit(model, e, example_inputs)
            if culprit is not None:
                raise _KeepWhole(type(culprit[0]).__name__, _fails(culprit, e)) from None
        if out is not None and _same_shapes(out, ref):
            return model, out
        gm = graph.rewrite_flattens(model)
        try:
            out = call_model(gm, example_inputs)
        except Exception as e:  # noqa: BLE001
            raise UnsupportedModelError(
                f"structured pruning: the pruned model does not run: {_first_line(e)}"
            ) from None
        return gm.eval(), out


def _runnable_following(
    model: Any, g: Any, kept: dict[int, Any], example_inputs: Any, masked: Any, heads: list[str]
) -> tuple[Any, Any]:
    """``_runnable`` (``masked``: the unpruned output's shapes); when the forward fails, once more with
    the split sizes its modules hold following the cut channels (``prune.split_sizes``: what was set is
    added to ``heads``, the report's list of attributes set), kept only when the model then computes what
    the unpruned one computes without the removed channels; else the first failure stands."""
    from ptopt.compress.prune.split_sizes import follow_splits

    try:
        return _runnable(model, g, example_inputs, masked)
    except _KeepWhole as e:
        first = e
    followed = follow_splits(g.modules, _even_splits(g, kept))
    if not followed:
        raise first
    try:
        runnable = _runnable(model, g, example_inputs, masked)
    except (_KeepWhole, UnsupportedModelError):
        raise first from None
    if _gap(runnable[1], masked) is not None:  # runs, but not as the unpruned model: not the split's size
        raise first
    heads += followed
    return runnable


def _even_splits(g: Any, kept: dict[int, Any]) -> list[tuple[str, int, int, int]]:
    """``(module path, piece size, pieces, kept per piece)`` of each split into equal pieces that stay equal."""
    from ptopt.compress.prune.channel_graph import Use
    from ptopt.compress.prune.layout import plain

    out = []
    for path, space, size, pieces in g.even_splits:
        alive = _alive(g, kept, Use(space, "", "", plain(0, size * pieces), size * pieces))
        per = alive.view(pieces, size).sum(1)
        if bool((per == per[0]).all()):
            out.append((path, size, pieces, int(per[0])))
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _culprit(model: Any, error: BaseException, example_inputs: Any) -> tuple[Any, str | None] | None:
    """(the module of ``model`` to keep whole, the layer whose input its own code made, when that is how
    it was found), or None: the model's own code failed. The module is the one that made the input of the
    layer the forward fails in (``prune.culprit``: a wrapper that only handed it on is not it), else the
    innermost module (not the model itself) whose ``forward`` the error passed through."""
    from ptopt.compress.prune.culprit import active_modules, maker

    # torch's own layers fail on the sizes they are given; the module that gave them is the one to keep
    ours = {
        id(m) for m in model.modules() if m is not model and not type(m).__module__.startswith("torch.nn")
    }
    found = next((m for m in reversed(active_modules(error)) if id(m) in ours), None)
    made = maker(model, example_inputs, ours) if found is not None else None
    if made is not None and made[0] is not found:
        return made
    return None if found is None else (found, None)


def _fails(culprit: tuple[Any, str | None], error: BaseException) -> str:
    """Why a module type is kept whole: its forward failed (on what its own code handed to a layer)."""
    _, layer = culprit
    handed = f": its own code sizes the input of {layer}" if layer else ""
    return f"its forward fails with fewer channels{handed} ({_first_line(error)})"


def _check(out: Any, masked: Any, heads: list[str], graph: Any) -> None:
    """The pruned model's output ``out`` is what the unpruned one computed with the removed channels
    zeroed where layers read them (``masked``); else a head attribute was not followed:
    ``_KeepWhole("*")`` (keep attention whole), or an error when heads were not involved."""
    diff = _gap(out, masked)
    if diff is None:
        return
    why = (f"the model with fewer heads does not compute what the original computes without them "
           f"(max difference {diff:.3g}; head attributes set: {', '.join(heads) or 'none'})")  # fmt: skip
    if graph.head_splits:
        raise _KeepWhole("*", why)
    raise UnsupportedModelError(
        "structured pruning: the rewritten model does not compute what the original computes "
        f"without the removed channels (max difference {diff:.3g}): please report it, and --exclude "
        "the layers around the difference"
    )


def _gap(out: Any, masked: Any) -> float | None:
    """The largest difference of the first floating-point output of ``out`` that differs from ``masked``'s
    by more than 1e-4 of its scale (``inf``: their shapes differ), else None."""
    import torch

    a = [
        t
        for t in torch.utils._pytree.tree_leaves(out)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    b = [
        t
        for t in torch.utils._pytree.tree_leaves(masked)
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    for x, y in zip(a, b, strict=False):
        scale = float(y.abs().max()) if y.numel() else 0.0
        diff = float((x - y).abs().max()) if x.shape == y.shape else float("inf")
        if diff > 1e-4 * max(scale, 1.0):
            return diff
    return None


def _same_shapes(out: Any, ref: Any) -> bool:
    """The pruned model's outputs have the shapes of the original's (tensors, tuples, dicts and
    Hugging Face ModelOutputs alike)."""
    import torch

    a = torch.utils._pytree.tree_leaves(out)
    b = torch.utils._pytree.tree_leaves(ref)
    shapes = [tuple(getattr(t, "shape", ())) for t in a], [tuple(getattr(t, "shape", ())) for t in b]
    return len(a) == len(b) and shapes[0] == shapes[1]


def output_channels(model: Any) -> dict[str, int]:
    """Output channels / features of every conv and linear, by name."""
    return L.output_channels(model)


@register_pruner(StructuredPruneConfig)
class StructuredPruner:
    """Each round removes channels down to ``(1 - amount_k)`` of the channels the model started with."""

    precision = "fp32"
    #: the result must stay a Hugging Face model its config describes (the output is a folder)
    describable = False

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
            describable=self.describable,
            hidden=c.prune_hidden,
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
            "graph": self.report.get("graph"),
            "heads": self.report.get("heads", []),
            "checked_vs_masked": self.report.get("checked"),
            "notes": self.report.get("notes", []),  # the warnings, recorded (the sidecar says why too)
        }
