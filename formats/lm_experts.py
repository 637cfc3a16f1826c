"""A mixture of experts in an exported language-model graph.

transformers 5 keeps a layer's experts in fused 3-D Parameters (``gate_up_proj``, ``down_proj``) and
runs them, by default, through ``grouped_mm``: on the CPU a custom op (``transformers::grouped_mm_fallback``)
that neither the ONNX exporter nor OpenVINO's converter translates. Its other implementations do not
fit a graph either: ``eager`` loops over the experts the example happened to route to (a trace keeps
those alone), and ``batched_mm`` gathers every token's expert matrices (a prefill of n tokens copies
n x top-k of them: hundreds of GB on a Mixtral-size model).

Nor does a graph file carry it: an ExportedProgram or AOTInductor package holding the op loads only
where ``transformers`` was imported first (AOTInductor: "Could not find schema for
transformers::grouped_mm_fallback ... cannot be run via AOTI without Python environment").

So every language-model graph (ONNX, OpenVINO, ExportedProgram, AOTInductor) computes every expert on
every token and weights each result by the router's weight for it, zero where the token did not pick
the expert: the same sum, static shapes, plain aten ops, and num_experts / top-k times the experts'
multiply-adds of a routed run. The export's check compares the folder with the model as transformers
runs it (``grouped_mm``), not with this implementation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: the name the implementation is registered under in transformers' ``ALL_EXPERTS_FUNCTIONS``
NAME = "ptopt_every_expert"


def every_expert_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """An experts module's forward (transformers' ``@use_experts_implementation`` signature: tokens
    ``[n, hidden]``, the picked experts and their weights ``[n, top_k]``) over every expert (module doc)."""
    import torch

    up = self.gate_up_proj if self.has_gate else self.up_proj
    up_bias = getattr(self, "gate_up_proj_bias" if self.has_gate else "up_proj_bias", None)
    down_bias = getattr(self, "down_proj_bias", None)
    count = up.shape[0]
    weights = torch.zeros(
        hidden_states.shape[0], count, dtype=top_k_weights.dtype, device=hidden_states.device
    ).scatter_add(1, top_k_index, top_k_weights)
    out = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
    for e in range(count):
        h = _linear(hidden_states, up[e], up_bias[e] if self.has_bias else None, self.is_transposed)
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        h = _linear(h, self.down_proj[e], down_bias[e] if self.has_bias else None, self.is_transposed)
        if self.has_post_expert_norm:
            h = self.post_expert_norm(h)
        out = out + (h * weights[:, e, None]).float()
    return out.to(hidden_states.dtype)


def _linear(x: Any, weight: Any, bias: Any, transposed: bool) -> Any:
    """``x`` through one expert's matrix: ``[in, out]`` when ``transposed``, else ``[out, in]``."""
    import torch

    y = x @ weight if transposed else torch.nn.functional.linear(x, weight)
    return y if bias is None else y + bias


def experts_record(model: Any) -> dict[str, Any]:
    """``{"experts": {"per_layer": E, "top_k": k}}`` for a mixture of experts (what the export's record
    and banner say: the graph computes all E, E / k times a routed run's expert work), else {}."""
    counts = {
        m.down_proj.shape[0] for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj")
    }
    if not counts:
        return {}
    top_k = getattr(model.config, "num_experts_per_tok", None) or getattr(model.config, "top_k", None)
    return {"experts": {"per_layer": max(counts), "top_k": top_k, "computed": "every expert on every token"}}


def is_moe(model: Any) -> bool:
    """Whether ``model`` runs experts through transformers' experts interface."""
    return any(hasattr(m, "has_gate") and hasattr(m, "down_proj") for m in model.modules())


@contextlib.contextmanager
def every_expert(model: Any) -> Iterator[None]:
    """Inside the block, ``model``'s experts run :func:`every_expert_forward` (nothing changes for a
    model without experts, or one whose implementation transformers cannot set)."""
    get = getattr(model, "get_experts_implementation", None)
    if not is_moe(model) or not callable(get):
        yield
        return
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(NAME, every_expert_forward)
    was = get()
    model.set_experts_implementation(NAME)
    try:
        yield
    finally:
        model.set_experts_implementation(was)
