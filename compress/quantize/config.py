"""Int8 quantization configs: one frozen dataclass per mode, validated in ``__post_init__``.

A config validates itself without importing torch or an engine: its own fields here, and whether
its ``engine`` runs its mode (and the options it was given) through the technique table
(``ptopt.compress.quantize.table``, whose rows import their engines only when they run).
``resolve_config`` turns the loose options of ``quantize`` / ``ptopt quantize`` into one config;
``require_data`` fails on missing data before anything is loaded.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ptopt.compress.quantize.table import DEFAULT_ENGINE
from ptopt.core.config import Config, reconcile, register_config
from ptopt.core.errors import UsageError

BACKENDS = ("x86", "fbgemm", "qnnpack")
OBSERVERS = ("minmax", "histogram", "percentile")
#: spellings of observers users know from other tools
OBSERVER_ALIASES = {"entropy": "histogram", "min-max": "minmax"}
#: layer types dynamic int8 quantizes (``embedding``: weight-only int8 rows, each with its own scale)
DYNAMIC_LAYERS = ("linear", "lstm", "gru", "embedding")
#: ONNX Runtime's name for each observer (``CalibrationMethod``), for re-quantizing in ``ptopt export``
ORT_CALIBRATION = {"minmax": "MinMax", "histogram": "Entropy", "percentile": "Percentile"}


@dataclasses.dataclass(frozen=True)
class QuantConfig(Config):
    """What every mode shares: the backend, the weight granularity, and the modules left float.

    ``float_modules`` are module names (``"layers.2.conv1"``) that stay fp32; in graph mode they are
    also not traced into, so code FX cannot trace can be excluded this way. ``engine``: which row of
    the technique table runs the mode (fx, pt2e, auto: ``ptopt.compress.quantize.table``).
    """

    type_name = "quantize"
    mode: ClassVar[str] = ""
    #: where ``ptopt quantize --mode`` lists the mode
    order: ClassVar[int] = 0
    #: the argument this mode cannot run without, and what to say when it is missing
    needs: ClassVar[tuple[str, str] | None] = None
    backend: str = "x86"
    per_channel: bool = True
    float_modules: tuple[str, ...] = ()
    #: fx (torch.ao, int8 TorchScript) | pt2e (torchao, AOTInductor package) | auto (both, the faster)
    engine: str = DEFAULT_ENGINE
    #: pt2e: compile into an AOTInductor package (True) or keep the int8 ExportedProgram (False)
    compile: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown backend {self.backend!r} (known: {', '.join(BACKENDS)})")
        object.__setattr__(self, "float_modules", tuple(self.float_modules))
        if self.mode:
            from ptopt.compress.quantize.table import check_config

            check_config(self)


def normalize_observer(name: str) -> str:
    """``name`` as one of OBSERVERS (aliases accepted); UsageError otherwise."""
    obs = OBSERVER_ALIASES.get(str(name).lower(), str(name).lower())
    if obs not in OBSERVERS:
        raise UsageError(f"unknown observer {name!r} (known: {', '.join(OBSERVERS)}; 'entropy' = histogram)")
    return obs


@register_config
@dataclasses.dataclass(frozen=True)
class DynamicQuantConfig(QuantConfig):
    """Dynamic int8: weights int8 ahead of time, activations quantized per batch at run time."""

    type_name = "quantize-dynamic"
    mode: ClassVar[str] = "dynamic"
    order: ClassVar[int] = 1
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
            raise UsageError(
                f"dynamic quantization needs at least one layer type ({', '.join(DYNAMIC_LAYERS)})"
            )
        object.__setattr__(self, "layers", layers)


@register_config
@dataclasses.dataclass(frozen=True)
class StaticQuantConfig(QuantConfig):
    """Post-training static int8 (graph mode): prepare → calibrate → convert."""

    type_name = "quantize-static"
    mode: ClassVar[str] = "static"
    order: ClassVar[int] = 2
    needs: ClassVar[tuple[str, str] | None] = (
        "calib_data",
        "static quantization needs calibration data: pass --calib-data DATA "
        "(e.g. builtin:digits32:train), or use --mode dynamic",
    )
    #: activation observer: histogram (error-minimizing, "entropy"), minmax, percentile (99.99)
    observer: str = "histogram"
    calibration_batches: int = 32
    batch_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "observer", normalize_observer(self.observer))
        if self.calibration_batches < 1 or self.batch_size < 1:
            raise UsageError("--calibration-batches and --batch-size must be >= 1")


@register_config
@dataclasses.dataclass(frozen=True)
class QATConfig(QuantConfig):
    """Quantization-aware training: fake-quant fine-tuning, freezing observers and BatchNorm
    statistics late in training (fractions of all steps), then convert to int8."""

    type_name = "quantize-qat"
    mode: ClassVar[str] = "qat"
    order: ClassVar[int] = 3
    needs: ClassVar[tuple[str, str] | None] = (
        "train_data",
        "QAT needs training data: pass --train-data DATA (labelled, e.g. builtin:digits32:train)",
    )
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


#: weight bits weight-only quantization writes, and its methods (``engine_torchao``, ``gptq``)
WEIGHT_ONLY_BITS = (8, 4)
WEIGHT_ONLY_METHODS = ("rtn", "hqq", "awq", "gptq")
#: group sizes tinygemm's int4 CPU kernel takes
INT4_GROUP_SIZES = (32, 64, 128)
#: methods fitted on calibration text
CALIBRATED_METHODS = ("awq", "gptq")


@register_config
@dataclasses.dataclass(frozen=True)
class WeightOnlyConfig(QuantConfig):
    """Weight-only quantization of a language model's Linear layers: int8 or int4 weights with a
    scale (and, for int4, a zero) per output channel or per ``group_size`` input columns, float
    activations. ``method``: rtn (round to nearest), hqq (half-quadratic scales, int4), awq
    (activation-aware scales from calibration text), gptq (error-compensating rounding on
    calibration text). ``calibration_samples`` windows of ``calibration_length`` tokens.
    ``decode_step``: also the decode step as an ExportedProgram with a static KV cache of this many
    tokens (``ptopt.formats.hf_decode``; 0: none)."""

    type_name = "quantize-weight-only"
    mode: ClassVar[str] = "weight-only"
    order: ClassVar[int] = 4
    engine: str = "torchao"
    bits: int = 8
    group_size: int | None = None
    method: str = "rtn"
    calibration_samples: int = 16
    calibration_length: int = 256
    decode_step: int = 0

    @property
    def needs(self) -> tuple[str, str] | None:  # type: ignore[override]
        if self.method not in CALIBRATED_METHODS:
            return None
        return (
            "calib_data",
            f"--method {self.method} is fitted on text: pass --calib-data (a .txt file, token ids in a "
            f".pt/.npy, or builtin:pydoc-text:calib), or use --method rtn or hqq",
        )

    @property
    def groups(self) -> int | None:
        """The group size in effect (int4 defaults to 128; int8 to one scale per output channel)."""
        return self.group_size if self.group_size is not None or self.bits == 8 else 128

    def __post_init__(self) -> None:
        if self.bits not in WEIGHT_ONLY_BITS:
            raise UsageError(f"--bits {self.bits}: weight-only quantization writes 8 or 4 bits")
        if self.method not in WEIGHT_ONLY_METHODS:
            raise UsageError(f"unknown --method {self.method!r} (known: {', '.join(WEIGHT_ONLY_METHODS)})")
        if self.method == "hqq" and self.bits != 4:
            raise UsageError(
                "--method hqq is int4 here (torchao's HQQ scales): use --bits 4, or rtn for int8"
            )
        g = self.group_size
        if g is not None and (not isinstance(g, int) or g < 1):
            raise UsageError(f"--group-size must be a positive integer, got {g!r}")
        if self.bits == 4 and g is not None and g not in INT4_GROUP_SIZES:
            raise UsageError(
                f"--group-size {g}: int4 groups are {', '.join(map(str, INT4_GROUP_SIZES))} input columns "
                "(what the int4 CPU kernel takes)"
            )
        if not isinstance(self.decode_step, int) or self.decode_step == 1 or self.decode_step < 0:
            raise UsageError(
                f"--decode-step takes the KV cache's length in tokens (>= 2), got {self.decode_step!r}"
            )
        if self.calibration_samples < 1 or self.calibration_length < 2:
            raise UsageError("--calibration-samples must be >= 1 and --calibration-length >= 2")
        super().__post_init__()


#: mode -> its config, in the order ``ptopt quantize --mode`` lists them
CONFIGS: dict[str, type[QuantConfig]] = {
    c.mode: c for c in (DynamicQuantConfig, StaticQuantConfig, QATConfig, WeightOnlyConfig)
}
MODES = tuple(CONFIGS)
#: the loose options each mode takes besides the shared ones (backend, per_channel, engine, compile)
MODE_OPTIONS = {
    "static": ("observer", "calibration_batches", "batch_size"),
    "qat": ("observer", "epochs", "lr", "batch_size"),
    "dynamic": ("layers",),
    "weight-only": (
        "bits",
        "group_size",
        "method",
        "calibration_samples",
        "calibration_length",
        "decode_step",
    ),
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
    keep = MODE_OPTIONS.get(mode or "", ())
    stray = [k for k in MODE_OPTIONS["weight-only"] if options.get(k) is not None and k not in keep]
    if stray:
        flags = ", ".join("--" + k.replace("_", "-") for k in stray)
        raise UsageError(
            f"{flags} appl{'ies' if len(stray) == 1 else 'y'} to --mode weight-only, not --mode {mode}"
        )
    opts = {k: options.get(k) for k in ("backend", "per_channel", "engine", "compile", *keep)}
    return make_config(mode or "", float_modules=options.get("exclude"), **opts)


def require_data(config: QuantConfig, **data: Any) -> None:
    """Fail on missing data before loading anything (``data``: ``calib_data=...``, ``train_data=...``)."""
    if config.needs is not None and data.get(config.needs[0]) is None:
        raise UsageError(config.needs[1])


def refuse_no_compile(config: QuantConfig) -> None:
    """For engines without an ExportedProgram of their own: ``compile=False`` means nothing there."""
    if not config.compile:
        raise UsageError(
            f"--no-compile keeps the int8 ExportedProgram of --engine pt2e; --engine {config.engine} has none"
        )
