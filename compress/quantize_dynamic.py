"""Dynamic int8: Linear / LSTM / GRU weights stored in int8, activations quantized per batch.

No calibration data. Never convolutions: ONNX/torch dynamic conv (ConvInteger) is several times
slower than fp32, so convolutional models go through ``--mode static``. Transformer encoders work:
their feed-forward Linears are quantized, while ``MultiheadAttention``'s packed in-projection and its
``out_proj`` (a NonDynamicallyQuantizableLinear) stay float; the fused attention fast path is off
while the model is traced (see ``quant_engine.mha_fastpath_disabled``).
"""

from __future__ import annotations

from typing import Any

from ptopt.compress import quant_engine as engine
from ptopt.compress.quant_config import DynamicQuantConfig, QuantResult

_CONV_REASON = "convolutions are never dynamically quantized (slower than fp32); use --mode static"


def quantize_dynamic(model: Any, config: DynamicQuantConfig) -> QuantResult:
    """Dynamic int8 of ``model`` (left untouched)."""
    q = engine.quantize_dynamic(
        model, config.layers, config.per_channel, config.backend, config.float_modules
    )
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
    return QuantResult(q, float_layers(model, q, config), summary)


def float_layers(original: Any, converted: Any, config: DynamicQuantConfig) -> dict[str, str]:
    """``{name: reason}`` for each layer with weights that stayed float."""
    excluded = tuple(config.float_modules)
    out: dict[str, str] = {}
    for name, m in original.named_modules():
        if not name or not any(True for _ in m.parameters(recurse=False)):
            continue
        q = converted.get_submodule(name)
        if engine.is_quantized_module(q):
            continue
        kind = type(m).__name__
        if any(name == e or name.startswith(e + ".") for e in excluded):
            out[name] = "excluded (--exclude / float_modules)"
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
        elif kind.startswith("Embedding"):
            out[name] = "embeddings stay float (weight-only int8 is not supported by this engine)"
        else:
            out[name] = f"{kind} has no dynamic int8 kernel: runs in float"
    return out
