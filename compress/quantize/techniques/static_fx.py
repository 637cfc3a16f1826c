"""Row ``("static", "fx")``: post-training int8 in graph mode (FX): trace → fuse + observe →
calibrate → convert, written as frozen int8 TorchScript.

Works on models written the way users write them (functional ``F.relu``, residual ``x + y``,
``torch.flatten``, no QuantStubs): the graph is traced, conv-bn(-relu) and linear-relu are fused
for the backend, observers are placed around every quantizable op, calibrated on data, and
replaced by int8 kernels. Per-channel weights by default.
"""

from __future__ import annotations

from typing import Any

from ptopt.compress.quantize import fx_support
from ptopt.compress.quantize.base import Prepared, Quantized, QuantResult
from ptopt.compress.quantize.config import MIN_STATIC_SHARE, StaticQuantConfig, refuse_no_compile
from ptopt.compress.quantize.registry import register_technique
from ptopt.core import progress as progress_
from ptopt.core.data import Dataset
from ptopt.core.inputspec import batch_size_of, call_args, call_model

#: layer types graph-mode static int8 has no kernel for, and what to do instead
_NO_STATIC_KERNEL = {
    "LSTM": "no static int8 LSTM kernel in graph mode; --mode dynamic quantizes LSTM/GRU/Linear",
    "GRU": "no static int8 GRU kernel in graph mode; --mode dynamic quantizes LSTM/GRU/Linear",
    "MultiheadAttention": "attention stays float in graph mode; --mode dynamic quantizes its feed-forward Linears",
    "Embedding": "embeddings stay float (weight-only int8 is not supported by this engine)",
    "EmbeddingBag": "embeddings stay float (weight-only int8 is not supported by this engine)",
}


@register_technique(
    StaticQuantConfig,
    "fx",
    help="torch.ao FX graph mode, calibrated; frozen int8 TorchScript (.pt)",
    check=refuse_no_compile,
    requires=fx_support.require_backend,
    tracer="torch.fx",
    min_int8_share=MIN_STATIC_SHARE,
    advise=fx_support.advise,
    candidate=lambda config, prep: (
        quantize_static(prep.module, config, prep.calib, prep.example, progress=False).module
    ),
)
def static_fx(config: StaticQuantConfig, prep: Prepared, progress: bool) -> Quantized:
    config = config.observed()  # fx_support.quantized records it (the ONNX recipe's calibration method)
    return fx_support.quantized(
        config, prep, lambda: quantize_static(prep.module, config, prep.calib, prep.example, progress)
    )


def quantize_static(
    model: Any, config: StaticQuantConfig, calib: Dataset, example: Any, progress: bool = True
) -> QuantResult:
    """Static int8 of ``model`` (left untouched) calibrated on ``calib``; ``example`` is one batch."""
    from ptopt.compress.quantize import engine_fx as engine

    config = config.observed()
    args, kwargs = call_args(example)
    prepared = engine.prepare_static(model, config, args, kwargs)
    summary = calibrate(prepared, calib, config.calibration_batches, config.batch_size, progress)
    converted = engine.convert(prepared, config.backend)
    calibration = {
        "calibration": summary
        | {"observer": config.observer, "per_channel": config.per_channel, "backend": config.backend}
    }
    return QuantResult(converted, float_layers(model, converted, config), calibration)


def calibrate(
    prepared: Any, data: Dataset, max_batches: int, batch_size: int, progress: bool = True
) -> dict[str, Any]:
    """Run up to ``max_batches`` shuffled (seeded) batches through the observed model (or, in a search
    that calibrated this model before, reuse what its observers saw: ``observed``).

    Calibrate in eval mode: BatchNorm statistics must not move and dropout must be off, or the
    observed ranges describe a different network than the one that gets converted.
    """
    from ptopt.compress.quantize import observed

    prepared.eval()

    def first() -> Any:  # the batch calibration starts with (read only inside a search)
        batch = next(iter(data.batches(batch_size, shuffle=True, seed=0)), None)
        return None if batch is None else batch.x

    return observed.calibrated(
        prepared, first, lambda: _calibrate(prepared, data, max_batches, batch_size, progress), "fx"
    )


def _calibrate(
    prepared: Any, data: Dataset, max_batches: int, batch_size: int, progress: bool
) -> dict[str, Any]:
    import torch

    from ptopt.core.errors import UnsupportedModelError

    total = min(max_batches, data.num_batches(batch_size))
    batches = samples = 0
    # progress=False (a search calibrating many times): no line per calibration, a heartbeat if it is long
    with progress_.step("calibrating", total, "batches", announce=progress) as step, torch.no_grad():
        for b in data.batches(batch_size, shuffle=True, seed=0):
            if batches >= total:
                break
            try:
                call_model(prepared, b.x)
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
                msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                if any(f"'{t}'" in msg for t in ("Long", "Int", "Bool")):
                    raise UnsupportedModelError(
                        f"calibration failed in graph mode: {msg}: an integer tensor (token ids or a mask) reaches "
                        "an op that static int8 wants to quantize. Use --mode dynamic for models with integer "
                        "inputs"
                    ) from None
                raise UnsupportedModelError(
                    f"calibration failed in graph mode: {msg}. Keep the failing module "
                    "in float with --exclude NAME, or use --mode dynamic"
                ) from None
            batches += 1
            samples += batch_size_of(b.x)
            step.advance()
    return {"data": data.name, "batches": batches, "samples": samples, "batch_size": batch_size}


def float_layers(original: Any, converted: Any, config: Any) -> dict[str, str]:
    """``{name: reason}`` for each weighted layer of ``original`` that is not int8 in ``converted``.

    BatchNorms folded into their convolution are gone from ``converted`` and are not listed.
    """
    from ptopt.compress.quantize.engine_fx import is_quantized_module

    excluded = tuple(getattr(config, "float_modules", ()) or ())
    graph = getattr(converted, "graph", None)
    leaves = {str(n.target) for n in graph.nodes if n.op == "call_module"} if graph is not None else set()
    out: dict[str, str] = {}
    for name, m in original.named_modules():
        if not name or not any(True for _ in m.parameters(recurse=False)):
            continue
        try:
            q = converted.get_submodule(name)
        except AttributeError:
            continue  # fused into a neighbour (conv-bn folding)
        if is_quantized_module(q):
            continue
        kind = type(m).__name__
        user_excluded = any(name == e or name.startswith(e + ".") for e in excluded)
        if any(True for _ in m.children()) and kind not in _NO_STATIC_KERNEL and not user_excluded:
            # a block with parameters of its own (ConvNeXt's layer_scale): the block is no layer, the
            # layers inside it are judged by their own names; its parameters by the ops using them
            if bare_parameters_quantized(graph, name, m) is not False:
                continue
            own = ", ".join(n for n, _ in m.named_parameters(recurse=False))
            out[name] = f"its own parameter(s) {own} feed float ops (the layers inside it are listed by name)"
            continue
        parts = name.split(".")
        opaque = next((p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in leaves), None)
        if any(name == e or name.startswith(e + ".") for e in excluded):
            out[name] = "excluded (--exclude / float_modules)"
        elif opaque is not None:
            out[name] = (
                f"inside {opaque} ({type(original.get_submodule(opaque)).__name__}), which graph mode runs "
                "as one float op; --mode dynamic quantizes the Linear layers inside it"
            )
        elif kind in _NO_STATIC_KERNEL:
            out[name] = _NO_STATIC_KERNEL[kind]
        elif "BatchNorm" in kind:
            out[name] = "BatchNorm not preceded by a convolution: not fused, runs in float"
        elif "Norm" in kind:
            out[name] = f"{kind} runs in float between dequantize/quantize"
        else:
            out[name] = f"no int8 {kind} pattern on backend {config.backend}: runs in float"
    return out


def bare_parameters_quantized(graph: Any, name: str, module: Any) -> bool | None:
    """Whether the parameters a module holds itself (not its layers') enter the converted graph
    quantized (``quantize_per_tensor`` or a ``quantized::`` op reads them): True / False, None when the
    graph does not read them (folded away, or not a graph)."""
    if graph is None:
        return None
    targets = {f"{name}.{p}" for p, _ in module.named_parameters(recurse=False)}
    uses = [u for n in graph.nodes if n.op == "get_attr" and str(n.target) in targets for u in n.users]
    if not uses:
        return None
    return all("quantize" in str(u.target) for u in uses)
