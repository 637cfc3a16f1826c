"""Int8 quantization configs: one frozen dataclass per mode, validated in ``__post_init__``.

Shared by the quantization API (``quantize``), the techniques (``quantize_static``,
``quantize_dynamic``, ``qat``), accuracy-aware search and the engine (``quant_engine``), so none of
them imports another for a name. Imports no torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ptopt.core.config import Config, register_config
from ptopt.core.errors import UsageError

MODES = ("dynamic", "static", "qat")
BACKENDS = ("x86", "fbgemm", "qnnpack")
OBSERVERS = ("minmax", "histogram", "percentile")
#: layer types dynamic int8 quantizes (``embedding``: weight-only int8 rows, each with its own scale)
DYNAMIC_LAYERS = ("linear", "lstm", "gru", "embedding")
#: ONNX Runtime's name for each observer (``CalibrationMethod``), for re-quantizing in ``ptopt export``
ORT_CALIBRATION = {"minmax": "MinMax", "histogram": "Entropy", "percentile": "Percentile"}


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
    #: fx (torch.ao, int8 TorchScript) | pt2e (torchao, AOTInductor package) | auto (see quantize_pt2e)
    engine: str = "fx"
    #: pt2e: compile into an AOTInductor package (True) or keep the int8 ExportedProgram (False)
    compile: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown backend {self.backend!r} (known: {', '.join(BACKENDS)})")
        object.__setattr__(self, "float_modules", tuple(self.float_modules))
        from ptopt.compress.quantize_pt2e import check_engine

        check_engine(self)


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
            raise UsageError(
                f"dynamic quantization needs at least one layer type ({', '.join(DYNAMIC_LAYERS)})"
            )
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
