"""The channel-dependency graph behind structured pruning, read from the model's own graph.

``torch.fx`` trace + shape propagation, not per-architecture code (the rules are listed in
``ptopt.compress.prune.techniques.structured``): which layers produce, consume, keep or join channel spaces,
grouped so that coupled channels (residual additions, depthwise convs) are pruned together, and
which channels may never be pruned (model inputs/outputs, concatenations, parameters met directly).
An op the analysis does not know that touches prunable channels is an ``UnsupportedModelError``
naming the op and the layer.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable
from typing import Any

from ptopt.compress.prune.attention import attention_unit
from ptopt.core.errors import UnsupportedModelError

# -- what the analysis knows about ops ------------------------------------------------------------

#: call_function / call_method names that keep the channel layout of their (first) tensor input,
#: or combine several same-layout tensors elementwise (with broadcasting)
_ELEMENTWISE_NAMES = {
    "add",
    "sub",
    "mul",
    "truediv",
    "div",
    "iadd",
    "isub",
    "imul",
    "itruediv",
    "neg",
    "abs",
    "pos",
    "relu",
    "relu_",
    "relu6",
    "gelu",
    "silu",
    "silu_",
    "sigmoid",
    "sigmoid_",
    "tanh",
    "tanh_",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "hardtanh_",
    "leaky_relu",
    "leaky_relu_",
    "elu",
    "selu",
    "celu",
    "mish",
    "softplus",
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "alpha_dropout",
    "feature_alpha_dropout",
    "clamp",
    "clamp_",
    "clip",
    "clamp_min",
    "clamp_max",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "pow",
    "square",
    "contiguous",
    "clone",
    "detach",
    "float",
    "to",
    "type_as",
    "add_",
    "mul_",
    "sub_",
    "div_",
    "maximum",
    "minimum",
    "where",
    "softmax",
    "log_softmax",
    "erf",
    "sin",
    "cos",
    "reciprocal",
    # torchvision's stochastic depth drops whole samples (rows), never single channels
    "stochastic_depth",
    # ATen spellings (torch.export graphs) of the same channel-preserving ops
    "alias",
    "to_copy",
    "lift_fresh_copy",
    "feature_dropout",
    "rsub",
    "masked_fill",
    "expand",
    "expand_as",
    "gelu_",
}
#: ops that only touch spatial / sequence dims when the channel dim keeps its size
_SPATIAL_NAMES = {
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "adaptive_max_pool3d",
    "lp_pool2d",
    "interpolate",
    "upsample",
    "pad",
    "pixel_shuffle_never",
}
_RESHAPE_NAMES = {"flatten", "view", "reshape"}
_REDUCE_NAMES = {"mean", "sum", "amax", "amin"}
_CONCAT_NAMES = {"cat", "concat", "concatenate"}
#: ops returning sizes: recomputed when the pruned model runs, so they need nothing
_SIZE_NAMES = {
    "size",
    "dim",
    "getattr",
    "numel",
    "shape",
    "ndimension",
    "sym_size",
    "sym_numel",
    "assert_tensor_metadata",
    "assert_scalar",
}
#: ops that move the channel axis (handled by ``_move_axis``)
_AXIS_NAMES = {"transpose", "permute", "unsqueeze", "squeeze", "select", "slice", "t"}

_PASSTHROUGH_MODULES = {
    "ReLU",
    "ReLU6",
    "GELU",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "Hardswish",
    "Hardsigmoid",
    "Hardtanh",
    "LeakyReLU",
    "ELU",
    "SELU",
    "CELU",
    "Mish",
    "Softplus",
    "PReLU_never",
    "Identity",
    "StochasticDepth",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
    "Dropout3d",
    "AlphaDropout",
    "Softmax",
    "LogSoftmax",
}
_SPATIAL_MODULES = {
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "Upsample",
    "UpsamplingNearest2d",
    "UpsamplingBilinear2d",
    "ZeroPad2d",
    "ConstantPad2d",
    "ReflectionPad2d",
}
_CONV_TYPES = {"Conv1d", "Conv2d", "Conv3d"}
_BN_TYPES = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d"}


def _op_name(node: Any) -> str:
    """``add`` for ``operator.add``, ``x.add_``, ``torch.add`` and ATen's ``aten.add_.Tensor`` alike."""
    t = node.target
    if isinstance(t, str):
        return t
    if hasattr(t, "_opname"):  # an ATen OpOverload: the op without its overload name
        return t._opname.strip("_")
    return getattr(t, "__name__", str(t)).strip("_")


# -- channel spaces and their groups --------------------------------------------------------------


@dataclasses.dataclass
class _Space:
    size: int
    producers: list[str] = dataclasses.field(
        default_factory=list
    )  # layers whose output rows are these channels
    frozen: list[str] = dataclasses.field(default_factory=list)  # why these channels must stay
    parent: int = -1
    #: channels are removed in whole blocks of this many (attention heads, GroupNorm groups)
    block: int = 1
    #: (module, kind) whose attributes follow the kept count (``prune_attention.set_count``)
    updates: list[tuple[str, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Info:
    """Where a tensor's channels live: space id, the axis holding them, features per channel on that axis."""

    space: int
    axis: int
    inner: int = 1


@dataclasses.dataclass
class ChannelGroup:
    """Channels pruned together (joined by residual adds, depthwise convs...), ranked as one."""

    producers: list[str]
    size: int
    frozen: list[str]
    #: (module name, role, features per channel, channel offset) of every module whose weights are
    #: sliced by this group; the offset places a concatenated (or fused q/k/v) part in the dimension
    users: list[tuple[str, str, int, int]]
    #: channels go in whole blocks of this many (attention heads, GroupNorm groups)
    block: int = 1
    #: (module, kind): attributes to set from the kept count (heads, groups)
    updates: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def prunable(self) -> bool:
        return not self.frozen and bool(self.producers) and self.size // self.block > 1


class ChannelGraph:
    """Channel dependencies of a traced model (see the module docstring)."""

    #: the graph the analysis read (``fx`` here, ``export`` for ``prune_graph.ATenChannelGraph``)
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
        self.modules = dict(self.gm.named_modules())
        self._analyse()

    def _analyse(self) -> None:
        """Visit every node of ``self.gm.graph`` once, in order (``self.modules`` set)."""
        self._spaces: list[_Space] = []
        self._users: list[tuple[int, str, str, int, int]] = []  # (space, module, role, inner, offset)
        self._unresolved: list[tuple[str, str, list[int]]] = []  # (node, op, spaces)
        self._module_out: dict[str, int] = {}
        self._module_in: dict[str, int] = {}
        self.producer_order: list[str] = []
        #: structures kept whole by themselves (printed, the rest is pruned)
        self.notes: list[str] = []
        #: view/reshape nodes that flatten channels into features: node name -> start dim
        self.flatten_nodes: dict[str, int] = {}
        self._info: dict[Any, _Info | None] = {}
        #: concatenation space -> its parts (space or None for channels no layer made, offset, size)
        self._parts: dict[int, list[tuple[int | None, int, int]]] = {}
        for node in self.gm.graph.nodes:
            self._info[node] = self._visit(node)

    # -- union-find ----------------------------------------------------------------------------
    def _new(self, size: int, producer: str | None = None, frozen: str | None = None, block: int = 1) -> int:
        self._spaces.append(
            _Space(size, [producer] if producer else [], [frozen] if frozen else [], block=block)
        )
        return len(self._spaces) - 1

    def _find(self, i: int) -> int:
        while self._spaces[i].parent >= 0:
            i = self._spaces[i].parent
        return i

    def _union(self, a: int, b: int, where: str) -> int:
        ra, rb = self._find(a), self._find(b)
        if ra == rb:
            return ra
        sa, sb = self._spaces[ra], self._spaces[rb]
        if sa.size != sb.size:
            raise UnsupportedModelError(
                f"structured pruning: channels of different sizes ({sa.size} vs {sb.size}) "
                f"meet at {where}; cannot resolve the dependency"
            )
        if ra in self._parts or rb in self._parts:
            # a concatenation meeting other channels elementwise: its parts keep every channel
            self._freeze(ra, f"concatenated channels meet other channels at {where}")
            self._freeze(rb, f"concatenated channels meet other channels at {where}")
            return ra
        sb.parent = ra
        sa.producers += sb.producers
        sa.frozen += sb.frozen
        sa.updates += sb.updates
        block = math.lcm(sa.block, sb.block)
        if sa.size % block:
            sa.frozen.append(f"blocks of {sa.block} and {sb.block} channels meet at {where}")
        sa.block = block
        return ra

    def _freeze(self, i: int, reason: str) -> None:
        root = self._find(i)
        self._spaces[root].frozen.append(reason)
        for part, _, _ in self._parts.get(root, ()):
            if part is not None:
                self._freeze(part, reason)

    def _expand_parts(self, i: int) -> list[int]:
        """The spaces behind ``i``: its concatenated parts, or itself."""
        root = self._find(i)
        if root not in self._parts:
            return [root]
        return [p for p, _, _ in self._parts[root] if p is not None]

    # -- per-node rules ------------------------------------------------------------------------
    @staticmethod
    def _shape(node: Any) -> tuple[int, ...] | None:
        meta = node.meta.get("tensor_meta") if hasattr(node, "meta") else None
        shape = getattr(meta, "shape", None)
        return tuple(shape) if shape is not None else None

    def _tensor_inputs(self, node: Any) -> list[Any]:
        import torch.fx

        out: list[Any] = []
        torch.fx.node.map_arg(
            (node.args, node.kwargs), lambda n: out.append(n) if self._shape(n) is not None else None
        )
        return out

    def _live(self, node: Any) -> list[int]:
        """Spaces carried by the node's tensor inputs."""
        infos = [self._info.get(n) for n in self._tensor_inputs(node)]
        return [s for i in infos if i is not None for s in self._expand_parts(i.space)]

    def _unknown(self, node: Any, what: str) -> None:
        spaces = self._live(node)
        if spaces:
            self._unresolved.append((node.name, what, spaces))
        return None

    def _visit(self, node: Any) -> _Info | None:
        shape = self._shape(node)
        if node.op == "placeholder" or node.op == "get_attr":
            return None
        if node.op == "output":
            for n in self._tensor_inputs(node):
                info = self._info.get(n)
                if info is not None:
                    self._freeze(info.space, "reaches the model output")
            return None
        if shape is None:  # not one tensor: sizes (recomputed at run time, fine), tuples (unknown layout)
            if node.op == "call_module":
                mod = self.modules[node.target]
                if type(mod).__name__ == "MultiheadAttention":  # returns (output, weights)
                    return self._keep_whole(node, node.target, attention_unit(node.target, mod).reason)
                return self._unknown(node, type(mod).__name__)
            if _op_name(node) not in _SIZE_NAMES:
                return self._unknown(node, _op_name(node))
            return None
        if node.op == "call_module":
            return self._visit_module(node, shape)
        return self._visit_function(node, shape)

    def _visit_function(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        name = _op_name(node)
        if name in _CONCAT_NAMES:
            return self._concat(node, shape)
        if name in _AXIS_NAMES:
            return self._move_axis(node, name, shape)
        if name in _RESHAPE_NAMES:
            return self._reshape(node, shape)
        if name in _REDUCE_NAMES:
            return self._reduce(node, shape)
        if name in _SPATIAL_NAMES:
            return self._spatial(node, shape)
        if name in _ELEMENTWISE_NAMES or node.target in (
            operator.add,
            operator.sub,
            operator.mul,
            operator.truediv,
        ):
            return self._elementwise(node, shape)
        return self._unknown(node, name)

    def _first_info(self, node: Any) -> tuple[Any, _Info | None]:
        ins = self._tensor_inputs(node)
        if not ins:
            return None, None
        return ins[0], self._info.get(ins[0])

    def _spatial(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        src, info = self._first_info(node)
        if info is None:
            return None
        if len(shape) == len(self._shape(src)) and shape[info.axis] == self._shape(src)[info.axis]:
            return info
        return self._unknown(node, _op_name(node))

    def _elementwise(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        ins = self._tensor_inputs(node)
        infos = [(n, self._info.get(n)) for n in ins]
        known = [(n, i) for n, i in infos if i is not None]
        if not known:
            return None
        ref_node, ref = known[0]
        from_right = len(self._shape(ref_node)) - ref.axis
        axis = len(shape) - from_right
        if axis < 0 or shape[axis] != self._shape(ref_node)[ref.axis]:
            return self._unknown(node, _op_name(node))
        space = ref.space
        for n, info in infos:
            s = self._shape(n)
            k = len(s) - from_right
            size = s[k] if 0 <= k < len(s) else 1
            if size == 1:
                continue  # broadcast along the channel axis: nothing to slice
            if info is None:
                self._freeze(space, f"meets a tensor that is not a layer output at {node.name}")
                continue
            if len(s) - info.axis != from_right or info.inner != ref.inner:
                return self._unknown(node, _op_name(node))
            space = self._union(space, info.space, node.name)
        return _Info(space, axis, ref.inner)

    def _concat(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        """Along the channel axis: a new space made of its inputs' channels at their offsets (a layer
        consuming it slices each part where it sits); along another axis: elementwise."""
        ins = self._tensor_inputs(node)
        infos = [self._info.get(n) for n in ins]
        known = [i for i in infos if i is not None]
        if not known:
            return None
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0) % len(shape)
        if dim != known[0].axis:
            return self._elementwise(node, shape)
        parts: list[tuple[int | None, int, int]] = []
        offset = 0
        for n, info in zip(ins, infos, strict=True):
            size = self._shape(n)[dim]
            if info is not None and (info.axis != dim or info.inner != 1):
                return self._unknown(node, _op_name(node))
            root = self._find(info.space) if info is not None else None
            if root in self._parts:  # a concatenation of concatenations: flatten it
                parts += [(p, offset + o, k) for p, o, k in self._parts[root]]
            else:
                parts.append((root, offset, size))
            offset += size
        space = self._new(offset)
        self._parts[space] = parts
        return _Info(space, dim)

    def _move_axis(self, node: Any, name: str, shape: tuple[int, ...]) -> _Info | None:
        """transpose / permute / (un)squeeze / select / slice: where the channel axis goes (an op along
        the channel axis itself is unknown)."""
        src, info = self._first_info(node)
        if info is None:
            return None
        s, a = self._shape(src), info.axis
        args = [x for x in node.args[1:] if isinstance(x, (int, list, tuple))]
        flat = [int(v) for x in args for v in (x if isinstance(x, (list, tuple)) else [x])]
        dims = [d % max(len(s), 1) for d in flat]
        new_axis = None
        if name in ("transpose", "t"):
            d0, d1 = dims[:2] if len(dims) >= 2 else (0, 1)
            new_axis = d1 if a == d0 else d0 if a == d1 else a
        elif name == "permute" and len(dims) == len(s):
            new_axis = dims.index(a)
        elif name == "unsqueeze" and flat:
            d = flat[0] % (len(s) + 1)
            new_axis = a + (d <= a)
        elif name == "squeeze":
            removed = [d for d in (dims or range(len(s))) if s[d] == 1]
            new_axis = None if a in removed else a - sum(d < a for d in removed)
        elif name in ("select", "slice") and dims and dims[0] != a:
            keep = name == "slice" or dims[0] > a
            new_axis = a if keep else a - 1
        if new_axis is None or new_axis >= len(shape) or shape[new_axis] != s[a]:
            return self._unknown(node, name)
        return _Info(info.space, new_axis, info.inner)

    def _reshape(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        src, info = self._first_info(node)
        if info is None:
            return None
        s = self._shape(src)
        a = info.axis
        if s == shape:
            return info
        if tuple(s[:a]) == tuple(shape[:a]) and len(shape) > a:
            # channels (with what follows them) folded into one feature axis: c·S + j
            for j in range(a + 1, len(s) + 1):
                if math.prod(s[a:j]) == shape[a] and tuple(s[j:]) == tuple(shape[a + 1 :]):
                    if j == len(s) and len(shape) == a + 1 and node.op != "call_module":
                        self.flatten_nodes[node.name] = a  # may hold hard-coded sizes: see rewrite_flattens
                    return _Info(info.space, a, info.inner * math.prod(s[a + 1 : j]))
        return self._unknown(node, _op_name(node))

    def _reduce(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        src, info = self._first_info(node)
        if info is None:
            return None
        s = self._shape(src)
        dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
        if dims is None:
            return self._unknown(node, _op_name(node))
        dims = [d % len(s) for d in ((dims,) if isinstance(dims, int) else dims)]
        if info.axis in dims or info.inner != 1:
            return self._unknown(node, _op_name(node))
        if len(shape) == len(s):
            return info
        return _Info(info.space, info.axis - sum(d < info.axis for d in dims), info.inner)

    def _visit_module(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        name = node.target
        mod = self.modules[name]
        kind = type(mod).__name__
        src, info = self._first_info(node)
        if kind in _CONV_TYPES or kind == "Linear":
            return self._visit_layer(node, name, mod, kind, src, info, shape)
        if kind in _BN_TYPES or kind in ("LayerNorm", "GroupNorm"):
            return self._visit_norm(node, name, mod, kind, src, info)
        if kind in _PASSTHROUGH_MODULES:
            return info
        if kind in _SPATIAL_MODULES:
            return self._spatial(node, shape)
        if kind in ("Flatten", "Unflatten"):
            return self._reshape(node, shape)
        return self._unknown(node, kind)

    def _keep_whole(self, node: Any, name: str, reason: str) -> None:
        """A structure kept whole: the channels it reads stay, what it returns is no layer's output."""
        for space in self._live(node):
            self._freeze(space, f"read by {name}, kept whole")
        note = f"{name} kept whole: {reason}"
        if note not in self.notes:
            self.notes.append(note)
        return None

    def _visit_norm(self, node: Any, name: str, mod: Any, kind: str, src: Any, info: _Info | None):
        """BatchNorm (channel axis 1), LayerNorm over the channel (last) axis, GroupNorm (axis 1, whole
        groups: the space is pruned in blocks of channels-per-group, ``num_groups`` follows)."""
        if info is None:
            return None
        rank = len(self._shape(src))
        if kind == "LayerNorm":
            ndim = len(mod.normalized_shape)
            if info.axis < rank - ndim:
                return info
            if not (ndim == 1 and info.axis == rank - 1 and mod.elementwise_affine):
                return self._unknown(node, kind)
        elif info.axis != 1 or (kind == "GroupNorm" and info.inner != 1):
            return self._unknown(node, kind)
        if kind == "GroupNorm":
            if not mod.affine:
                return self._unknown(node, kind)
            self._block(info.space, mod.num_channels // mod.num_groups, name)
        self._users.append((info.space, name, "norm", info.inner, 0))
        self._remember_input(name, info.space)
        return info

    def _block(self, space: int, block: int, where: str) -> None:
        """Channels of ``space`` go in whole blocks of ``block`` (GroupNorm groups, conv groups)."""
        sp = self._spaces[self._find(space)]
        new = math.lcm(sp.block, block)
        if sp.size % new:
            self._freeze(space, f"blocks of {sp.block} and {block} channels meet at {where}")
        else:
            sp.block = new

    def _remember_input(self, name: str, space: int) -> None:
        if name in self._module_in:  # a layer called twice: both inputs must be sliced alike
            self._union(self._module_in[name], space, name)
        else:
            self._module_in[name] = space

    def _visit_layer(self, node, name, mod, kind, src, info, shape) -> _Info | None:
        in_shape = self._shape(src) if src is not None else None
        if kind == "Linear":
            axis_ok = info is None or info.axis == len(in_shape) - 1
            out_axis = len(shape) - 1
            out_size = mod.out_features
        else:
            axis_ok = info is None or (info.axis == 1 and info.inner == 1)
            out_axis = 1
            out_size = mod.out_channels
        if not axis_ok:
            return self._unknown(node, kind)
        groups = getattr(mod, "groups", 1)
        if kind in _CONV_TYPES and groups > 1:
            if groups == mod.in_channels == mod.out_channels:  # depthwise: keeps its input's channels
                if info is None:
                    return None
                self._users.append((info.space, name, "depthwise", 1, 0))
                self._remember_input(name, info.space)
                return info
            if info is not None and mod.in_channels == mod.out_channels and info.inner == 1:
                # grouped, channels in = out: output group j reads input group j, so whole groups
                # go together and the conv keeps its input's channel space
                self._block(info.space, mod.in_channels // groups, name)
                self._users.append((info.space, name, "grouped", 1, 0))
                self._remember_input(name, info.space)
                return info
            if info is not None:
                self._freeze(info.space, f"feeds grouped conv {name} (groups={groups})")
            return _Info(
                self._module_out.setdefault(name, self._new(out_size, frozen=f"grouped conv {name}")),
                out_axis,
            )
        if info is not None:
            self._users.append((info.space, name, "in", info.inner, 0))
            self._remember_input(name, info.space)
        if name not in self._module_out:
            self._module_out[name] = self._new(out_size, producer=name)
            self._users.append((self._module_out[name], name, "out", 1, 0))
            self.producer_order.append(name)
        return _Info(self._module_out[name], out_axis)

    def executed_layers(self) -> list[str]:
        """The modules with a weight matrix (conv, linear, recurrent, embedding) in the order the
        traced graph runs them."""
        import torch

        out = []
        for node in self.gm.graph.nodes:
            if node.op != "call_module" or node.target in out:
                continue
            m = self.modules[node.target]
            if isinstance(m, torch.nn.RNNBase) or any(p.dim() >= 2 for p in m.parameters(recurse=False)):
                out.append(node.target)
        return out

    def rewrite_flattens(self) -> Any:
        """The traced module with every channel-flattening view/reshape (``x.view(-1, 400)``, whose
        sizes are baked in) turned into ``torch.flatten(x, dim)``, which follows the pruned sizes."""
        import torch

        graph = self.gm.graph
        for node in list(graph.nodes):
            if node.name in self.flatten_nodes:
                with graph.inserting_before(node):
                    new = graph.call_function(torch.flatten, (node.args[0], self.flatten_nodes[node.name]))
                node.replace_all_uses_with(new)
                graph.erase_node(node)
        self.gm.recompile()
        return self.gm

    # -- results -------------------------------------------------------------------------------
    def _refuse_unresolved(self) -> None:
        """UnsupportedModelError naming *every* group whose channels reach an op the analysis does
        not know, and one ``--exclude`` (a glob when the layers share a pattern) that keeps all of
        them: excluding a group's first layer freezes the whole group, so the suggestion holds."""
        stuck: dict[int, tuple[str, str, str]] = {}  # root -> (first layer, op, node)
        for node_name, op, spaces in self._unresolved:
            for s in spaces:
                root = self._find(s)
                sp = self._spaces[root]
                if not sp.frozen and sp.producers and root not in stuck:
                    stuck[root] = (sp.producers[0], op, node_name)
        if not stuck:
            return
        firsts = [first for first, _, _ in stuck.values()]
        kept = {n for r in stuck for n in self._spaces[r].producers}
        where = "; ".join(
            f"layer{'s' if len(self._spaces[r].producers) > 1 else ''} {', '.join(self._spaces[r].producers)}: "
            f"channels reach {op!r} (graph node {node})"
            for r, (_, op, node) in list(stuck.items())[:4]
        )
        more = f" and {len(stuck) - 4} more" if len(stuck) > 4 else ""
        raise UnsupportedModelError(
            f"structured pruning cannot resolve the channel dependencies of {len(stuck)} layer group(s): "
            f"{where}{more}, which ptopt does not know how to shrink; keep them and prune the rest with "
            f"{exclude_flags(firsts, self.producer_order, kept)}"
        )

    def groups(
        self, exclude: Iterable[str] = (), reasons: dict[str, str] | None = None
    ) -> list[ChannelGroup]:
        """Channel groups after all unions; layers in ``exclude`` (names) freeze their group
        (``reasons[name]`` says why, default "NAME excluded").

        Raises UnsupportedModelError naming the op and layer when an op the analysis does not
        understand touches channels that would otherwise be pruned.
        """
        exclude = set(exclude)
        for space, module, role, _, _ in self._users:
            if module in exclude and role in ("out", "depthwise", "norm", "grouped"):
                self._freeze(space, (reasons or {}).get(module, f"{module} excluded"))
        self._refuse_unresolved()
        by_root: dict[int, ChannelGroup] = {}
        for i in range(len(self._spaces)):
            r = self._find(i)
            if r not in by_root:
                sp = self._spaces[r]
                by_root[r] = ChannelGroup(
                    list(dict.fromkeys(sp.producers)),
                    sp.size,
                    list(dict.fromkeys(sp.frozen)),
                    [],
                    sp.block,
                    list(dict.fromkeys(sp.updates)),
                )
        for space, module, role, inner, offset in self._users:
            root = self._find(space)
            for part, at, _ in self._parts.get(root, [(root, 0, 0)]):
                if part is not None:
                    by_root[self._find(part)].users.append((module, role, inner, offset + at))
        return [g for g in by_root.values() if g.producers or g.users]


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
