"""Row ``("dynamic", "fx")``: Linear / LSTM / GRU weights stored in int8, activations quantized per
batch; Embedding weights stored as int8 rows (one float scale per row), looked up and dequantized;
written as frozen int8 TorchScript.

transformers' ``Conv1D`` (GPT-2's attention and MLP projections) is a linear layer with its weight
stored transposed: it is swapped for the equivalent ``nn.Linear`` (checked numerically) and quantized
as one (``layers.linearize_conv1d``).

No calibration data. Never convolutions: ONNX/torch dynamic conv (ConvInteger) is several times
slower than fp32, so convolutional models go through ``--mode static``. Transformer encoders work:
their feed-forward Linears are quantized, while ``MultiheadAttention``'s packed in-projection and its
``out_proj`` (a NonDynamicallyQuantizableLinear) stay float; the fused attention fast path is off
while the model is traced (see ``layers.mha_fastpath_disabled``).
"""

from __future__ import annotations

import weakref
from typing import Any

from ptopt.compress.quantize import fx_support
from ptopt.compress.quantize.base import Prepared, Quantized, QuantResult
from ptopt.compress.quantize.config import DynamicQuantConfig, refuse_no_compile
from ptopt.compress.quantize.registry import register_technique

_CONV_REASON = "convolutions are never dynamically quantized (slower than fp32); use --mode static"


#: model -> its embeddings whose weight the model reads directly (they cannot become int8)
_RAW_EMBEDDINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RAW_REASON = "the model reads this Embedding's weight directly (not through the layer): it stays float"


@register_technique(
    DynamicQuantConfig,
    "fx",
    help="torch.ao dynamic int8 of Linear/LSTM/GRU/Embedding; frozen int8 TorchScript (.pt)",
    check=refuse_no_compile,
    requires=fx_support.require_backend,
    advise=fx_support.advise,
    candidate=lambda config, prep: quantize_dynamic(prep.module, config, prep.example).module,
)
def dynamic_fx(config: DynamicQuantConfig, prep: Prepared, progress: bool) -> Quantized:
    return fx_support.quantized(config, prep, lambda: quantize_dynamic(prep.module, config, prep.example))


def quantize_dynamic(model: Any, config: DynamicQuantConfig, example: Any = None) -> QuantResult:
    """Dynamic int8 of ``model`` (left untouched). ``example`` (a batch): embeddings whose weight
    the model reads directly (``self.typ.weight[0]``, which an int8 Embedding has not) are found by
    running it, and stay float."""
    from ptopt.compress.quantize import engine_fx as engine
    from ptopt.compress.quantize.layers import is_conv1d_linear
    from ptopt.compress.quantize.tied import tied_names, tied_partners

    raw = raw_embeddings(model, config, example)
    idle = _uncalled(model, config, example)
    floats = tuple(config.float_modules) + tuple(n for n in raw + idle if n not in config.float_modules)
    # a layer tied to a float one stays float with it: their one matrix is stored once
    partners = tied_partners(model, floats) if {"linear", "embedding"} <= set(config.layers) else {}
    floats += tuple(partners)
    q = engine.quantize_dynamic(model, config.layers, config.per_channel, config.backend, floats)
    summary = {
        "dynamic": {
            "layers": list(config.layers),
            "per_channel": config.per_channel,
            "backend": config.backend,
            "quantized_layers": sorted(
                n for n, _ in model.named_modules() if n and engine.is_quantized_module(q.get_submodule(n))
            ),
        }
    }
    conv1d = [
        n
        for n, m in model.named_modules()
        if n and is_conv1d_linear(m) and engine.is_quantized_module(q.get_submodule(n))
    ]
    if conv1d:
        summary["dynamic"]["conv1d_as_linear"] = conv1d
    tied = tied_names(q)  # one int8 matrix for the layers that share it, stored once (tied.py)
    if tied:
        summary["dynamic"]["tied_int8_stored_once"] = tied
    floats_why = float_layers(model, q, config)
    floats_why.update({n: _RAW_REASON for n in raw if n not in config.float_modules})
    floats_why.update({n: _IDLE_REASON for n in idle if n not in config.float_modules})
    floats_why.update(
        {
            n: f"tied to {held} (float): stays float so their one matrix is stored once"
            for n, held in partners.items()
        }
    )
    return QuantResult(q, floats_why, summary)


_IDLE_REASON = "never called as a layer (its parent reads its weight itself, or it is unused): it stays float"


def _uncalled(model: Any, config: DynamicQuantConfig, example: Any) -> list[str]:
    """The Linear / LSTM / GRU layers the model never calls (``layers.uncalled``): they stay float."""
    import torch

    from ptopt.compress.quantize.layers import uncalled

    kinds = {"linear": torch.nn.Linear, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}
    chosen = tuple(kinds[t] for t in config.layers if t in kinds)
    return uncalled(model, chosen, example) if chosen and example is not None else []


def raw_embeddings(model: Any, config: DynamicQuantConfig, example: Any) -> list[str]:
    """The embeddings of ``model`` that do not run as int8 (see :func:`quantize_dynamic`); found
    once per model: all embeddings int8 first, one at a time when that fails."""
    import torch

    from ptopt.compress.quantize import engine_fx as engine
    from ptopt.compress.quantize.layers import mha_fastpath_disabled
    from ptopt.core.inputspec import call_model

    if "embedding" not in config.layers or example is None:
        return []
    if model in _RAW_EMBEDDINGS:
        return _RAW_EMBEDDINGS[model]
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)]
    names = [n for n in names if not any(n == f or n.startswith(f + ".") for f in config.float_modules)]

    def runs(quantized: list[str]) -> bool:
        others = tuple(n for n in names if n not in quantized)
        q = engine.quantize_dynamic(model, ("embedding",), config.per_channel, config.backend, others)
        try:
            with torch.no_grad(), mha_fastpath_disabled():
                call_model(q, example)
        except (TypeError, AttributeError, RuntimeError):
            return False
        return True

    raw = [] if not names or runs(names) else [n for n in names if not runs([n])]
    _RAW_EMBEDDINGS[model] = raw
    return raw


def float_layers(original: Any, converted: Any, config: DynamicQuantConfig) -> dict[str, str]:
    """``{name: reason}`` for each layer with weights that stayed float (a weight-normed layer is one:
    its ``parametrizations`` hold its weight, and its kind is the class it had before, a Conv1d)."""
    from torch.nn.utils.parametrize import type_before_parametrizations

    from ptopt.compress.quantize import engine_fx as engine
    from ptopt.compress.quantize.measure import weight_layers

    excluded = tuple(config.float_modules)
    out: dict[str, str] = {}
    for name, (m, _) in weight_layers(original).items():
        q = converted.get_submodule(name)
        if engine.is_quantized_module(q):
            continue
        kind = type_before_parametrizations(m).__name__
        if any(name == e or name.startswith(e + ".") for e in excluded):
            out[name] = "excluded (--exclude / float_modules)"
        elif kind == "Conv1D":
            out[name] = "transformers Conv1D not selected (--layers linear quantizes it as the Linear it is)"
        elif kind.startswith("Conv"):
            out[name] = _CONV_REASON
        elif kind == "NonDynamicallyQuantizableLinear":
            out[name] = "attention out_proj: MultiheadAttention calls it functionally, it stays float"
        elif kind == "MultiheadAttention":
            out[name] = "attention in-projection is a packed parameter of MultiheadAttention, it stays float"
        elif kind.lower() in engine.DYNAMIC_TYPES:
            out[name] = f"{kind} not selected (--layers {','.join(config.layers)})"
        elif "Norm" in kind:
            out[name] = f"{kind} has no dynamic int8 kernel: runs in float"
        elif kind == "Embedding":
            out[name] = f"Embedding not selected (--layers {','.join(config.layers)})"
        elif kind.startswith("Embedding"):
            out[name] = f"{kind} has no weight-only int8 kernel here: runs in float"
        elif next(m.children(), None) is not None:  # wav2vec2's masked_spec_embed, a ViT's class token
            own = ", ".join(n for n, _ in m.named_parameters(recurse=False))
            out[name] = f"{kind} holds {own} itself (a parameter its code reads, not a layer): stays float"
        else:
            out[name] = f"{kind} has no dynamic int8 kernel: runs in float"
    return out
