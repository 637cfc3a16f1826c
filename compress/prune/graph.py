"""The channel analysis on torch.export's ATen graph: models torch.fx cannot trace, and attention.

``torch.export.export(model, args, strict=False)`` runs the model's Python once with fake tensors and
records every ATen op it reaches, so it captures what fx cannot (Hugging Face models with dynamic
slicing, data-dependent Python that is fixed for the example's shapes) and shows the model as it
runs in eval mode (dropout and stochastic depth are gone). Every parameter is a graph input whose
name maps back to its module (``graph_signature.inputs_to_parameters``), and every node carries the
``nn_module_stack`` of the modules it ran inside: a conv / linear / norm op is tied to the module
whose weights it reads, and nodes inside an attention module (``prune_attention``) are read as one
unit whose heads go whole.

The rules are ``ptopt.compress.prune.channel_graph``'s (the same union-find of channel spaces); this
module adds the ATen spellings and the attention units. The analysis holds for the example's
shapes: a model whose Python branches on shapes may take another path on other inputs.
"""

from __future__ import annotations

from typing import Any

from ptopt.compress.prune.attention import AttentionUnit, attention_unit
from ptopt.compress.prune.channel_graph import (
    _BN_TYPES,
    _CONV_TYPES,
    _SPATIAL_NAMES,
    ChannelGraph,
    _Info,
    _op_name,
)
from ptopt.core.errors import UnsupportedModelError

_LAYER_OPS = {"conv1d", "conv2d", "conv3d", "convolution", "linear"}
_NORM_OPS = {"batch_norm", "layer_norm", "group_norm"}
#: ops that only touch spatial / sequence dims: the fx graph's names plus the ATen spellings of
#: padding and upsampling (and ``expand``/``gelu_``, which keep the channel dim)
_SPATIAL_OPS = _SPATIAL_NAMES | {
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_bilinear2d",
    "upsample_bicubic2d",
    "constant_pad_nd",
    "reflection_pad2d",
    "replication_pad2d",
    "pad",
    "expand",
    "expand_as",
    "gelu_",
}
_RESHAPE_OPS = {"view", "reshape", "flatten", "unsafe_view"}


def export_graph(model: Any, example_inputs: Any) -> Any:
    """``torch.export.export(model, example, strict=False)``; UnsupportedModelError when it fails."""
    import torch

    from ptopt.core.inputspec import call_args
    from ptopt.core.quiet import silenced

    args, kwargs = call_args(example_inputs)
    try:
        # a failed export logs the partial graph (and warns) through torch's loggers: ptopt says why
        with silenced(["torch"], streams=True):
            return torch.export.export(model, tuple(args), kwargs=kwargs, strict=False)
    except Exception as e:  # noqa: BLE001 - export fails in many ways (data-dependent control flow, ...)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        err = UnsupportedModelError(
            f"structured pruning needs the model's graph, but torch.export cannot capture "
            f"{type(model).__name__}: {reason[:300]} (l1-unstructured and global pruning need no graph)"
        )
        err.capture_reason = reason[:300]
        raise err from None


class ATenChannelGraph(ChannelGraph):
    """Channel dependencies read from ``torch.export``'s ATen graph (see the module docstring)."""

    kind = "export"

    def __init__(self, model: Any, example_inputs: Any):
        self.model = model
        ep = export_graph(model, example_inputs)
        self.gm = ep.graph_module
        sig = ep.graph_signature
        #: graph input (placeholder) name -> the module owning that parameter / buffer
        self._fqn = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
        self._owner = {ph: fqn.rpartition(".")[0] for ph, fqn in self._fqn.items()}
        self.modules = dict(model.named_modules())
        self._units: dict[str, AttentionUnit | None] = {}
        self._heads: dict[str, int] = {}  # unit path -> its head space
        self._analyse()

    # -- mapping ops back to modules ---------------------------------------------------------------
    def _module_of(self, arg: Any) -> str | None:
        name = getattr(arg, "name", None)
        return self._owner.get(name) if name is not None else None

    def _unit_of(self, node: Any) -> AttentionUnit | None:
        """The outermost attention unit ``node`` ran inside, if any."""
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            if path not in self._units:
                mod = self.modules.get(path)
                self._units[path] = attention_unit(path, mod) if mod is not None and path else None
            if self._units[path] is not None:
                return self._units[path]
        return None

    def executed_layers(self) -> list[str]:
        """Modules with a weight matrix (conv, linear, recurrent, embedding), in the order the graph
        first reads their parameters."""
        import torch

        out: list[str] = []
        for node in self.gm.graph.nodes:
            if node.op != "call_function":
                continue
            for arg in node.all_input_nodes:
                name = self._module_of(arg)
                m = self.modules.get(name) if name is not None else None
                if m is None or name in out:
                    continue
                if isinstance(m, torch.nn.RNNBase) or any(p.dim() >= 2 for p in m.parameters(recurse=False)):
                    out.append(name)
        return out

    def rewrite_flattens(self) -> Any:
        raise UnsupportedModelError(
            "structured pruning: the pruned model's forward does not follow the new sizes "
            "(a hard-coded shape?) and the torch.export graph cannot be rewritten; --exclude the layer "
            "before it"
        )

    # -- per-node rules ----------------------------------------------------------------------------
    @staticmethod
    def _shape(node: Any) -> tuple[int, ...] | None:
        val = node.meta.get("val") if hasattr(node, "meta") else None
        shape = getattr(val, "shape", None)
        if shape is None:
            return None
        try:
            return tuple(int(d) for d in shape)
        except TypeError:  # a symbolic size: not a shape the rules can compare
            return None

    def _visit(self, node: Any) -> _Info | None:
        if node.op == "call_function":
            unit = self._unit_of(node)
            if unit is not None:
                return self._visit_unit(node, unit)
        return super()._visit(node)

    def _visit_function(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        name = _op_name(node)
        if name in _LAYER_OPS:
            return self._visit_aten_layer(node, name, shape)
        if name in _NORM_OPS:
            return self._visit_aten_norm(node, name)
        if name in _SPATIAL_OPS:
            return self._spatial(node, shape)
        if name in _RESHAPE_OPS:
            return self._reshape_or_squeeze(node, shape)
        if name != "embedding":
            self._note_weights(node, name)
        return super()._visit_function(node, shape)

    def _note_weights(self, node: Any, op: str) -> None:
        """A weight matrix read by an op the rules do not prune (GPT-2's ``Conv1D`` via ``addmm``):
        say so once per module type, since its channels are silently kept."""
        for arg in node.all_input_nodes:
            name = self._module_of(arg)
            mod = self.modules.get(name) if name is not None else None
            weight = getattr(mod, "weight", None)
            if weight is None or weight.dim() < 2 or self._fqn.get(arg.name) != f"{name}.weight":
                continue
            kind = type(mod).__name__
            if not any(n.startswith(f"{kind} layers") for n in self.notes):
                self.notes.append(
                    f"{kind} layers (e.g. {name}) are read by {op!r}, which ptopt does not prune"
                )

    def _visit_aten_layer(self, node: Any, op: str, shape: tuple[int, ...]) -> _Info | None:
        name = self._module_of(node.args[1])
        mod = self.modules.get(name) if name is not None else None
        kind = type(mod).__name__
        transposed = op == "convolution" and len(node.args) > 6 and node.args[6]
        if mod is None or transposed or (kind not in _CONV_TYPES and kind != "Linear"):
            return self._unknown(node, op if mod is None else kind)
        src = node.args[0]
        return self._visit_layer(node, name, mod, kind, src, self._info.get(src), shape)

    def _visit_aten_norm(self, node: Any, op: str) -> _Info | None:
        src = node.args[0]
        owners = [self._module_of(a) for a in node.args[1:5]]
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        name = next((o for o in owners if o), stack[-1][0] if stack else None)
        mod = self.modules.get(name) if name is not None else None
        kind = type(mod).__name__
        want = {"batch_norm": _BN_TYPES, "layer_norm": {"LayerNorm"}, "group_norm": {"GroupNorm"}}[op]
        if mod is None or kind not in want:
            return self._unknown(node, op)
        return self._visit_norm(node, name, mod, kind, src, self._info.get(src))

    def _reshape_or_squeeze(self, node: Any, shape: tuple[int, ...]) -> _Info | None:
        """A reshape that only adds or drops size-1 dims keeps the channel axis (moved); any other
        is the fx rule (channels folded into features)."""
        src, info = self._first_info(node)
        if info is None:
            return None
        s = self._shape(src)
        if info.inner == 1 and s[info.axis] > 1:
            big_in = [i for i, d in enumerate(s) if d != 1]
            big_out = [i for i, d in enumerate(shape) if d != 1]
            if [s[i] for i in big_in] == [shape[i] for i in big_out] and len(s) != len(shape):
                return _Info(info.space, big_out[big_in.index(info.axis)], 1)
        return self._reshape(node, shape)

    # -- attention units ---------------------------------------------------------------------------
    def _head_space(self, unit: AttentionUnit) -> int:
        if unit.path not in self._heads:
            space = self._new(unit.width, block=unit.head_dim)
            sp = self._spaces[space]
            sp.producers = list(dict.fromkeys(n for n, _ in unit.rows))
            sp.updates = [(unit.path, unit.kind)]
            for name, offset in unit.rows:
                self._users.append((space, name, "out", 1, offset))
            for n in sp.producers:
                if n not in self.producer_order:
                    self.producer_order.append(n)
            self._heads[unit.path] = space
        return self._heads[unit.path]

    def _visit_unit(self, node: Any, unit: AttentionUnit) -> _Info | None:
        """A node inside an attention unit: the input projections consume the unit's input, the
        output projection (or the context leaving the unit) carries the head space; anything else
        touching outside channels is unknown."""
        if unit.kind == "whole":
            return self._visit_whole(node, unit)
        op = _op_name(node)
        layer = self._module_of(node.args[1]) if op == "linear" and len(node.args) > 1 else None
        src = node.args[0] if node.args else None
        if layer in unit.inputs:
            info = self._info.get(src)
            if info is not None:
                if info.axis != len(self._shape(src)) - 1:
                    return self._unknown(node, op)
                self._users.append((info.space, layer, "in", info.inner, 0))
                self._remember_input(layer, info.space)
            self._head_space(unit)
            return None
        shape = self._shape(node)
        if layer is not None and layer == unit.output and self._shape(src)[-1] == unit.width:
            head = _Info(self._head_space(unit), len(self._shape(src)) - 1)
            return self._visit_layer(node, layer, self.modules[layer], "Linear", src, head, shape)
        leaves = unit.output is None and any(self._unit_of(u) is not unit for u in node.users)
        if leaves and shape and len(shape) >= 2 and shape[-1] == unit.width:
            return _Info(self._head_space(unit), len(shape) - 1)  # the context, to the next module
        if leaves and shape is not None:
            self._freeze(
                self._head_space(unit), f"attention internals of {unit.path} leave it at {node.name}"
            )
        outside = [n for n in self._tensor_inputs(node) if self._unit_of(n) is not unit]
        if any(self._info.get(n) is not None for n in outside):
            return self._unknown(node, op)  # the unit's input read by something else than q/k/v
        return super()._visit(node)

    def _visit_whole(self, node: Any, unit: AttentionUnit) -> None:
        return self._keep_whole(node, unit.path, unit.reason)
