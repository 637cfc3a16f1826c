"""What the fx rows of the technique table share (``techniques/static_fx``, ``dynamic_fx``,
``qat_fx``): the backend check, the handler's frame (the technique under the backend's kernels, an
untraceable model pointed to another engine, the int8 TorchScript in memory) and the advice when the
int8 model is not faithful. Imports the engine only inside its functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ptopt.compress.quantize.base import Prepared, Quantized, QuantResult


def require_backend(config: Any) -> None:
    """UsageError when this torch build has no int8 kernels for ``config.backend``."""
    from ptopt.compress.quantize.engine_fx import check_backend

    check_backend(config.backend)


def quantized(config: Any, prep: Prepared, technique: Callable[[], QuantResult]) -> Quantized:
    """``technique()`` (the eager int8 model) run under ``config.backend``'s kernels, as its int8
    TorchScript in memory. A model torch.fx cannot trace is refused naming another engine that
    captures it, where one does (``table.suggest_other_engine``)."""
    from ptopt.compress.quantize import engine_fx as fx
    from ptopt.compress.quantize.registry import suggest_other_engine
    from ptopt.compress.quantize.scripted import int8_torchscript

    with fx.quantize_context(config.backend):
        try:
            qres = technique()
        except fx.FxTraceError as e:
            raise suggest_other_engine(config, prep, e) from None
    return int8_torchscript(config, prep, qres)


def advise(config: Any, prep: Prepared) -> str:
    """What to do when the int8 model breaks the rule: the layers to keep in float, found by
    a sensitivity ranking (static: simulated, no int8 build per layer) and verified (the rule holds
    with them float), else the search."""
    from ptopt.compress.quantize.autoquant_tuner import float_layers_that_hold
    from ptopt.compress.quantize.measure import check_data
    from ptopt.core import progress

    data = check_data(prep)
    with progress.step(
        "int8 breaks the rule: searching for layers to keep float (up to 8, most sensitive first)"
    ):
        found = float_layers_that_hold(prep, config, data)
    if found is None:
        dynamic = _dynamic_holds(prep, config, data) if config.mode != "dynamic" else None
        if dynamic is not None:  # verified here, so the suggestion is one that works when pasted
            return (
                " No set of float layers tried makes static int8 hold, but dynamic int8 of its Linear/LSTM/GRU "
                f"layers does (min cosine {dynamic['min_cosine']:.4f}): rerun with --mode dynamic"
            )
        return (
            " No set of float layers tried makes it hold (up to 8, most sensitive first), so int8 may not suit "
            "this model as it is: keep it in fp32 (e.g. ptopt export MODEL --target onnx), or let "
            "accuracy-aware quantization search further with --eval-data DATA --min-cosine 0.99 (it writes "
            "the closest model it finds and names the layers; on some models none holds)"
        )
    layers, fid = found
    flags = " ".join(f"--exclude {n}" for n in layers)
    return (
        f" Keep {', '.join(layers)} in float: rerun with {flags} (float_modules={tuple(layers)!r}); "
        f"with them float the min cosine is {fid['min_cosine']:.4f}"
    )


def _dynamic_holds(prep: Prepared, config: Any, data: Any) -> dict[str, Any] | None:
    """The fidelity record of dynamic int8 (Linear/LSTM/GRU weights, activations on the fly) when it
    holds the int8 rule on ``data``; None when the model has no such layer or it does not hold."""
    import torch

    from ptopt.compress.fidelity import INT8_VS_FP32, measure_fidelity
    from ptopt.compress.quantize import engine_fx as fx
    from ptopt.compress.quantize.layers import is_conv1d_linear

    kinds = {torch.nn.Linear: "linear", torch.nn.LSTM: "lstm", torch.nn.GRU: "gru"}
    layers = [m for m in prep.module.modules() if type(m) in kinds or is_conv1d_linear(m)]
    covered = sum(p.numel() for m in layers for p in m.parameters(recurse=False))
    total = sum(p.numel() for p in prep.module.parameters())
    if not total or covered < 0.5 * total:  # a CNN's classifier alone: dynamic would barely change it
        return None
    types = sorted({kinds[type(m)] for m in layers if type(m) in kinds}) or ["linear"]
    try:
        with fx.quantize_context(config.backend):
            q = fx.quantize_dynamic(prep.module, types, True, config.backend)
            fid = measure_fidelity(prep.module, q, data, **INT8_VS_FP32)
    except (RuntimeError, NotImplementedError):
        return None
    return fid if fid["passed"] else None
