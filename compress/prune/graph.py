"""The channel analysis on torch.export's ATen graph: models torch.fx cannot trace, and attention.

``torch.export.export(model, args, strict=False)`` runs the model's Python once with fake tensors and
records every ATen op it reaches, so it captures what fx cannot (Hugging Face models with dynamic
slicing, data-dependent Python that is fixed for the example's shapes) and shows the model as it
runs in eval mode (dropout and stochastic depth are gone). Every parameter and buffer is a graph
input whose name maps back to its module (``graph_signature.inputs_to_parameters``), so an op is tied
to the module whose weights it reads whatever its class, and every node carries the
``nn_module_stack`` of the modules it ran inside (which is how ``nn.MultiheadAttention`` is kept
whole and how head-count attributes are found).

The rules are ``ptopt.compress.prune.channel_graph``'s; the analysis holds for the example's
shapes: a model whose Python branches on shapes may take another path on other inputs.
"""

from __future__ import annotations

from typing import Any

from ptopt.compress.prune.attention import attention_unit
from ptopt.compress.prune.channel_graph import ChannelGraph
from ptopt.core.errors import UnsupportedModelError


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

    def __init__(self, model: Any, example_inputs: Any, hidden: bool = False):
        self.model = model
        self.hidden = hidden
        ep = export_graph(model, example_inputs)
        self.gm = ep.graph_module
        sig = ep.graph_signature
        #: graph input (placeholder) name -> (module, attribute) of that parameter / buffer
        fqn = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
        self._owners = {ph: tuple(name.rpartition(".")[::2]) for ph, name in fqn.items()}
        self.modules = dict(model.named_modules())
        self._whole: dict[str, Any] = {}
        self._analyse()

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

    def _owner(self, node: Any) -> tuple[str, str] | None:
        if getattr(node, "op", None) == "placeholder":
            return self._owners.get(node.name)
        return None

    def _visit(self, node: Any) -> Any:
        if node.op == "call_function":
            unit = self._whole_unit(node)
            if unit is not None:
                return self._keep_whole(node, unit.path, unit.reason)
        return super()._visit(node)

    def _whole_unit(self, node: Any) -> Any:
        """The outermost module ``node`` ran inside that is kept whole (``nn.MultiheadAttention``)."""
        for path in self._stack(node):
            if path not in self._whole:
                mod = self.modules.get(path)
                self._whole[path] = attention_unit(path, mod) if mod is not None and path else None
            if self._whole[path] is not None:
                return self._whole[path]
        return None

    def rewrite_flattens(self, model: Any) -> Any:
        raise UnsupportedModelError(
            "structured pruning: the pruned model's forward does not follow the new sizes "
            "(a hard-coded shape?) and the torch.export graph cannot be rewritten; --exclude the layer "
            "before it"
        )
