"""The channel-dependency graph behind structured pruning, read from the model's own graph.

Every conv / linear output is a *channel space*; the analysis follows where each tensor's channels
sit (:mod:`ptopt.compress.prune.layout`: digits mapping positions to channels) through every node of
a ``torch.fx`` graph (``ChannelGraph``) or of ``torch.export``'s ATen graph
(``ptopt.compress.prune.graph.ATenChannelGraph``), and records:

- *uses*: the weight rows a layer produces (``out``), the input columns a layer reads (``in``),
  norm entries, depthwise / grouped conv rows, parameters met along the channels (a position bias
  table indexed per head, a layer scale, a class token): the dimensions to cut;
- *links* (union-find): channels joined elementwise (residual adds, ``x * gate``) are one group;
  spaces linked *proportionally* (attention: q heads with k and v heads, grouped-query attention's
  kv heads with their repeated q heads) are cut in the same units;
- *blocks*: channels an op mixes (attention contracting the head dim, GroupNorm groups, a grouped
  conv) go in whole blocks: attention heads are found this way, not from the module's class;
- *kept* spaces (``frozen``, with the reason): channels that reach the model output, meet a tensor
  no layer made, or reach an op the rules do not know (named; the rest of the model is pruned).

Concatenations and splits (``torch.cat``, ``split``/``chunk``/``unbind`` of a fused ``qkv``) are
*part* spaces: a layer reading a concatenation cuts each part where it sits.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from typing import Any

from ptopt.compress.prune import layers as L
from ptopt.compress.prune import ops as O
from ptopt.compress.prune.attention import attention_unit
from ptopt.compress.prune.layout import Digit, plain
from ptopt.compress.prune.rules import Rules
from ptopt.compress.prune.spaces import ChannelGroup, Spaces, Use, _Info, _op_name, _Space
from ptopt.core.errors import UnsupportedModelError

__all__ = ["ChannelGraph", "ChannelGroup", "Use", "exclude_flags"]


class ChannelGraph(Rules, Spaces):
    """Channel dependencies of a torch.fx-traced model (see the module docstring)."""

    #: the graph the analysis read (``fx`` here, ``export`` for ``ATenChannelGraph``)
    kind = "fx"

    #: the hidden size is pruned: embedding tables produce channels (the residual stream), reductions
    #: over the last dim (a norm written in Python) are statistics, and the stream may reach the output
    hidden = False

    def __init__(
        self, model: Any, example_inputs: Any, input_style: str = "positional", hidden: bool = False
    ):
        import torch
        import torch.fx
        from torch.fx.passes.shape_prop import ShapeProp

        from ptopt.core.inputspec import call_args

        self.model = model
        self.hidden = hidden
        try:
            self.gm = torch.fx.symbolic_trace(model)
        except Exception as e:  # noqa: BLE001 - tracing fails in many ways (control flow on values, ...)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            err = UnsupportedModelError(
                f"structured pruning needs the model's graph, but torch.fx cannot trace {type(model).__name__}: "
                f"{reason[:300]} (l1-unstructured and global pruning need no graph)"
            )
            err.capture_reason = reason[:300]
            raise err from None
        args, kwargs = call_args(example_inputs)
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if kwargs:
            args = tuple(kwargs.get(n.target) for n in placeholders)
        try:
            with torch.no_grad():
                ShapeProp(self.gm).propagate(*args)
        except Exception as e:  # noqa: BLE001
            raise UnsupportedModelError(
                f"structured pruning: running the traced graph failed: {str(e).strip().splitlines()[0][:300]}"
            ) from None
        # the model's own modules (the traced module holds stand-ins for the ones it traced through)
        self.modules = dict(model.named_modules())
        self._analyse()

    # -- graph-specific hooks (ATenChannelGraph overrides them) --------------------------------
    @staticmethod
    def _shape(node: Any) -> tuple[int, ...] | None:
        meta = node.meta.get("tensor_meta") if hasattr(node, "meta") else None
        shape = getattr(meta, "shape", None)
        return tuple(shape) if shape is not None else None

    def _owner(self, node: Any) -> tuple[str, str] | None:
        """(module, attribute) of a parameter / buffer node, else None."""
        if getattr(node, "op", None) == "get_attr":
            mod, _, attr = str(node.target).rpartition(".")
            return mod, attr
        return None

    def _stack(self, node: Any) -> list[str]:
        """Paths of the modules ``node`` ran inside, outermost first."""
        return [v[0] for v in (node.meta.get("nn_module_stack") or {}).values()]

    # -- the walk ------------------------------------------------------------------------------
    def _analyse(self) -> None:
        """Visit every node of ``self.gm.graph`` once, in order (``self.modules`` set)."""
        self._spaces: list[_Space] = []
        self.uses: list[Use] = []
        self._module_out: dict[str, int] = {}
        self._module_in: dict[str, int] = {}
        self._param_spaces: dict[tuple[str, str, int], int] = {}
        self._parts: dict[int, list[tuple[int | None, int, int]]] = {}
        self._inexact: set[int] = set()
        #: space -> the norms over its channels, as (module, space, channels): a leaf module to run on the
        #: kept channels alone when checking the pruned model, or None (a norm inside a larger forward)
        self._norm_at: dict[int, list[tuple[str | None, int, int, tuple[Digit, ...]]]] = {}
        self.producer_order: list[str] = []
        #: structures kept whole or channels kept by an op the rules do not follow (printed)
        self.notes: list[str] = []
        #: reason -> (index in ``notes``, the structures kept whole for it): one note per reason
        self._whole_notes: dict[str, tuple[int, list[str]]] = {}
        #: (space, op, node) of channels kept because they reach an op the rules do not follow
        self.kept_by_op: list[tuple[int, str, str]] = []
        #: view/reshape nodes that flatten channels into features: node name -> start dim
        self.flatten_nodes: dict[str, int] = {}
        #: (module path, space, stride, count) of every split of channels into blocks (heads): the
        #: module's head-count attributes follow them (``attention.set_counts``)
        self.head_splits: list[tuple[str, int, int, int]] = []
        #: (module path, space, piece size, pieces) of every split of channels into equal pieces
        #: (``x.split(self.expand_chs // 2, dim=1)``): a module whose forward fails with fewer channels has
        #: its attributes holding those sizes followed once (``prune.split_sizes``)
        self.even_splits: list[tuple[str, int, int, int]] = []
        #: per output tensor: the channels of the hidden size it carries (pruned with it), else None
        self.output_infos: list[Any] = []
        self._info: dict[Any, Any] = {}
        for node in self.gm.graph.nodes:
            self._info[node] = self._visit(node)

    def _visit(self, node: Any) -> Any:
        if node.op in ("placeholder", "get_attr"):
            return None
        if node.op == "output":
            for n in self._tensor_inputs(node):
                info = self._info.get(n)
                if self._hidden_stream(info):
                    self.output_infos.append(info)
                    continue
                self.output_infos.append(None)
                self._freeze_info(info, "reaches the model output")
            return None
        if node.op == "call_module":
            return self._visit_module(node)
        name = _op_name(node)
        handler = O.HANDLERS.get(name)
        if handler is None and node.target in (operator.add, operator.sub, operator.mul, operator.truediv):
            handler = "elementwise"
        if handler is None:
            return self._unknown(node, name)
        out = getattr(self, "_h_" + handler)(node)
        if isinstance(out, _Info) and self._shape(node) is None:  # (values, indices): the first
            return [out, None] if name in O.TUPLE_FIRST else self._unknown(node, name)
        return out

    def _produce(self, name: str, size: int, dim: int, rows_dim_size: int | None = None) -> _Info:
        """The output channels of layer ``name`` (one space however often it runs)."""
        if name not in self._module_out:
            space = self._new(size, producer=name)
            self._module_out[name] = space
            self.uses.append(Use(space, name, "out", plain(0, size), rows_dim_size or size))
            self.producer_order.append(name)
        return _Info(self._module_out[name], plain(dim, size))

    def _consume(self, name: str, info: _Info | None, role: str, n: int, where: str) -> None:
        """Layer ``name`` reads ``info``'s channels along its last/first dim: record the cut."""
        if info is None:
            return
        self.uses.append(Use(info.space, name, role, info.digits, n))
        if name in self._module_in and self._module_in[name] != info.space:
            # a layer called twice: both inputs are cut alike
            prev = self._module_in[name]
            if self._same_layout(prev, info.space):
                self._union(prev, info.space, where)
            else:
                self._freeze(prev, f"{name} reads differently laid out channels")
                self._freeze(info.space, f"{name} reads differently laid out channels")
        self._module_in.setdefault(name, info.space)

    def space_of(self, layer: str) -> _Info | None:
        """The output channels of ``layer`` (no digits), or None when it makes none."""
        return _Info(self._module_out[layer], ()) if layer in self._module_out else None

    def _hidden_stream(self, info: Any) -> bool:
        """With the hidden size pruned: ``info``'s channels are the residual stream (its group holds an
        embedding table), which is pruned where it reaches the model output too."""
        if not self.hidden or not isinstance(info, _Info) or info.space in self._parts:
            return False
        producers = self._spaces[self._find(info.space)].producers
        return any(L.kind(self.modules.get(p)) == "embedding" for p in producers)

    # -- helpers ---------------------------------------------------------------------------------
    def _tensor_inputs(self, node: Any) -> list[Any]:
        import torch.fx

        out: list[Any] = []
        torch.fx.node.map_arg((node.args, node.kwargs), out.append)
        return [n for n in out if self._shape(n) is not None or isinstance(self._info.get(n), list)]

    def _known(self, node: Any) -> list[tuple[Any, _Info]]:
        return [(n, i) for n in self._tensor_inputs(node) if isinstance(i := self._info.get(n), _Info)]

    def _unknown(self, node: Any, what: str) -> None:
        """An op the rules do not follow: every channel it reads is kept (and named)."""
        for n in self._tensor_inputs(node):
            info = self._info.get(n)
            for i in info if isinstance(info, list) else [info]:
                if isinstance(i, _Info):
                    self.kept_by_op.append((i.space, what, node.name))
                    self._freeze(i.space, f"channels reach {what!r} (graph node {node.name})")
        return None

    @staticmethod
    def _arg(node: Any, index: int, name: str, default: Any = None) -> Any:
        if name in node.kwargs:
            return node.kwargs[name]
        return node.args[index] if len(node.args) > index else default

    # -- module calls (torch.fx leaves) ----------------------------------------------------------
    def _visit_module(self, node: Any) -> Any:
        name = node.target
        mod = self.modules.get(name) or self.gm.get_submodule(name)
        kind = L.kind(mod)
        src = node.args[0] if node.args else None
        info = self._info.get(src) if src is not None else None
        if self._shape(node) is None:
            if type(mod).__name__ == "MultiheadAttention":  # returns (output, weights)
                return self._keep_whole(node, name, attention_unit(name, mod).reason)
            return self._unknown(node, type(mod).__name__)
        if kind in ("conv", "linear", "conv1d_t"):
            return self._layer(node, name, mod, src, info)
        if kind in ("batch_norm", "layer_norm", "group_norm"):
            return self._norm(node, name, mod, kind, src, info)
        cls = type(mod).__name__
        if cls in O.MIX_MODULES and isinstance(info, _Info):
            dim = getattr(mod, O.MIX_MODULES[cls], None)
            if isinstance(dim, int):
                return self._drop(info, [dim % len(self._shape(src))], name)
            return self._unknown(node, cls)
        if cls in O.PASSTHROUGH_MODULES:
            return info if isinstance(info, _Info) else None
        if cls in O.SPATIAL_MODULES:
            return self._h_same_rank(node)
        if cls in ("Flatten", "Unflatten"):
            return self._h_reshape(node)
        if cls in ("Embedding", "EmbeddingBag") or L.kind(mod) == "embedding":
            if self.hidden and L.kind(mod) == "embedding":
                return self._produce(name, L.out_size(mod), len(self._shape(node)) - 1)
            return None
        return self._unknown(node, cls)

    def _keep_whole(self, node: Any, name: str, reason: str) -> None:
        """A structure kept whole: the channels it reads stay, what it returns is no layer's output."""
        for _, info in self._known(node):
            self._freeze(info.space, f"read by {name}, kept whole")
        at, names = self._whole_notes.setdefault(reason, (len(self.notes), []))
        if name not in names:
            names.append(name)
            note = f"{_several(names)} kept whole: {reason}"
            self.notes[at : at + (len(names) > 1)] = [note]  # one note per reason, naming them all
        return None

    # -- layers ------------------------------------------------------------------------------------
    def _layer(self, node: Any, name: str, mod: Any, src: Any, info: Any) -> _Info | None:
        """Conv / linear (and Conv1D): consumes its input's channels, produces a new space; a
        depthwise or grouped conv keeps its input's channels (whole groups)."""
        shape = self._shape(node)
        kind = L.kind(mod)
        in_shape = self._shape(src) if src is not None else None
        in_dim = 1 if kind == "conv" else (len(in_shape) - 1 if in_shape else 0)
        out_dim = 1 if kind == "conv" else len(shape) - 1
        if isinstance(info, _Info) and any(d.dim != in_dim for d in info.digits):
            self._freeze(info.space, f"{name} reads them along another dim")
            info = None
        elif not isinstance(info, _Info):
            info = None
        groups = getattr(mod, "groups", 1) if kind == "conv" else 1
        if groups > 1:
            return self._grouped(node, name, mod, info, out_dim)
        self._consume(name, info, "in", L.in_size(mod), node.name)
        return self._produce(name, L.out_size(mod), out_dim)

    def _grouped(self, node: Any, name: str, mod: Any, info: _Info | None, out_dim: int) -> _Info | None:
        """A grouped conv: output group j reads input group j, so whole groups go, on both sides. Channels
        in = out (depthwise, ResNeXt / RegNet groups): one space; else a new space tied to the input
        group by group."""
        g, cin, cout = mod.groups, mod.in_channels, mod.out_channels
        if info is None:
            return self._produce_frozen(
                name, cout, out_dim, f"grouped conv {name} reads channels no layer made"
            )
        if info.digits != plain(1, cin) or info.space in self._parts:
            self._freeze(info.space, f"feeds grouped conv {name} (groups={g})")
            return self._produce_frozen(name, cout, out_dim, f"grouped conv {name}")
        role = "depthwise" if g == cin == cout else "grouped"
        if cin == cout:
            self._block(info.space, cin // g, name)
            self.uses.append(Use(info.space, name, role, info.digits, cout))
            self._remember(name, info.space)
            return info
        out = self._new(cout)
        self._spaces[out].producers = []
        self.uses.append(Use(out, name, role, plain(0, cout), cout))
        self._link(info.space, Digit(0, 1, cin // g, g), out, Digit(0, 1, cout // g, g), g, name)
        self._block(info.space, cin // g, name)
        self._block(out, cout // g, name)
        return _Info(out, plain(out_dim, cout))

    def _remember(self, name: str, space: int) -> None:
        if name in self._module_in and self._find(self._module_in[name]) != self._find(space):
            self._union(self._module_in[name], space, name)
        self._module_in.setdefault(name, space)

    def _produce_frozen(self, name: str, size: int, dim: int, reason: str) -> _Info:
        if name not in self._module_out:
            self._module_out[name] = self._new(size, frozen=reason)
        return _Info(self._module_out[name], plain(dim, size))

    def _norm(self, node: Any, name: str, mod: Any, kind: str, src: Any, info: Any) -> _Info | None:
        """BatchNorm (channels on dim 1), LayerNorm / RMSNorm over the last dim(s), GroupNorm (dim 1,
        whole groups: ``num_groups`` follows)."""
        if not isinstance(info, _Info):
            return None
        rank = len(self._shape(src))
        if kind == "layer_norm":
            normed = set(range(rank - len(mod.normalized_shape), rank))
            on = [d for d in info.digits if d.dim in normed]
            if not on:
                return info
            if len(on) < len(info.digits):  # per head (qk-norm): within a unit, nothing to cut
                for d in on:
                    self._block(info.space, d.span, name)
                return info
            # over the last dim alone, whatever the channels' layout on it (timm Swin's patch merging:
            # four copies of the stream, flattened): the check replays it on the positions that stay
            width, last = self._shape(src)[-1], len(normed) == 1 and L.plain_norm(mod)
            self._normed(
                info.space, (name if last else None, info.space, width, tuple(d.moved(0) for d in on))
            )
            if len(normed) != 1 or getattr(mod, "weight", None) is None:
                return info if len(normed) == 1 else self._drop(info, normed, name)
        elif any(d.dim != 1 for d in info.digits):
            return self._unknown(node, type(mod).__name__)
        if kind == "group_norm":
            if info.digits != plain(1, mod.num_channels) or not mod.affine:
                return self._unknown(node, type(mod).__name__)
            self._block(info.space, mod.num_channels // mod.num_groups, name)
        if getattr(mod, "weight", None) is None and getattr(mod, "running_mean", None) is None:
            return info
        self.uses.append(Use(info.space, name, "norm", info.digits, L.dim_size(mod, "norm")))
        self._remember(name, info.space)
        return info

    # -- results -------------------------------------------------------------------------------------
    def executed_layers(self) -> list[str]:
        """The modules with a weight matrix (conv, linear, recurrent, embedding) in the order the
        graph first runs them (a call, or an op reading their parameters)."""
        import torch

        out: list[str] = []
        for node in self.gm.graph.nodes:
            names = [node.target] if node.op == "call_module" else []
            if node.op in ("call_function", "call_method"):
                names = [o[0] for o in map(self._owner, node.all_input_nodes) if o is not None]
            for name in names:
                m = self.modules.get(name)
                if m is None or name in out:
                    continue
                if isinstance(m, torch.nn.RNNBase) or any(p.dim() >= 2 for p in m.parameters(recurse=False)):
                    out.append(name)
        return out

    def rewrite_flattens(self, model: Any) -> Any:
        """``model`` (pruned) traced again, with every channel-flattening view/reshape of the analysed
        graph (``x.view(-1, 400)``, whose sizes are baked in) turned into ``torch.flatten(x, dim)``,
        which follows the pruned sizes."""
        import torch
        import torch.fx

        self.gm = torch.fx.symbolic_trace(model)
        graph = self.gm.graph
        for node in list(graph.nodes):
            if node.name in self.flatten_nodes:
                with graph.inserting_before(node):
                    new = graph.call_function(torch.flatten, (node.args[0], self.flatten_nodes[node.name]))
                node.replace_all_uses_with(new)
                graph.erase_node(node)
        self.gm.recompile()
        return self.gm

    def groups(
        self,
        exclude: Iterable[str] = (),
        reasons: dict[str, str] | None = None,
        whole: dict[str, str] | None = None,
        heads: dict[str, str] | None = None,
    ) -> list[ChannelGroup]:
        """Channel groups after all links; layers in ``exclude`` (names) keep their output channels
        (``reasons[name]`` says why, default "NAME excluded"), and so does every channel tied to them.
        ``whole``: module types (``"*"``: modules splitting channels into heads) whose layers keep
        every channel they read or make; ``heads``: module types whose head splits keep their heads (their
        other channels still go)."""
        exclude = set(exclude)
        for use in self.uses:
            if use.module in exclude and use.role in ("out", "depthwise", "norm", "grouped"):
                self._freeze(use.space, (reasons or {}).get(use.module, f"{use.module} excluded"))
        self._keep_types(whole or {}, heads or {})
        members: dict[int, list[int]] = {}
        for i in range(len(self._spaces)):
            if i not in self._parts:
                members.setdefault(self._find(i), []).append(i)
        self._units: dict[int, int] = {}
        out: list[ChannelGroup] = []
        self._group_index: dict[int, int] = {}
        for root, ids in members.items():
            sp = self._spaces[root]
            units = math.gcd(*(self._spaces[m].size // self._spaces[m].block for m in ids))
            self._units[root] = units
            producers = list(dict.fromkeys(p for m in ids for p in self._spaces[m].producers))
            first = next((m for m in ids if self._spaces[m].producers), ids[0])
            g = ChannelGroup(
                producers,
                units,
                list(dict.fromkeys(sp.frozen)),
                {m: self._spaces[m].size // units for m in ids},
                inexact=any(m in self._inexact for m in ids),
                norms=[n for m in ids for n in self._norm_at.get(m, [])],
                size=self._spaces[first].size,
            )
            self._group_index[root] = len(out)
            out.append(g)
        #: every group, indexed as :meth:`resolve` says
        self.all_groups = out
        return [g for g in out if g.producers or len(g.members) > 1]

    def _keep_types(self, whole: dict[str, str], heads: dict[str, str]) -> None:
        for path, space, _, _ in self.head_splits:
            owner = L.owner_of_type(self.modules, path, {*whole, *heads})
            if "*" in whole or owner is not None:
                cls = type(self.modules.get(owner if owner is not None else path)).__name__
                self._freeze(space, f"{cls} keeps its heads" if cls in heads else f"{cls} kept whole")
        if not whole:
            return
        for use in self.uses:
            owner = L.owner_of_type(self.modules, use.module, whole)
            if owner is not None:
                self._freeze(use.space, f"{type(self.modules[owner]).__name__} kept whole")

    def resolve(self, use: Use) -> tuple[Any, Any]:
        """For each position of ``use``: the index in :attr:`all_groups` of the group its channel
        belongs to (-1: channels no layer made) and the unit within it. Call after :meth:`groups`."""
        import torch

        from ptopt.compress.prune.layout import values

        channels = values(use.digits, use.n)
        groups = torch.full((use.n,), -1, dtype=torch.long)
        units = torch.zeros(use.n, dtype=torch.long)
        self._resolve(use.space, channels, torch.arange(use.n), groups, units)
        return groups, units

    def _resolve(self, space: int, channels: Any, where: Any, groups: Any, units: Any) -> None:
        if space in self._parts:
            for part, at, size in self._parts[space]:
                hit = (channels >= at) & (channels < at + size)
                if part is not None and bool(hit.any()):
                    self._resolve(part, channels[hit] - at, where[hit], groups, units)
            return
        root = self._find(space)
        units[where] = channels // (self._spaces[space].size // self._units[root])
        groups[where] = self._group_index[root]

    def kept_note(self) -> str | None:
        """One line naming the layers whose channels reach ops the rules do not follow (kept)."""
        seen: dict[int, tuple[str, str]] = {}
        for space, op, node in self.kept_by_op:
            root = self._find(space) if space not in self._parts else space
            for r in (
                [root]
                if root not in self._parts
                else [self._find(p) for p, _, _ in self._parts[root] if p is not None]
            ):
                only_ops = all(why.startswith("channels reach") for why in self._spaces[r].frozen)
                if self._spaces[r].producers and r not in seen and only_ops:
                    seen[r] = (op, node)
        if not seen:
            return None
        where = "; ".join(
            f"{', '.join(dict.fromkeys(self._spaces[r].producers))}: {op!r} (graph node {node})"
            for r, (op, node) in list(seen.items())[:4]
        )
        more = f" and {len(seen) - 4} more" if len(seen) > 4 else ""
        return (
            f"kept the output channels of {len(seen)} layer group(s) whose channels reach an op structured "
            f"pruning does not follow: {where}{more}"
        )


def _several(names: list[str]) -> str:
    """``names`` in a note: the name, or one glob and the count (``encoder.layers.*.self_attention
    (12 modules)``) when they share a pattern, else the first two and the count."""
    if len(names) == 1:
        return names[0]
    if len({n.count(".") for n in names}) == 1:
        parts = zip(*(n.split(".") for n in names), strict=True)
        pattern = ".".join(p[0] if len(set(p)) == 1 else "*" for p in parts)
        if not pattern.startswith("*"):
            return f"{pattern} ({len(names)} modules)"
    return f"{', '.join(names[:2])} and {len(names) - 2} more" if len(names) > 2 else " and ".join(names)


def exclude_flags(names: list[str], layers: Any = (), kept: Any = ()) -> str:
    """``--exclude`` options covering ``names``: one glob when they share a pattern (same depth,
    ``*`` where they differ, e.g. ``'features.*.*.block.3.0'``) that matches no layer of ``layers``
    outside ``kept``; else one option per name."""
    import fnmatch

    if len(names) > 1 and len({n.count(".") for n in names}) == 1:
        parts = [n.split(".") for n in names]
        pattern = ".".join(p[0] if len(set(p)) == 1 else "*" for p in zip(*parts, strict=True))

        def hit(layer: str) -> bool:
            segs = layer.split(".")
            return any(fnmatch.fnmatchcase(".".join(segs[:i]), pattern) for i in range(1, len(segs) + 1))

        if not pattern.startswith("*") and not any(hit(n) for n in layers if n not in set(kept)):
            return f"--exclude '{pattern}'"
    return " ".join(f"--exclude {n}" for n in names)
