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

import dataclasses
import math
import operator
from collections.abc import Iterable
from typing import Any

from ptopt.compress.prune import layers as L
from ptopt.compress.prune import ops as O
from ptopt.compress.prune.attention import attention_unit
from ptopt.compress.prune.layout import Digit, plain
from ptopt.core.errors import UnsupportedModelError


def _op_name(node: Any) -> str:
    """``add`` for ``operator.add``, ``x.add_``, ``torch.add`` and ATen's ``aten.add_.Tensor`` alike."""
    t = node.target
    if isinstance(t, str):
        return t.strip("_")
    if hasattr(t, "_opname"):  # an ATen OpOverload: the op without its overload name
        return t._opname.strip("_")
    return getattr(t, "__name__", str(t)).strip("_")


@dataclasses.dataclass
class _Space:
    size: int
    producers: list[str] = dataclasses.field(default_factory=list)
    frozen: list[str] = dataclasses.field(default_factory=list)
    parent: int = -1
    #: this member's channels go in multiples of this many (heads, groups)
    block: int = 1


@dataclasses.dataclass(frozen=True)
class _Info:
    """A tensor's channels: which space, and the digits that place them (``layout``)."""

    space: int
    digits: tuple[Digit, ...]


@dataclasses.dataclass(frozen=True)
class Use:
    """A dimension of ``module`` whose positions ``start .. start+n`` hold channels of ``space``
    (position p: channel ``layout.values(digits, n)[p]``)."""

    space: int
    module: str
    role: str  # out | in | norm | depthwise | grouped | param
    digits: tuple[Digit, ...]
    n: int
    start: int = 0
    attr: str = ""
    axis: int = 0

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.module, "rows" if self.role in ("out", "depthwise", "grouped") else self.role, self.attr, self.axis)


@dataclasses.dataclass
class ChannelGroup:
    """Channels pruned together, ranked as one, removed in ``units`` equal units (heads, groups,
    single channels); ``members``: each space of the group and its channels per unit."""

    producers: list[str]
    units: int
    frozen: list[str]
    members: dict[int, int]
    #: a LayerNorm normalises over these channels: removing them changes the others' statistics
    inexact: bool = False
    #: channels of the first producer's space (the table's "channels")
    size: int = 0

    @property
    def prunable(self) -> bool:
        return not self.frozen and bool(self.producers) and self.units > 1


class ChannelGraph:
    """Channel dependencies of a torch.fx-traced model (see the module docstring)."""

    #: the graph the analysis read (``fx`` here, ``export`` for ``ATenChannelGraph``)
    kind = "fx"

    def __init__(self, model: Any, example_inputs: Any, input_style: str = "positional"):
        import torch
        import torch.fx
        from torch.fx.passes.shape_prop import ShapeProp

        from ptopt.core.inputspec import call_args

        self.model = model
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
        self.producer_order: list[str] = []
        #: structures kept whole or channels kept by an op the rules do not follow (printed)
        self.notes: list[str] = []
        #: (space, op, node) of channels kept because they reach an op the rules do not follow
        self.kept_by_op: list[tuple[int, str, str]] = []
        #: view/reshape nodes that flatten channels into features: node name -> start dim
        self.flatten_nodes: dict[str, int] = {}
        #: (module path, space, stride, count) of every split of channels into blocks (heads): the
        #: module's head-count attributes follow them (``attention.set_counts``)
        self.head_splits: list[tuple[str, int, int, int]] = []
        self._info: dict[Any, Any] = {}
        for node in self.gm.graph.nodes:
            self._info[node] = self._visit(node)

    def _visit(self, node: Any) -> Any:
        if node.op in ("placeholder", "get_attr"):
            return None
        if node.op == "output":
            for n in self._tensor_inputs(node):
                self._freeze_info(self._info.get(n), "reaches the model output")
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

    # -- spaces, union-find ----------------------------------------------------------------------
    def _new(self, size: int, producer: str | None = None, frozen: str | None = None) -> int:
        self._spaces.append(_Space(size, [producer] if producer else [], [frozen] if frozen else []))
        return len(self._spaces) - 1

    def _find(self, i: int) -> int:
        while self._spaces[i].parent >= 0:
            i = self._spaces[i].parent
        return i

    def _union(self, a: int, b: int, where: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra == rb:
            return
        if a in self._parts or b in self._parts:
            # a concatenation meeting other channels: its parts keep every channel
            self._freeze(a, f"concatenated channels meet other channels at {where}")
            self._freeze(b, f"concatenated channels meet other channels at {where}")
            return
        sa, sb = self._spaces[ra], self._spaces[rb]
        sb.parent = ra
        sa.producers += sb.producers
        sa.frozen += sb.frozen

    def _freeze(self, i: int, reason: str) -> None:
        if i in self._parts:
            for part, _, _ in self._parts[i]:
                if part is not None:
                    self._freeze(part, reason)
            return
        self._spaces[self._find(i)].frozen.append(reason)

    def _freeze_info(self, info: Any, reason: str) -> None:
        for i in info if isinstance(info, list) else [info]:
            if isinstance(i, _Info):
                self._freeze(i.space, reason)

    def _block(self, space: int, block: int, where: str) -> None:
        """The channels of ``space`` go in whole blocks of ``block`` (kept whole when it cannot)."""
        if block <= 1:
            return
        if space in self._parts:
            self._freeze(space, f"concatenated channels are mixed at {where}")
            return
        sp = self._spaces[space]
        new = math.lcm(sp.block, block)
        if new >= sp.size or sp.size % new:
            self._freeze(space, f"its channels are mixed at {where}")
        else:
            sp.block = new

    def _link(self, a: int, da: Digit, b: int, db: Digit, n: int, where: str) -> None:
        """Tie ``a`` and ``b`` unit by unit: position p of one dim holds a's channel ``da(p)`` and
        b's ``db(p)`` (same space and digit: nothing to do; heads of different widths: fine)."""
        if (a, da) == (b, db):
            return
        ok = all(
            d.rep * d.count == n and s not in self._parts and d.span == self._spaces[s].size
            for s, d in ((a, da), (b, db))
        )
        if not ok:
            self._freeze(a, f"channels meet other channels differently laid out at {where}")
            self._freeze(b, f"channels meet other channels differently laid out at {where}")
            return
        lcm = math.lcm(da.rep, db.rep)
        self._block(a, da.stride * lcm // da.rep, where)
        self._block(b, db.stride * lcm // db.rep, where)
        self._union(a, b, where)

    def _drop(self, info: _Info, dims: Iterable[int], where: str) -> _Info:
        """``info`` without its digits on ``dims`` (an op mixes along them): whole blocks of their span."""
        dims = set(dims)
        for d in info.digits:
            if d.dim in dims:
                self._block(info.space, d.span, where)
        return _Info(info.space, tuple(d for d in info.digits if d.dim not in dims))

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

    def _same_layout(self, a: int, b: int) -> bool:
        return a not in self._parts and b not in self._parts and self._spaces[a].size == self._spaces[b].size

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
        if cls in ("Embedding", "EmbeddingBag"):
            return None
        return self._unknown(node, cls)

    def _keep_whole(self, node: Any, name: str, reason: str) -> None:
        """A structure kept whole: the channels it reads stay, what it returns is no layer's output."""
        for _, info in self._known(node):
            self._freeze(info.space, f"read by {name}, kept whole")
        note = f"{name} kept whole: {reason}"
        if note not in self.notes:
            self.notes.append(note)
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
            return self._produce_frozen(name, cout, out_dim, f"grouped conv {name} reads channels no layer made")
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
            self._inexact.add(info.space)
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

    # -- function rules (``ops.HANDLERS``) ----------------------------------------------------------
    def _h_size(self, node: Any) -> None:
        return None  # sizes are recomputed when the pruned model runs; new tensors hold no channels

    def _aligned(self, node: Any) -> list[tuple[Any, Any, int]]:
        """(input node, its info or None, dims it is shifted by) for each tensor input, broadcast
        against the node's output from the right."""
        rank = len(self._out_shape(node))
        return [(n, self._info.get(n), rank - len(self._shape(n))) for n in self._tensor_inputs(node)
                if self._shape(n) is not None]  # fmt: skip

    def _out_shape(self, node: Any) -> tuple[int, ...]:
        """The node's shape, or its first output's (ops returning values and indices)."""
        shape = self._shape(node)
        if shape is None:
            vals = node.meta.get("val", node.meta.get("tensor_meta"))
            first = vals[0] if isinstance(vals, (list, tuple)) and vals else None
            shape = tuple(int(d) for d in first.shape) if hasattr(first, "shape") else ()
        return shape

    def _h_elementwise(self, node: Any) -> _Info | None:
        """Broadcasting ops: the inputs' channels meet position by position (residual adds, gates,
        masks); a tensor no layer made that varies along channels is a parameter to cut with them
        (a position bias, a layer scale) or keeps them."""
        shape = self._out_shape(node)
        entries = self._aligned(node)
        tracked = [(n, _Info(i.space, tuple(d.moved(d.dim + k) for d in i.digits)), k)
                   for n, i, k in entries if isinstance(i, _Info)]  # fmt: skip
        if not tracked:
            return None
        primary = max(tracked, key=lambda t: len(t[1].digits))[1]
        keep = [d for d in primary.digits]
        for dim, n in enumerate(shape):
            if not self._tie(node, dim, n, entries, tracked):
                keep = [d for d in keep if d.dim != dim]
        return _Info(primary.space, tuple(keep))

    def _tie(self, node: Any, dim: int, n: int, entries: list, tracked: list) -> bool:
        """The inputs meet along output ``dim`` (``n`` positions): link channels that meet there, cut a
        parameter with them, or (within a unit: a head's own positions) take whole blocks. Returns
        whether the digits on ``dim`` still say which unit a position is."""
        where = node.name
        here = [(i, [d for d in i.digits if d.dim == dim]) for _, i, _ in tracked]
        here = [(i, ds) for i, ds in here if ds]
        if not here:
            return True
        varying = [(src, info, k) for src, info, k in entries
                   if 0 <= dim - k and self._shape(src)[dim - k] > 1]  # fmt: skip
        loose = [(src, k) for src, info, k in varying if not isinstance(info, _Info)]
        flat = [i for _, i, k in varying if isinstance(i, _Info) and not any(d.dim + k == dim for d in i.digits)]
        outer = all(len(ds) == 1 and ds[0].span == self._spaces[i.space].size and i.space not in self._parts
                    for i, ds in here)  # fmt: skip
        if outer and not flat:
            first, (d0,) = here[0]
            for info, (d,) in here[1:]:
                self._link(first.space, d0, info.space, d, n, where)
            if all(self._cut_param(src, dim - k, n, first.space, d0, where) for src, k in loose):
                return True
        for info, ds in here:
            for d in ds:
                self._block(info.space, d.span, where)
        return False

    def _cut_param(self, src: Any, dim: int, n: int, space: int, digit: Digit, where: str) -> bool:
        """``src`` (no layer's output) meets channels along its ``dim``: when it is a parameter seen
        through shape ops (a bias table indexed per head, a layer scale), cut it with them."""
        found = self._param_source(src, dim, tables=digit.stride > 1)
        if found is None:
            return False
        module, attr, axis = found
        key = (module, attr, axis)
        if key not in self._param_spaces:
            pspace = self._new(n)
            self._param_spaces[key] = pspace
            self.uses.append(Use(pspace, module, "param", plain(0, n), n, attr=attr, axis=axis))
        self._link(space, digit, self._param_spaces[key], Digit(digit.dim, 1, 1, n), n, where)
        return True

    def _param_source(self, node: Any, dim: int, tables: bool = False) -> tuple[str, str, int] | None:
        """(module, attribute, dim) of the parameter ``node``'s ``dim`` comes from, position for
        position, through shape-only ops; None when it does not (or is not a parameter). Through an
        embedding lookup only with ``tables`` (a bias table per head: token and position embeddings
        make the hidden size, which stays)."""
        import torch

        for _ in range(24):
            owner = self._owner(node)
            if owner is not None:
                mod = self.modules.get(owner[0])
                t = getattr(mod, owner[1], None) if mod is not None else None
                ok = isinstance(t, torch.Tensor) and t.dim() > dim and t.shape[dim] == self._shape(node)[dim]
                return (*owner, dim) if ok else None
            if not tables and getattr(node, "op", None) == "call_function" and _op_name(node) == "embedding":
                return None
            step = self._trace_step(node, dim)
            if step is None:
                return None
            node, dim = step
        return None

    def _h_same_rank(self, node: Any) -> _Info | None:
        """Pooling, interpolation, padding: channels stay where their dim keeps its size."""
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        shape, s = self._out_shape(node), self._shape(src)
        if len(shape) != len(s):
            return self._unknown(node, _op_name(node))
        changed = {d.dim for d in info.digits if s[d.dim] != shape[d.dim]}
        if changed:
            return self._unknown(node, _op_name(node))
        return info

    def _h_mix(self, node: Any) -> _Info | None:
        """Softmax, cumsum, flip... along one dim: channels on it are mixed (whole blocks)."""
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        rank = len(self._shape(src))
        dim = self._arg(node, 1, "dim", self._arg(node, 1, "dims", None))
        dims = dim if isinstance(dim, (list, tuple)) else [dim]
        if any(not isinstance(d, int) for d in dims):
            return self._unknown(node, _op_name(node))
        return self._drop(info, [d % rank for d in dims], node.name)

    def _h_reduce(self, node: Any) -> Any:
        """mean / sum / max ... over dims: channels on them are mixed; the rest move up."""
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s, shape = self._shape(src), self._out_shape(node)
        dims = self._arg(node, 1, "dim", None)
        if dims is None and _op_name(node) in ("var", "std", "var_mean", "std_mean"):
            dims = node.kwargs.get("correction_dims")
        dims = list(range(len(s))) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        if any(not isinstance(d, int) for d in dims):
            return self._unknown(node, _op_name(node))
        dims = sorted({d % len(s) for d in dims})
        out = self._drop(info, dims, node.name)
        if len(shape) != len(s):  # keepdim=False: later dims move up
            out = _Info(out.space, tuple(d.moved(d.dim - sum(x < d.dim for x in dims)) for d in out.digits))
        return out

    def _trace_step(self, node: Any, dim: int) -> tuple[Any, int] | None:
        """One op back from ``node`` toward the parameter it reads: (its input, the input's dim that
        ``dim`` is), or None when the op is not shape-only along ``dim``."""
        from ptopt.compress.prune.layout import reshape

        if getattr(node, "op", None) not in ("call_function", "call_method"):
            return None
        name = _op_name(node)
        args = node.args
        src = args[0] if args and hasattr(args[0], "op") else None
        out = self._shape(node)
        if name == "embedding":  # (weight, ids): the last dim is the weight's dim 1
            return (args[0], 1) if dim == len(out) - 1 else None
        if name == "where" and len(args) == 3:
            src = next((a for a in args[1:] if hasattr(a, "op") and self._shape(a) and
                        len(self._shape(a)) > dim - (len(out) - len(self._shape(a))) >= 0 and
                        self._shape(a)[dim - (len(out) - len(self._shape(a)))] > 1), None)  # fmt: skip
            return (src, dim - (len(out) - len(self._shape(src)))) if src is not None else None
        if src is None or self._shape(src) is None:
            return None
        s = self._shape(src)
        if name in O.HANDLERS and O.HANDLERS[name] == "elementwise":
            others = [a for a in self._tensor_inputs(node) if a is not src]
            k = dim - (len(out) - len(s))
            ok = 0 <= k and s[k] == out[dim] and not any(self._varies(a, dim, len(out)) for a in others)
            return (src, k) if ok else None
        if name in ("reshape", "view", "unsafe_view", "reshape_as", "view_as", "flatten", "unflatten"):
            back = reshape((Digit(dim, 1, 1, out[dim]),), out, s)
            ok = back is not None and len(back) == 1 and back[0].rep == 1 and back[0].count == out[dim]
            return (src, back[0].dim) if ok else None
        moved = self._move_dims(node, name, s, out)
        if moved is None:
            return None
        back = {v: k for k, v in moved.items()}
        return (src, back[dim]) if dim in back and s[back[dim]] == out[dim] else None

    def _varies(self, node: Any, dim: int, rank: int) -> bool:
        """Whether ``node`` (broadcast to ``rank`` dims) has more than one position along ``dim``."""
        s = self._shape(node) or ()
        k = dim - (rank - len(s))
        return 0 <= k < len(s) and s[k] > 1

    def _move_dims(self, node: Any, name: str, s: tuple, out: tuple) -> dict[int, int] | None:
        """Input dim -> output dim of a transpose / permute / (un)squeeze / expand / select / slice /
        index (None for an op that is none of them, or an index along more than one dim)."""
        r, args = len(s), node.args
        if name in ("transpose", "swapaxes", "swapdims", "t"):
            a, b = (args[1] % r, args[2] % r) if len(args) >= 3 else (0, 1)
            return {k: (b if k == a else a if k == b else k) for k in range(r)}
        if name == "permute":
            dims = args[1] if isinstance(args[1], (list, tuple)) else args[1:]
            return {d % r: i for i, d in enumerate(dims)}
        if name in ("movedim", "moveaxis"):
            import torch

            return {k: int(v) for k, v in enumerate(torch.arange(r).movedim(args[1], args[2]).argsort())}
        if name == "unsqueeze":
            d = args[1] % (r + 1)
            return {k: k + (k >= d) for k in range(r)}
        if name == "squeeze":
            dims = [k for k in range(r) if s[k] == 1 and len(out) < r]
            if len(args) > 1:
                given = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
                dims = [d % r for d in given if s[d % r] == 1]
            return {k: k - sum(d < k for d in dims) for k in range(r) if k not in dims}
        if name in ("expand", "expand_as", "contiguous", "clone"):
            lead = len(out) - r
            return {k: k + lead for k in range(r)}
        if name == "select":
            d = args[1] % r
            return {k: k - (k > d) for k in range(r) if k != d}
        if name in ("slice", "narrow"):
            return {k: k for k in range(r)}
        if name in ("index", "getitem") and isinstance(args[1], (list, tuple)):
            return self._index_dims(args[1], s, out)
        return None

    def _index_dims(self, indices: Any, s: tuple, out: tuple) -> dict[int, int] | None:
        """Input dim -> output dim of ``x[idx0, idx1, ...]`` (None for the dims taken whole), when one
        index tensor (or several adjacent ones) replaces the dims it indexes."""
        taken = [k for k, ix in enumerate(indices) if ix is not None and hasattr(ix, "op")]
        if not taken or taken != list(range(taken[0], taken[-1] + 1)):
            return None
        first = taken[0]
        added = len(out) - (len(s) - len(taken))
        mapping = {k: k for k in range(first)}
        mapping |= {k: k - len(taken) + added for k in range(taken[-1] + 1, len(s))}
        return mapping

    def _h_move(self, node: Any) -> _Info | None:
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s, out = self._shape(src), self._out_shape(node)
        moved = self._move_dims(node, _op_name(node), s, out)
        if moved is None or any(d.dim not in moved or out[moved[d.dim]] != s[d.dim] for d in info.digits):
            return self._unknown(node, _op_name(node))
        return _Info(info.space, tuple(d.moved(moved[d.dim]) for d in info.digits))

    def _block_split(self, node: Any, info: _Info, s: tuple, out: tuple) -> None:
        """A view that splits channels (``(B, T, C) -> (B, T, -1, head_dim)``, ``(B, N, 3, H, D)``) is
        written with the size of its innermost dim: channels then go in whole blocks of it. A size-1
        dim beside the channels is such a split (one head) where the code wrote the sizes (``view``,
        ``reshape``), not where it only matched another tensor (``reshape_as``)."""
        from ptopt.compress.prune.layout import groups

        sizes = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
        sizes = list(sizes) if len(sizes) == len(out) else []
        for gin, gout in groups(list(s), list(out)) or []:
            mine = [d for d in info.digits if d.dim in gin]
            if len(gin) != 1 or not mine or any(d.stride != 1 or d.rep != 1 for d in mine):
                continue
            big = [k for k in gout if out[k] > 1]
            one_head = bool(sizes) and any(out[k] == 1 for k in gout)
            if len(big) > 1 or (big and one_head):
                self._block(info.space, out[big[-1]], node.name)

    def _h_reshape(self, node: Any) -> _Info | None:
        """view / reshape / flatten: the digits follow (``layout.reshape``): heads split off and merged
        back, channels folded into a linear's features, a channel shuffle."""
        from ptopt.compress.prune.layout import reshape

        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s, out = self._shape(src), self._out_shape(node)
        digits = reshape(info.digits, s, out)
        if digits is None:
            return self._unknown(node, _op_name(node))
        a = len(out) - 1
        folded = [d for d in digits if d.dim == a and d.rep > 1]
        if folded and node.op != "call_module" and tuple(out) == (*s[:a], math.prod(s[a:])):
            self.flatten_nodes[node.name] = a  # may hold hard-coded sizes: see rewrite_flattens
        self._block_split(node, info, s, out)
        stack = self._stack(node)
        for d in digits:
            split = (stack[-1] if stack else "", info.space, d.stride, d.count)
            if d.stride > 1 and d.rep == 1 and split not in self.head_splits:
                self.head_splits.append(split)
        return _Info(info.space, digits)

    # -- parts: select / slice / split / getitem / cat -------------------------------------------
    def _take(self, info: _Info, dim: int, lo: int, hi: int, drop_dim: bool, where: str) -> _Info | None:
        """Positions ``lo .. hi`` of ``dim``: the same channels (the whole range), a part of the
        space (the outer digit: q, k, v of a fused projection), or positions within a unit."""
        on = [d for d in info.digits if d.dim == dim]
        rest = tuple(d if not drop_dim or d.dim < dim else d.moved(d.dim - 1) for d in info.digits if d.dim != dim)
        if not on:
            return _Info(info.space, rest)
        (d,) = on if len(on) == 1 else (None,)
        whole = d is not None and (lo, hi) == (0, d.rep * d.count) and not drop_dim
        if whole:
            return info
        size = self._size(info.space)
        if d is not None and d.rep == 1 and d.span == size and d.count * d.rep >= hi:
            if len(info.digits) > 1:  # a reshaped fused projection (B, N, 3, H, D): q, k, v alike
                self._cut_even(info.space, d.stride, d.count, where)
            part = self._cut(info.space, lo * d.stride, hi * d.stride, where)
            if part is None:
                return None
            if drop_dim or hi - lo == 1:
                return _Info(part, rest) if drop_dim else _Info(part, (*rest, Digit(dim, d.stride, 1, 1)))
            return _Info(part, (*rest, Digit(dim, d.stride, 1, hi - lo)))
        for x in on:
            self._block(info.space, x.span, where)
        return _Info(info.space, rest)

    def _cut_even(self, space: int, stride: int, count: int, where: str) -> None:
        """Cut ``space`` into ``count`` parts of ``stride`` channels, pruned alike: the code that
        splits them again (``reshape(B, N, 3, heads, -1)``, ``split(self.split_size)``) needs them
        equal."""
        parts = [self._cut(space, i * stride, (i + 1) * stride, where) for i in range(count)]
        if all(p is not None for p in parts):
            for p in parts[1:]:
                self._union(parts[0], p, where)

    def _size(self, space: int) -> int:
        return self._spaces[space].size

    def _cut(self, space: int, lo: int, hi: int, where: str) -> int | None:
        """The part of ``space`` holding channels ``lo .. hi`` (a concatenation's part, or a fresh
        split of a layer's output that nothing else is tied to); None (channels kept) otherwise."""
        if lo == 0 and hi == self._size(space):
            return space
        if space in self._parts:
            for part, at, size in self._parts[space]:
                if at <= lo and hi <= at + size and part is not None:
                    return self._cut(part, lo - at, hi - at, where)
            inside = [p for p in self._parts[space] if lo <= p[1] and p[1] + p[2] <= hi]
            if inside and sum(p[2] for p in inside) == hi - lo and all(p[0] is not None for p in inside):
                new = self._new(hi - lo)
                self._parts[new] = [(p, at - lo, n) for p, at, n in inside]
                return new
            self._freeze(space, f"part of concatenated channels taken at {where}")
            return None
        sp = self._spaces[space]
        alone = self._find(space) == space and not any(s.parent == space for s in self._spaces)
        if not alone or lo % sp.block or hi % sp.block:
            self._freeze(space, f"channels split at {where}")
            return None
        cuts = sorted({0, lo, hi, sp.size})
        parts = []
        for a, b in zip(cuts, cuts[1:], strict=False):
            p = self._new(b - a)
            self._spaces[p].producers = list(sp.producers)
            self._spaces[p].frozen = list(sp.frozen)
            self._spaces[p].block = sp.block
            if space in self._inexact:
                self._inexact.add(p)
            parts.append((p, a, b - a))
        self._parts[space] = parts
        return next(p for p, a, _ in parts if a == lo)

    def _h_select(self, node: Any) -> _Info | None:
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s = self._shape(src)
        name = _op_name(node)
        dim = self._arg(node, 1, "dim", 0) % len(s)
        if name == "select":
            i = self._arg(node, 2, "index", 0) % s[dim]
            return self._take(info, dim, i, i + 1, True, node.name)
        start = self._arg(node, 2, "start", 0) or 0
        if name == "narrow":
            lo, hi, step = start % s[dim], start % s[dim] + self._arg(node, 3, "length", 0), 1
        else:
            end = self._arg(node, 3, "end", None)
            lo, hi = max(0, min(start + s[dim] if start < 0 else start, s[dim])), s[dim]
            if end is not None:
                hi = max(lo, min(end + s[dim] if end < 0 else end, s[dim]))
            step = self._arg(node, 4, "step", 1) or 1
        if step != 1:
            return self._drop(info, [dim], node.name)
        return self._take(info, dim, lo, hi, False, node.name)

    def _h_split(self, node: Any) -> list[Any] | None:
        """split / chunk / unbind: one info per piece (``getitem`` picks it)."""
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s = self._shape(src)
        name = _op_name(node)
        dim = self._arg(node, 2 if name != "unbind" else 1, "dim", 0) % len(s)
        n = s[dim]
        if name == "unbind":
            return [self._take(info, dim, i, i + 1, True, node.name) for i in range(n)]
        if name in ("chunk", "unsafe_chunk"):
            k = self._arg(node, 1, "chunks", 1)
            step = -(-n // k)
            sizes = [min(step, n - i) for i in range(0, n, step)]
        else:
            arg = self._arg(node, 1, "split_size", self._arg(node, 1, "split_sizes", n))
            sizes = list(arg) if isinstance(arg, (list, tuple)) else [min(arg, n - i) for i in range(0, n, arg)]
        on = [d for d in info.digits if d.dim == dim]
        if len(set(sizes)) == 1 and len(sizes) > 1 and on == [Digit(dim, 1, 1, n)]:
            self._cut_even(info.space, sizes[0], len(sizes), node.name)
        out, at = [], 0
        for size in sizes:
            out.append(self._take(info, dim, at, at + size, False, node.name))
            at += size
        return out

    def _h_getitem(self, node: Any) -> Any:
        src = node.args[0]
        info = self._info.get(src)
        if isinstance(info, list) and isinstance(node.args[1], int):
            return info[node.args[1]] if node.args[1] < len(info) else None
        if isinstance(info, _Info) and self._shape(src) is not None:
            return self._basic_index(node, info, self._shape(src))
        return None

    def _basic_index(self, node: Any, info: _Info, s: tuple) -> _Info | None:
        """``x[:, 0]``, ``x[..., :n]``, ``x[:, None]`` (torch.fx): ints, slices, None and Ellipsis."""
        idx = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in idx):
            return self._unknown(node, "getitem")
        named = sum(i is not None and i is not Ellipsis for i in idx)
        if Ellipsis in idx:
            at = idx.index(Ellipsis)
            idx = idx[:at] + (slice(None),) * (len(s) - named) + idx[at + 1 :]
        shape, d, cur = list(s), 0, info
        for it in idx:
            if it is None:
                cur = _Info(cur.space, tuple(x.moved(x.dim + (x.dim >= d)) for x in cur.digits))
                shape.insert(d, 1)
                d += 1
            elif isinstance(it, int):
                i = it % shape[d]
                cur = self._take(cur, d, i, i + 1, True, node.name)
                shape.pop(d)
            else:
                lo, hi, step = it.indices(shape[d])
                cur = self._take(cur, d, lo, max(lo, hi), False, node.name) if step == 1 else self._drop(cur, [d], node.name)
                shape[d] = len(range(lo, hi, step))
                d += 1
            if cur is None:
                return None
        return cur

    def _h_index(self, node: Any) -> _Info | None:
        """``x[:, idx]`` (advanced indexing): fine along dims without channels."""
        known = self._known(node)
        if not known or known[0][0] is not node.args[0]:
            return self._unknown(node, "index") if known else None
        src, info = known[0]
        mapping = self._move_dims(node, "index", self._shape(src), self._out_shape(node))
        if mapping is None or any(d.dim not in mapping for d in info.digits):
            return self._unknown(node, "index")
        return _Info(info.space, tuple(d.moved(mapping[d.dim]) for d in info.digits))

    def _h_concat(self, node: Any) -> _Info | None:
        """Along the channels: a new space made of its inputs' channels at their offsets (a layer
        reading it cuts each part where it sits); along another dim: the inputs meet elementwise."""
        ins = [n for n in (node.args[0] if node.args else node.kwargs.get("tensors", [])) if hasattr(n, "op")]
        infos = [self._info.get(n) for n in ins]
        if not any(isinstance(i, _Info) for i in infos):
            return None
        shape = self._out_shape(node)
        dim = self._arg(node, 1, "dim", 0) % len(shape)
        if not any(d.dim == dim for i in infos if isinstance(i, _Info) for d in i.digits):
            return self._h_elementwise(node)
        parts: list[tuple[int | None, int, int]] = []
        offset = 0
        for n, info in zip(ins, infos, strict=True):
            size = self._shape(n)[dim]
            part = None
            if isinstance(info, _Info):
                if info.digits != plain(dim, size) or len(self._shape(n)) != len(shape):
                    self._freeze(info.space, f"concatenated at {node.name} in another layout")
                elif info.space in self._parts:
                    parts += [(p, offset + o, k) for p, o, k in self._parts[info.space]]
                    offset += size
                    continue
                else:
                    part = info.space
            parts.append((part, offset, size))
            offset += size
        space = self._new(offset)
        self._parts[space] = parts
        return _Info(space, plain(dim, offset))

    def _h_stack(self, node: Any) -> _Info | None:
        known = self._known(node)
        if not known:
            return None
        return self._unknown(node, "stack")

    # -- layers, norms and attention as functions ----------------------------------------------------
    def _param_module(self, node: Any) -> tuple[str, Any] | None:
        owner = self._owner(node) if hasattr(node, "op") else None
        if owner is None:
            return None
        mod = self.modules.get(owner[0])
        return (owner[0], mod) if mod is not None else None

    def _h_layer(self, node: Any) -> _Info | None:
        """``linear`` / ``conv*`` / ``convolution`` / ``addmm`` / ``mm`` reading a layer's weight (a
        subclass calling ``F.conv2d`` itself, GPT-2's ``Conv1D``)."""
        name = _op_name(node)
        x, w = (node.args[1], node.args[2]) if name == "addmm" else (node.args[0], node.args[1])
        found = self._param_module(w)
        transposed = name == "convolution" and len(node.args) > 6 and node.args[6]
        if found is None or transposed or not L.is_layer(found[1]) or self._owner(w)[1] != "weight":
            return self._unknown(node, name)
        info = self._info.get(x)
        return self._layer(node, found[0], found[1], x, info if isinstance(info, _Info) else None)

    def _h_norm(self, node: Any) -> _Info | None:
        """Functional batch_norm / layer_norm / group_norm / rms_norm (timm's BatchNormAct2d calls
        ``F.batch_norm`` itself): tied to the module whose parameters it reads."""
        op = _op_name(node)
        x = node.args[0]
        info = self._info.get(x)
        if not isinstance(info, _Info):
            return None
        want = {"batch_norm": "batch_norm", "layer_norm": "layer_norm", "rms_norm": "layer_norm",
                "group_norm": "group_norm"}[op]  # fmt: skip
        for arg in [*node.args[1:], *node.kwargs.values()]:
            found = self._param_module(arg) if hasattr(arg, "op") else None
            if found is not None and L.kind(found[1]) == want:
                return self._norm(node, found[0], found[1], want, x, info)
        if found is None and op == "batch_norm" and all(d.dim == 1 for d in info.digits):
            return info  # no parameters, no statistics: per channel
        return self._unknown(node, op)

    def _h_matmul(self, node: Any) -> _Info | None:
        """``a @ b`` of two activations (attention scores, attention times values): batch dims meet
        like an elementwise op, the contracted dim is mixed (whole heads), rows come from a,
        columns from b. With a layer's weight it is that layer."""
        a, b = node.args[0], node.args[1]
        if self._param_module(b) is not None:
            return self._h_layer(node)
        ia, ib = self._info.get(a), self._info.get(b)
        ia, ib = (i if isinstance(i, _Info) else None for i in (ia, ib))
        if ia is None and ib is None:
            return None
        sa, sb, out = self._shape(a), self._shape(b), self._out_shape(node)
        if len(sa) < 2 or len(sb) < 2:
            return self._unknown(node, "matmul")
        ra, rb, r = len(sa), len(sb), len(out)
        if ia is not None:
            ia = self._drop(ia, [ra - 1], node.name)
        if ib is not None:
            ib = self._drop(ib, [rb - 2], node.name)
        ea = _Info(ia.space, tuple(d.moved(d.dim + r - ra) for d in ia.digits)) if ia else None
        eb = _Info(ib.space, tuple(d.moved(d.dim + r - rb) for d in ib.digits)) if ib else None
        entries = [(a, ia, r - ra), (b, ib, r - rb)]
        tracked = [(n, e, k) for (n, _, k), e in zip(entries, (ea, eb), strict=True) if e is not None]
        keep: dict[int, bool] = {dim: self._tie(node, dim, out[dim], entries, tracked) for dim in range(r - 2)}
        main = eb if eb is not None and any(d.dim == r - 1 for d in eb.digits) else (ea or eb)
        other = ea if main is eb else eb
        if other is not None:
            for d in other.digits:
                if d.dim >= r - 2:  # rows of a and columns of b from two spaces: one is kept
                    self._block(other.space, d.span, node.name)
        digits = [d for d in main.digits if (d.dim >= r - 2 or keep.get(d.dim, True))]
        if main is eb:
            digits = [d for d in digits if d.dim != r - 2]
        else:
            digits = [d for d in digits if d.dim != r - 1]
        return _Info(main.space, tuple(digits))

    def _h_sdpa(self, node: Any) -> _Info | None:
        """``scaled_dot_product_attention(q, k, v, mask)``: q, k and v heads are cut together (with
        grouped-query attention a kv head goes with its q heads), a head's own dim is mixed, the
        mask (a position bias table per head) is cut with them; the output has v's channels."""
        q, k, v = node.args[:3]
        mask = self._arg(node, 3, "attn_mask", None)
        infos = [self._info.get(n) for n in (q, k, v)]
        infos = [i if isinstance(i, _Info) else None for i in infos]
        out = self._out_shape(node)
        r = len(out)
        if r < 3:
            return self._unknown(node, "scaled_dot_product_attention")
        for n, info in zip((q, k, v), infos, strict=True):
            if info is not None and any(d.dim == r - 2 for d in info.digits):
                return self._unknown(node, "scaled_dot_product_attention")
        iq, ik, iv = infos
        if iq is not None:
            iq = self._drop(iq, [r - 1], node.name)
        if ik is not None:
            ik = self._drop(ik, [r - 1], node.name)
        hq = self._shape(q)[r - 3]
        entries = []
        for n, info in ((q, iq), (k, ik), (v, iv)):
            rep = hq // self._shape(n)[r - 3]
            if info is not None and rep > 1:  # grouped-query attention: kv head h serves q heads h*rep..
                info = _Info(info.space, tuple(Digit(d.dim, d.stride, d.rep * rep, d.count) if d.dim == r - 3 else d
                                              for d in info.digits))  # fmt: skip
            entries.append((n, info, 0))
        if hasattr(mask, "op") and self._shape(mask) is not None:
            entries.append((mask, self._info.get(mask), r - len(self._shape(mask))))
        tracked = [(n, i, k) for n, i, k in entries if isinstance(i, _Info)]
        if not tracked:
            return None
        kept = [dim for dim in range(r - 2) if self._tie(node, dim, out[dim], entries, tracked)]
        v_out = entries[2][1]
        if v_out is None:
            return None
        return _Info(v_out.space, tuple(d for d in v_out.digits if d.dim in kept or d.dim >= r - 2))

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
        self, exclude: Iterable[str] = (), reasons: dict[str, str] | None = None, whole: dict[str, str] | None = None
    ) -> list[ChannelGroup]:
        """Channel groups after all links; layers in ``exclude`` (names) keep their output channels
        (``reasons[name]`` says why, default "NAME excluded"), and so does every channel tied to them.
        ``whole``: module types (``"*"``: modules splitting channels into heads) whose layers keep
        every channel they read or make."""
        exclude = set(exclude)
        for use in self.uses:
            if use.module in exclude and use.role in ("out", "depthwise", "norm", "grouped"):
                self._freeze(use.space, (reasons or {}).get(use.module, f"{use.module} excluded"))
        self._keep_types(whole or {})
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
                size=self._spaces[first].size,
            )
            self._group_index[root] = len(out)
            out.append(g)
        #: every group, indexed as :meth:`resolve` says
        self.all_groups = out
        return [g for g in out if g.producers or len(g.members) > 1]

    def _keep_types(self, whole: dict[str, str]) -> None:
        if not whole:
            return
        inside = {p for p, m in self.modules.items() if type(m).__name__ in whole}
        for path, space, _, _ in self.head_splits:
            if "*" in whole or path in inside:
                self._freeze(space, f"{type(self.modules.get(path)).__name__} kept whole")
        for use in self.uses:
            parts = use.module.split(".")
            owner = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in inside), None)
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
            for r in ([root] if root not in self._parts else [self._find(p) for p, _, _ in self._parts[root] if p is not None]):
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
