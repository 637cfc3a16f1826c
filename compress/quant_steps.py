"""The named steps of int8 quantization, shared by ``quantize`` and accuracy-aware search.

resolve the config (``resolve_config``, ``require_data``) → load the model and data
(``prepare``) → run the technique, trace the int8 TorchScript, measure and build the
:class:`~ptopt.core.result.Result` (``quantize_prepared``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from ptopt.compress.quant_config import ORT_CALIBRATION, QuantConfig, QuantResult, make_config
from ptopt.compress.stage import (
    UNSAVED,
    check_fits,
    input_files,
    load_dataset,
    load_eager,
    reconcile,
    settle_inputs,
)
from ptopt.core.errors import UsageError

#: parity of the int8 TorchScript against the int8 module it was traced from
TRACE_ATOL = 1e-3
#: ... and relative to the output scale: dynamic int8 re-quantizes activations per batch, so a float
#: summation order that differs (threads, ops fused by freezing) moves a scale and the rounding with
#: it; measured 0.11 % of the output scale on random-weight EfficientNet-B0 at 1 thread. A broken file
#: is off by far more.
TRACE_RTOL = 1e-2


def resolve_config(mode: str | None, config: QuantConfig | None, **options: Any) -> QuantConfig:
    """One config from ``config`` or the loose ``options``; a config with a contradicting option (or
    another ``mode``) is refused. Options of another mode are ignored (as ``ptopt quantize`` does)."""
    for key in ("exclude", "layers"):  # an empty list means "not given"
        options[key] = tuple(options[key]) if options.get(key) else None
    if config is not None:
        if mode is not None and mode != config.mode:
            raise UsageError(
                f"mode {mode!r} contradicts the given {type(config).__name__} (mode {config.mode!r})"
            )
        reconcile(config, options, {"exclude": "float_modules"})
        return config
    if mode == "dynamic" and options.get("observer") is not None:
        raise UsageError("--observer applies to static quantization (dynamic mode observes every batch)")
    keep = {
        "static": ("observer", "calibration_batches", "batch_size"),
        "qat": ("observer", "epochs", "lr", "batch_size"),
        "dynamic": ("layers",),
    }.get(mode or "", ())
    opts = {k: options.get(k) for k in ("backend", "per_channel", "engine", "compile", *keep)}
    return make_config(mode or "", float_modules=options.get("exclude"), **opts)


def require_data(config: QuantConfig, calib_data: Any, train_data: Any) -> None:
    """Fail on missing data before loading anything."""
    if config.mode == "static" and calib_data is None:
        raise UsageError(
            "static quantization needs calibration data: pass --calib-data DATA "
            "(e.g. builtin:digits32:train), or use --mode dynamic"
        )
    if config.mode == "qat" and train_data is None:
        raise UsageError(
            "QAT needs training data: pass --train-data DATA (labelled, e.g. builtin:digits32:train)"
        )


@dataclasses.dataclass
class Prepared:
    """The eager model, its data (Datasets or None) and one example batch it has run."""

    loaded: Any
    module: Any
    calib: Any
    train: Any
    evald: Any
    example: Any


def prepare(
    config: QuantConfig,
    model: Any,
    weights: Any,
    allow_pickle: bool,
    input_shapes: Any,
    calib_data: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
) -> Prepared:
    """Load the eager model and the data, check they fit (typed errors), settle the input specs."""
    from ptopt.compress import quant_engine as engine

    loaded = load_eager(model, weights, allow_pickle, "quantization")
    engine.check_backend(config.backend)
    if config.float_modules:
        engine.check_module_names(loaded.module, config.float_modules)
    calib = load_dataset(calib_data, "calibration")
    train = load_dataset(train_data, "training")
    evald = load_dataset(eval_data, "evaluation")
    fit = calib or train
    example = settle_inputs(loaded, fit or evald, input_shapes, "data (--calib-data / --eval-data)")
    for ds in (calib, train, evald):
        if ds is not None and ds is not (fit or evald):
            check_fits(loaded, ds)
    return Prepared(loaded, loaded.module, calib, train, evald, example)


def run_technique(config: QuantConfig, prep: Prepared, progress: bool) -> QuantResult:
    """The int8 module of ``config.mode`` (the fp32 module is left untouched)."""
    if config.mode == "static":
        from ptopt.compress.quantize_static import quantize_static

        return quantize_static(prep.module, config, prep.calib, prep.example, progress=progress)
    if config.mode == "dynamic":
        from ptopt.compress.quantize_dynamic import quantize_dynamic

        return quantize_dynamic(prep.module, config, prep.example)
    from ptopt.compress.qat import quantize_qat

    return quantize_qat(
        prep.module, config, prep.train, prep.example, eval_data=prep.evald, progress=progress
    )


def quantize_prepared(config: QuantConfig, prep: Prepared, refs: dict[str, Any], progress: bool) -> Any:
    """Run the technique, write the int8 TorchScript and reload it (checked against the int8 module),
    measure it, and return the unsaved Result. ``refs``: the ``calib_data`` / ``train_data`` /
    ``eval_data`` arguments as given (references are recorded in the sidecar)."""
    from ptopt.compress import quant_engine as engine

    if config.engine != "fx":  # torchao PT2E → AOTInductor package, or both measured (auto)
        from ptopt.compress.quantize_pt2e import quantize_with_engine

        return quantize_with_engine(config, prep, refs, progress)
    with engine.quantize_context(config.backend):
        try:
            qres = run_technique(config, prep, progress)
        except engine.FxTraceError as e:  # name --engine pt2e when torch.export captures the model
            from ptopt.compress.quantize_pt2e import fx_cannot_trace

            raise fx_cannot_trace(config, prep, e) from None
        scripted, int8_bytes, made = _checked_torchscript(qres.module, prep, config.backend)
        metrics = measure(prep.module, scripted, int8_bytes, prep, refs.get("eval_data"))
    qres.summary["int8_share"] = int8_share(prep.module, prep.example, qres.float_layers)
    return _build_result(config, prep, qres, scripted, metrics, refs, made)


def int8_share(module: Any, example: Any, float_layers: dict[str, str]) -> dict[str, Any]:
    """What share of the model is int8: its layers with weights (modules with parameters of their
    own), their parameters, and their multiply-accumulates per sample (``autoquant.layer_macs``),
    each layer int8 unless ``float_layers`` lists it."""
    from ptopt.compress.autoquant import layer_macs

    own = {
        n: sum(p.numel() for p in m.parameters(recurse=False))
        for n, m in module.named_modules()
        if n and any(True for _ in m.parameters(recurse=False))
    }
    int8 = [n for n in own if n not in float_layers]
    macs = layer_macs(module, example)
    total_params, total_macs = sum(own.values()), sum(macs.values())
    return {
        "layers": len(int8),
        "of_layers": len(own),
        "parameters": sum(own[n] for n in int8) / total_params if total_params else 0.0,
        "macs": sum(macs.get(n, 0.0) for n in int8) / total_macs if total_macs else 0.0,
    }


#: static int8 below this share of the parameters is refused: the file would be about fp32's size
MIN_STATIC_SHARE = 0.1
#: layer kinds dynamic int8 quantizes, for pointing there
_DYNAMIC_KINDS = ("Linear", "LSTM", "GRU", "Embedding", "Conv1D")


def refuse_if_mostly_float(result: Any, prep: Prepared) -> None:
    """Static int8 that leaves (nearly) every weight float is refused before anything is written,
    pointing to ``--mode dynamic`` when that quantizes the layers static mode cannot."""
    from ptopt.core.errors import UnsupportedModelError

    share = result.extra["int8_share"]
    if share["parameters"] >= MIN_STATIC_SHARE:
        return
    floats = result.extra["float_layers"]
    kinds = {n: type(prep.module.get_submodule(n)).__name__ for n in floats}
    movable = [n for n, k in kinds.items() if k in _DYNAMIC_KINDS]
    why = "; ".join(f"{n}: {floats[n]}" for n in list(floats)[:3])
    todo = (
        f" Use --mode dynamic (the same command with --mode dynamic): it quantizes {', '.join(movable[:4])}"
        if movable
        else " int8 does not apply to this model's layers"
    )
    raise UnsupportedModelError(
        f"static int8 would quantize only {100 * share['parameters']:.1f}% of the parameters "
        f"({share['layers']} of {share['of_layers']} layers with weights): the file would be about as "
        f"large as fp32 and no faster ({why}).{todo}"
    )


def _build_result(
    config: QuantConfig,
    prep: Prepared,
    qres: QuantResult,
    scripted: Any,
    metrics: dict[str, Any],
    refs: dict[str, Any],
    made: dict[str, Any] | None = None,
) -> Any:
    from ptopt.core.artifact import Artifact
    from ptopt.core.result import Result

    cfg = config.to_dict() | {"mode": config.mode}
    for key, ref in refs.items():
        if isinstance(ref, (str, os.PathLike)):
            cfg[key] = str(ref)
    parent = prep.loaded.parent_record()
    data_ref = refs.get("calib_data") if config.mode == "static" else refs.get("train_data")
    template = Artifact(
        path=UNSAVED,
        format="torchscript",
        inputs=list(prep.loaded.input_specs),
        input_style=prep.loaded.input_style,
        config=cfg,
        parent=parent,
        precision="int8",
        metrics=metrics,
        extra={
            "float_layers": qres.float_layers,
            **qres.summary,
            "onnx_quantization": _onnx_recipe(config, data_ref, parent),
        },
    )
    writer = functools.partial(_write_torchscript, scripted, prep, config.backend, made=made)
    sources = input_files(prep.loaded.path, prep.loaded.info.get("weights"), *refs.values())
    return Result(scripted, template, writer, inputs_paths=sources)


# -- TorchScript (through the one writer, ptopt.export.writers) ------------------------------------------


def _write_torchscript(
    module: Any, prep: Prepared, backend: str, path: Any, made: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``module`` (the int8 model, or its TorchScript) written at ``path`` as frozen TorchScript by
    the one writer, reloaded and compared with ``module`` at the input specs' min/opt/max shapes.
    ``made``: how ``module``, a TorchScript written before (``_checked_torchscript``), was made; the
    sidecar says that (traced, frozen), not "re-saved".

    Under ``backend``'s engine, where the int8 model was built: reloading repacks int8 weights for
    the engine in use, and another engine's kernels round differently.
    """
    from ptopt.compress import quant_engine as engine
    from ptopt.export.writers import write_model

    with engine.quantize_context(backend):
        facts = write_model(
            module,
            "torchscript",
            path,
            specs=prep.loaded.input_specs or None,
            style=prep.loaded.input_style,
            example=prep.example,
            precision="int8",
            atol=TRACE_ATOL,
            rtol=TRACE_RTOL,
        )
    if made:
        method = made["method"] + (" + torch.jit.freeze" if made["frozen"] else "")
        facts["extra"].update(made, method=f"{method} of the int8 model")
    return facts


def _checked_torchscript(int8: Any, prep: Prepared, backend: str) -> tuple[Any, int, dict[str, Any]]:
    """(the int8 TorchScript as its file loads back, that file's bytes, how it was made: method,
    frozen, trace warnings): written in a temporary folder, so what ``.model`` runs and ``.metrics``
    measure is what ``.save`` writes."""
    import tempfile
    from pathlib import Path

    from ptopt.export.writers import reload

    with tempfile.TemporaryDirectory(prefix="ptopt-int8-") as tmp:
        path = Path(tmp) / "model.int8.pt"
        extra = _write_torchscript(int8, prep, backend, path)["extra"]
        made = {k: extra[k] for k in ("method", "frozen", "trace_warnings") if k in extra}
        return reload(path, "torchscript", style=prep.loaded.input_style), path.stat().st_size, made


# -- measuring -----------------------------------------------------------------------------------------


def measure(fp32: Any, scripted: Any, int8_bytes: int, prep: Prepared, ref: Any) -> dict[str, Any]:
    """Sizes (int8 vs fp32 TorchScript bytes) and, with eval data, fp32 vs int8 accuracy / agreement."""
    from ptopt.export.writers import serialized_bytes

    fp32_bytes = serialized_bytes(
        fp32,
        "torchscript",
        prep.example,
        specs=prep.loaded.input_specs or None,
        style=prep.loaded.input_style,
    )
    metrics = _accuracy(fp32, scripted, prep.evald, ref)
    metrics["fp32_torchscript_bytes"] = fp32_bytes
    metrics["size_ratio_vs_fp32_torchscript"] = round(int8_bytes / fp32_bytes, 4)
    # an "int8" file larger than its source is said loudly (the CLI warns; here the flag)
    metrics["larger_than_fp32"] = int8_bytes > fp32_bytes
    metrics |= vs_fp32(fp32, scripted, prep)
    return metrics


#: random samples the fidelity check runs on when no data is given (the example batch has 2: dynamic
#: int8 of EfficientNet-B0 passed on those with cosine 0.99 and measured 0.85 on 8 others)
CHECK_SAMPLES = 16


def check_data(prep: Prepared) -> Any:
    """What the int8 model is checked on: the data given, else ``CHECK_SAMPLES`` random inputs of the
    model's input specs (at most their largest batch)."""
    from ptopt.compress.fidelity import fidelity_data
    from ptopt.core.data import Dataset

    if any(ds is not None and len(ds) for ds in (prep.evald, prep.calib, prep.train)):
        return fidelity_data(prep.evald, prep.calib, prep.train)
    specs = prep.loaded.input_specs
    if not specs:
        return fidelity_data(example=prep.example)
    batch = min([CHECK_SAMPLES] + [s.max_shape[0] for s in specs if s.max_shape])
    x = prep.loaded.example_inputs(which="opt", batch=batch)
    return Dataset(x, name="random inputs of the model's input shapes (no data given)")


def vs_fp32(fp32: Any, scripted: Any, prep: Prepared) -> dict[str, Any]:
    """The int8 model against its fp32 source under export's parity rule (``compress.fidelity``):
    ``vs_fp32`` (the full record) and its headline numbers ``min_cosine`` / ``top1_agreement_vs_fp32``."""
    from ptopt.compress.fidelity import INT8_VS_FP32, measure_fidelity

    fid = measure_fidelity(fp32, scripted, check_data(prep), **INT8_VS_FP32)
    out = {"vs_fp32": fid, "min_cosine": fid["min_cosine"]}
    if fid["top1_agreement"] is not None:
        out["top1_agreement_vs_fp32"] = fid["top1_agreement"]
    return out


def _accuracy(fp32: Any, int8: Any, ds: Any, ref: Any, batch: int = 256) -> dict[str, Any]:
    """fp32 vs int8 on ``ds`` (in batches of ``batch``): top-1 accuracy with labels, else top-1
    agreement with fp32."""
    if ds is None:
        return {}
    import torch

    from ptopt.core.inputspec import call_model

    n = correct32 = correct8 = agree = 0
    with torch.no_grad():
        for b in ds.batches(batch):
            p32 = call_model(fp32, b.x).argmax(-1)
            p8 = call_model(int8, b.x).argmax(-1)
            n += int(p32.shape[0])
            agree += int((p32 == p8).sum())
            if b.y is not None:
                correct32 += int((p32 == b.y).sum())
                correct8 += int((p8 == b.y).sum())
    out: dict[str, Any] = {
        "eval_data": str(ref) if isinstance(ref, (str, os.PathLike)) else ds.name,
        "eval_samples": n,
        "top1_agreement": agree / n,
    }
    if ds.has_labels:
        out |= {
            "fp32_accuracy": correct32 / n,
            "int8_accuracy": correct8 / n,
            "accuracy_drop_points": round(100.0 * (correct32 - correct8) / n, 4),
        }
    return out


def _onnx_recipe(config: QuantConfig, data_ref: Any, parent: dict[str, Any]) -> dict[str, Any]:
    """What ``ptopt export --target onnx`` needs to quantize the fp32 parent with ONNX Runtime instead
    of exporting this TorchScript (int8 TorchScript does not export with the dynamo exporter)."""
    rec: dict[str, Any] = {
        "fp32_parent": parent,
        "method": "quantize_dynamic" if config.mode == "dynamic" else "quantize_static",
        "per_channel": config.per_channel,
        "exclude_modules": list(config.float_modules),
        "weight_type": "QInt8",
        "activation_type": "QUInt8",
        "reduce_range": config.backend in ("x86", "fbgemm"),
    }
    if config.mode == "dynamic":
        rec["layers"] = list(config.layers)  # type: ignore[attr-defined]
    else:
        rec["calib_data"] = str(data_ref) if isinstance(data_ref, (str, os.PathLike)) else None
        rec["calibrate_method"] = ORT_CALIBRATION[config.observer]  # type: ignore[attr-defined]
        rec["calibration_batches"] = getattr(config, "calibration_batches", None)
        rec["batch_size"] = config.batch_size  # type: ignore[attr-defined]
        rec["quant_format"] = "QDQ"
        if config.mode == "qat":
            rec["note"] = (
                "re-quantizes the fp32 parent by calibration on train_data: QAT fine-tuning is not carried over"
            )
    return rec


# -- when the int8 model is not faithful -------------------------------------------------------------


def suggest_float_layers(config: QuantConfig, prep: Prepared) -> str:
    """What to do when the int8 model breaks the rule: the layers to keep in float, found by
    autoquant's sensitivity ranking and verified (the rule holds with them float), else the search."""
    from ptopt.compress.autoquant import float_layers_that_hold

    data = check_data(prep)
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


def _dynamic_holds(prep: Prepared, config: QuantConfig, data: Any) -> dict[str, Any] | None:
    """The fidelity record of dynamic int8 (Linear/LSTM/GRU weights, activations on the fly) when it
    holds the int8 rule on ``data``; None when the model has no such layer or it does not hold."""
    import torch

    from ptopt.compress import quant_engine as engine
    from ptopt.compress.fidelity import INT8_VS_FP32, measure_fidelity

    kinds = {torch.nn.Linear: "linear", torch.nn.LSTM: "lstm", torch.nn.GRU: "gru"}
    layers = [m for m in prep.module.modules() if type(m) in kinds or engine.is_conv1d_linear(m)]
    covered = sum(p.numel() for m in layers for p in m.parameters(recurse=False))
    total = sum(p.numel() for p in prep.module.parameters())
    if not total or covered < 0.5 * total:  # a CNN's classifier alone: dynamic would barely change it
        return None
    types = sorted({kinds[type(m)] for m in layers if type(m) in kinds}) or ["linear"]
    try:
        with engine.quantize_context(config.backend):
            q = engine.quantize_dynamic(prep.module, types, True, config.backend)
            fid = measure_fidelity(prep.module, q, data, **INT8_VS_FP32)
    except (RuntimeError, NotImplementedError):
        return None
    return fid if fid["passed"] else None
