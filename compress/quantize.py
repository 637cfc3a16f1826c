"""Int8 quantization: the configs of the three modes and the Python twin of ``ptopt quantize``.

=========  ==============================================================  ==========================
mode       what                                                            needs
=========  ==============================================================  ==========================
dynamic    int8 weights of Linear / LSTM / GRU, activations quantized on   nothing (or data for specs)
           the fly (never convolutions: ConvInteger is slower than fp32)
static     graph-mode (FX) post-training int8: conv-bn(-relu) and          ``calib_data``
           linear-relu fused, observers calibrated on data
qat        fake-quant fine-tuning with the shared trainer, then convert    ``train_data``
=========  ==============================================================  ==========================

The output is a frozen TorchScript file that loads with plain ``torch.jit.load`` and runs the int8
kernels of its backend, plus a sidecar recording the config, the calibration, which layers stayed
float and why, and what ``ptopt export`` needs to redo the quantization in ONNX Runtime.

Only ``ptopt.compress.quant_engine`` touches ``torch.ao.quantization``; the technique files
(``quantize_static``, ``quantize_dynamic``, ``qat``) and this module go through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import warnings
from typing import Any, ClassVar

from ptopt.core.config import Config, register_config
from ptopt.core.errors import UsageError

MODES = ("dynamic", "static", "qat")
BACKENDS = ("x86", "fbgemm", "qnnpack")
OBSERVERS = ("minmax", "histogram", "percentile")
DYNAMIC_LAYERS = ("linear", "lstm", "gru")
#: ONNX Runtime's name for each observer (``CalibrationMethod``), for re-quantizing in ``ptopt export``
ORT_CALIBRATION = {"minmax": "MinMax", "histogram": "Entropy", "percentile": "Percentile"}
#: parity of the saved TorchScript against the int8 module it was traced from
TRACE_ATOL = 1e-3


@dataclasses.dataclass(frozen=True)
class QuantConfig(Config):
    """What every mode shares: the backend, the weight granularity, and the modules left float.

    ``float_modules`` are module names (``"layers.2.conv1"``) that stay fp32; in graph mode they are
    also not traced into, so code FX cannot trace can be excluded this way.
    """

    type_name = "quantize"
    mode: ClassVar[str] = ""
    backend: str = "x86"
    per_channel: bool = True
    float_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown backend {self.backend!r} (known: {', '.join(BACKENDS)})")
        object.__setattr__(self, "float_modules", tuple(self.float_modules))


@register_config
@dataclasses.dataclass(frozen=True)
class StaticQuantConfig(QuantConfig):
    """Post-training static int8 (graph mode): prepare → calibrate → convert."""

    type_name = "quantize-static"
    mode: ClassVar[str] = "static"
    #: activation observer: histogram (error-minimizing, "entropy"), minmax, percentile (99.99)
    observer: str = "histogram"
    calibration_batches: int = 32
    batch_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        obs = {"entropy": "histogram", "min-max": "minmax"}.get(self.observer, self.observer)
        if obs not in OBSERVERS:
            raise UsageError(
                f"unknown observer {self.observer!r} (known: {', '.join(OBSERVERS)}; 'entropy' = histogram)"
            )
        object.__setattr__(self, "observer", obs)
        if self.calibration_batches < 1 or self.batch_size < 1:
            raise UsageError("--calibration-batches and --batch-size must be >= 1")


@register_config
@dataclasses.dataclass(frozen=True)
class DynamicQuantConfig(QuantConfig):
    """Dynamic int8: weights int8 ahead of time, activations quantized per batch at run time."""

    type_name = "quantize-dynamic"
    mode: ClassVar[str] = "dynamic"
    layers: tuple[str, ...] = DYNAMIC_LAYERS

    def __post_init__(self) -> None:
        super().__post_init__()
        layers = tuple(str(t).lower() for t in self.layers)
        bad = [t for t in layers if t not in DYNAMIC_LAYERS]
        if bad:
            hint = (
                " (convolutions: use --mode static; dynamic int8 convs are slower than fp32)"
                if any(t.startswith("conv") for t in bad)
                else ""
            )
            raise UsageError(
                f"dynamic quantization does not handle {', '.join(bad)} "
                f"(known: {', '.join(DYNAMIC_LAYERS)}){hint}"
            )
        if not layers:
            raise UsageError("dynamic quantization needs at least one layer type (linear, lstm, gru)")
        object.__setattr__(self, "layers", layers)


@register_config
@dataclasses.dataclass(frozen=True)
class QATConfig(QuantConfig):
    """Quantization-aware training: fake-quant fine-tuning, freezing observers and BatchNorm
    statistics late in training (fractions of all steps), then convert to int8."""

    type_name = "quantize-qat"
    mode: ClassVar[str] = "qat"
    observer: str = "minmax"
    epochs: int = 1
    lr: float = 5e-5
    batch_size: int = 64
    weight_decay: float = 0.0
    #: BatchNorm running statistics stop moving after this fraction of the steps
    freeze_bn_after: float = 0.5
    #: quantization ranges stop moving after this fraction of the steps
    freeze_observers_after: float = 0.75
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.observer not in ("minmax", "min-max"):
            raise UsageError(
                f"QAT learns ranges with moving-average min-max fake quantization; observer "
                f"{self.observer!r} applies to static calibration only"
            )
        object.__setattr__(self, "observer", "minmax")
        if self.epochs < 1:
            raise UsageError(f"--epochs must be >= 1 for QAT, got {self.epochs}")
        if self.lr <= 0:
            raise UsageError(f"--lr must be > 0, got {self.lr}")
        for f in ("freeze_bn_after", "freeze_observers_after"):
            if not 0 <= getattr(self, f) <= 1:
                raise UsageError(f"{f} must be a fraction in [0, 1], got {getattr(self, f)}")


CONFIGS: dict[str, type[QuantConfig]] = {
    "static": StaticQuantConfig,
    "dynamic": DynamicQuantConfig,
    "qat": QATConfig,
}


def make_config(mode: str, **options: Any) -> QuantConfig:
    """The config of ``mode`` from keyword options; options of other modes are ignored when None."""
    if mode not in CONFIGS:
        raise UsageError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    cls = CONFIGS[mode]
    fields = {f.name for f in dataclasses.fields(cls)}
    given = {k: v for k, v in options.items() if v is not None}
    wrong = sorted(set(given) - fields)
    if wrong:
        raise UsageError(f"--mode {mode} takes no option(s) {', '.join(wrong)}")
    return cls(**given)


@dataclasses.dataclass
class QuantResult:
    """What a technique returns: the int8 module (eager-callable), the layers that stayed float
    ``{name: reason}``, and a summary for the sidecar (calibration / training)."""

    module: Any
    float_layers: dict[str, str]
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)


def quantize(
    model: Any,
    mode: str | None,
    output: str | os.PathLike,
    *,
    calib_data: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    backend: str = "x86",
    observer: str | None = None,
    per_channel: bool = True,
    calibration_batches: int | None = None,
    batch_size: int | None = None,
    exclude: Any = (),
    layers: Any = None,
    epochs: int | None = None,
    lr: float | None = None,
    config: QuantConfig | None = None,
    input_shapes: Any = (),
    weights: Any = None,
    allow_pickle: bool = False,
    progress: bool = True,
    max_accuracy_drop: float | None = None,
    min_cosine: float | None = None,
    tuning_budget: str | int | None = None,
):
    """Quantize ``model`` to int8 and write a TorchScript artifact to ``output``; returns the Artifact.

    ``model``: a MODEL reference, an nn.Module or a LoadedModel. ``calib_data`` (static),
    ``train_data`` (QAT) and ``eval_data`` (fp32 vs int8 accuracy, stored in the sidecar metrics):
    DATA references or Datasets. ``exclude``: module names kept in float. ``config`` (a
    ``StaticQuantConfig`` / ``DynamicQuantConfig`` / ``QATConfig``) replaces the per-option arguments.
    ``max_accuracy_drop`` / ``min_cosine`` (with ``eval_data``, ``tuning_budget``): accuracy-aware search
    (``ptopt.compress.autoquant``); raises GateFailedError after writing the best model when none holds.
    """
    if max_accuracy_drop is not None or min_cosine is not None:
        from ptopt.compress.autoquant import autoquantize

        found = autoquantize(
            model,
            mode or "",
            output,
            eval_data=eval_data,
            calib_data=calib_data,
            max_accuracy_drop=max_accuracy_drop,
            min_cosine=min_cosine,
            tuning_budget=tuning_budget,
            backend=backend,
            observer=observer,
            per_channel=per_channel,
            calibration_batches=calibration_batches,
            batch_size=batch_size,
            exclude=exclude,
            layers=layers,
            input_shapes=input_shapes,
            weights=weights,
            allow_pickle=allow_pickle,
            progress=progress,
        )
        found.raise_if_missed()
        return found.artifact
    from pathlib import Path

    from ptopt.core.artifact import Artifact, atomic_path
    from ptopt.core.modelref import as_loaded

    if config is None:
        opts: dict[str, Any] = {
            "backend": backend,
            "per_channel": per_channel,
            "float_modules": tuple(exclude or ()),
        }
        if mode == "static":
            opts |= {
                "observer": observer,
                "calibration_batches": calibration_batches,
                "batch_size": batch_size,
            }
        elif mode == "qat":
            opts |= {"observer": observer, "epochs": epochs, "lr": lr, "batch_size": batch_size}
        elif mode == "dynamic":
            opts |= {"layers": tuple(layers) if layers else None}
            if observer is not None:
                raise UsageError(
                    "--observer applies to static quantization (dynamic mode observes every batch)"
                )
        config = make_config(mode or "", **opts)
    elif mode is not None and mode != config.mode:
        raise UsageError(
            f"mode {mode!r} contradicts the given {type(config).__name__} (mode {config.mode!r})"
        )
    mode = config.mode
    output = Path(output)
    if output.is_dir():
        raise UsageError(f"output {output} is a folder; give a file name such as model.int8.pt")
    # fail on missing data before loading anything
    if mode == "static" and calib_data is None:
        raise UsageError(
            "static quantization needs calibration data: pass --calib-data DATA "
            "(e.g. builtin:digits32:train), or use --mode dynamic"
        )
    if mode == "qat" and train_data is None:
        raise UsageError(
            "QAT needs training data: pass --train-data DATA (labelled, e.g. builtin:digits32:train)"
        )

    loaded = as_loaded(model, weights, allow_pickle)
    module = loaded.require_module("quantization")
    if loaded.format in ("torchscript", "exported_program"):
        from ptopt.core.errors import UnsupportedModelError

        raise UnsupportedModelError(
            f"{loaded.ref} is a {loaded.format} model; quantization needs the eager nn.Module "
            "(pkg.module:factory --weights W, a zoo:NAME, or a pickled module with --allow-pickle)"
        )
    from ptopt.compress import quant_engine as engine

    engine.check_backend(config.backend)
    if config.float_modules:
        engine.check_module_names(module, config.float_modules)

    calib = _data(calib_data, "calibration", finite=True)
    train = _data(train_data, "training", finite=True)
    evald = _data(eval_data, "evaluation", finite=True)
    fit_data = calib or train
    example = _settle_inputs(loaded, fit_data or evald, input_shapes)
    for ds in (calib, train, evald):
        if ds is not None and ds is not fit_data:
            _check_fits(loaded, ds)

    with _quantize_context(config):
        if mode == "static":
            from ptopt.compress.quantize_static import quantize_static

            result = quantize_static(module, config, calib, example, progress=progress)
        elif mode == "dynamic":
            from ptopt.compress.quantize_dynamic import quantize_dynamic

            result = quantize_dynamic(module, config)
        else:
            from ptopt.compress.qat import quantize_qat

            result = quantize_qat(module, config, train, example, eval_data=evald, progress=progress)

        with atomic_path(output) as tmp:
            fp32_bytes = _save_torchscript(module, example, tmp, check=None)
            scripted = _save_torchscript(result.module, example, tmp, check=result.module)
            metrics = _metrics(module, scripted, evald, eval_data)
    metrics["fp32_torchscript_bytes"] = fp32_bytes
    cfg = config.to_dict() | {"mode": mode}
    for key, ref in (("calib_data", calib_data), ("train_data", train_data), ("eval_data", eval_data)):
        if isinstance(ref, (str, os.PathLike)):
            cfg[key] = str(ref)
    parent = loaded.parent_record()
    extra: dict[str, Any] = {
        "float_layers": result.float_layers,
        **result.summary,
        "onnx_quantization": _onnx_recipe(config, calib_data if mode == "static" else train_data, parent),
    }
    metrics["size_ratio_vs_fp32_torchscript"] = round(output.stat().st_size / fp32_bytes, 4)
    return Artifact(
        path=output,
        format="torchscript",
        inputs=list(loaded.input_specs),
        input_style=loaded.input_style,
        config=cfg,
        parent=parent,
        precision="int8",
        metrics=metrics,
        extra=extra,
    ).finalize()


# -- helpers ---------------------------------------------------------------------------------------


def _data(ref: Any, what: str, finite: bool):
    if ref is None:
        return None
    from ptopt.core.data import load_data

    ds = load_data(ref)
    if finite:
        ds.check_finite()
    return ds


def _check_fits(loaded: Any, ds: Any) -> Any:
    """ShapeMismatchError (expected vs got) when ``ds`` does not fit the model; returns a small batch."""
    from ptopt.core.inputspec import check_inputs
    from ptopt.core.modelref import run_checked

    x = ds.first_batch(min(len(ds), 2)).x
    if loaded.input_specs:
        check_inputs(loaded.input_specs, x, what=ds.name)
    run_checked(loaded, x, what=ds.name)
    return x


def _settle_inputs(loaded: Any, ds: Any, input_shapes: Any) -> Any:
    """Fix the artifact's input specs (data first, then --input-shape, then the model's own) and
    return an example batch (2 samples) for tracing."""
    from ptopt.core.inputspec import parse_named_shapes
    from ptopt.core.modelref import resolve_inputs

    if ds is not None:
        x = _check_fits(loaded, ds)
        resolve_inputs(loaded, data=ds)
        return x
    if input_shapes:
        if isinstance(next(iter(input_shapes)), str):
            input_shapes = parse_named_shapes(input_shapes)
        resolve_inputs(loaded, input_shapes=input_shapes)
    if not loaded.input_specs:
        raise UsageError(
            f"{loaded.ref}: input shape unknown; pass --input-shape (e.g. 1x3x224x224) "
            "or data (--calib-data / --eval-data)"
        )
    x = loaded.example_inputs(which="opt", batch=2)
    from ptopt.core.modelref import run_checked

    run_checked(loaded, x, what="sample input")
    return x


@contextlib.contextmanager
def _quantize_context(config: QuantConfig):
    """Backend engine for packing/running int8 weights; MHA fast path off (see quant_engine)."""
    from ptopt.compress import quant_engine as engine

    with engine.quantized_engine(config.backend), engine.mha_fastpath_disabled():
        yield


def _save_torchscript(module: Any, example: Any, path: Any, check: Any) -> Any:
    """Trace + freeze ``module`` into ``path`` and return the reloaded file, checked against ``check``
    (the int8 module); with ``check`` None only measure the serialized size (bytes)."""
    import torch

    from ptopt.core.errors import ParityError, UnsupportedModelError
    from ptopt.core.inputspec import call_args, call_model

    args, kwargs = call_args(example)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        try:
            module.eval()
            with torch.no_grad():
                if kwargs:
                    traced = torch.jit.trace(
                        module, example_kwarg_inputs=kwargs, check_trace=False, strict=False
                    )
                else:
                    traced = torch.jit.trace(
                        module, args if len(args) > 1 else args[0], check_trace=False, strict=False
                    )
                frozen = torch.jit.freeze(traced.eval())
        except Exception as e:  # noqa: BLE001 - tracing failures come in many types
            raise UnsupportedModelError(
                f"cannot save the model as TorchScript: {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0][:300]}"
            ) from None
        if check is None:
            buf = io.BytesIO()
            torch.jit.save(frozen, buf)
            return len(buf.getvalue())
        torch.jit.save(frozen, str(path))
        # the saved file must compute what the int8 module computes, also at another batch size
        loaded = torch.jit.load(str(path), map_location="cpu")
        with torch.no_grad():
            for x in (example, _rebatch(example, 1), _rebatch(example, 3)):
                want, got = call_model(check, x), call_model(loaded, x)
                if not torch.allclose(want.float(), got.float(), atol=TRACE_ATOL, rtol=1e-3):
                    diff = float((want.float() - got.float()).abs().max())
                    raise ParityError(
                        f"the traced int8 TorchScript differs from the int8 model (max |diff| "
                        f"{diff:.3g}); the model may branch on input values or shapes"
                    )
    return loaded


def _rebatch(x: Any, n: int) -> Any:
    """The example with batch ``n`` (repeating its samples)."""
    import torch

    def r(t):
        reps = -(-n // t.shape[0])
        return torch.cat([t] * reps)[:n]

    if isinstance(x, dict):
        return {k: r(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return tuple(r(v) for v in x)
    return r(x)


def _metrics(fp32: Any, int8: Any, ds: Any, ref: Any) -> dict[str, Any]:
    """fp32 vs int8 on ``ds``: top-1 accuracy with labels, else top-1 agreement with fp32."""
    if ds is None:
        return {}
    import torch

    from ptopt.core.inputspec import call_model

    n = correct32 = correct8 = agree = 0
    with torch.no_grad():
        for b in ds.batches(256):
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
