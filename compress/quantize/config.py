"""Int8 quantization configs: one frozen dataclass per mode, validated in ``__post_init__``.

A config validates itself without importing torch or an engine: its own fields here, and whether
its ``engine`` runs its mode (and the options it was given) through the technique table
(``ptopt.compress.quantize.table``, whose rows import their engines only when they run).
``resolve_config`` turns the loose options of ``quantize`` / ``ptopt quantize`` into one config;
``require_data`` fails on missing data before anything is loaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any, ClassVar

from ptopt.core.config import Config, register_config
from ptopt.core.errors import UsageError
from ptopt.core.inputspec import batch_list
from ptopt.core.options import Options, Selector, fields_of, option

#: the engine a config runs on unless it says otherwise (the technique table lists it first);
#: static int8's default is ``STATIC_ENGINE``, weight-only's torchao
DEFAULT_ENGINE = "fx"
#: static int8 runs on auto unless told otherwise: fx, then PT2E, the whole model first, then the most
#: sensitive layers kept float until the int8 rule holds (``auto_int8``; a model fx quantizes whole
#: within the rule costs what ``engine="fx"`` costs: its artifact is built first and judged as written)
STATIC_ENGINE = "auto"
#: static int8 below this share of the parameters is refused: the file would be about fp32's size
MIN_STATIC_SHARE = 0.1
#: static int8 calibrated on fewer samples than this is warned about: activation ranges fitted on a few
#: dozen inputs clip the ones beyond them (random-weight EfficientNet-B0, PT2E with 66 layers float, worst
#: cosine over six draws of 64 unseen samples: 0.88 after 64 calibration samples, 0.9845 after 256, 0.9993
#: after 1,024: one input's late activations reached 8.6x what the 64 showed)
FEW_CALIBRATION_SAMPLES = 256
BACKENDS = ("x86", "fbgemm", "qnnpack")
OBSERVERS = ("minmax", "histogram", "percentile")
#: spellings of observers users know from other tools
OBSERVER_ALIASES = {"entropy": "histogram", "min-max": "minmax"}
#: layer types dynamic int8 quantizes (``embedding``: weight-only int8 rows, each with its own scale)
DYNAMIC_LAYERS = ("linear", "lstm", "gru", "embedding")
#: ONNX Runtime's name for each observer (``CalibrationMethod``), for re-quantizing in ``ptopt export``
ORT_CALIBRATION = {"minmax": "MinMax", "histogram": "Entropy", "percentile": "Percentile"}
#: weight bits weight-only quantization writes, and its methods (``engine_torchao``, ``gptq``)
WEIGHT_ONLY_BITS = (8, 4)
WEIGHT_ONLY_METHODS = ("rtn", "hqq", "awq", "gptq")
#: group sizes tinygemm's int4 CPU kernel takes
INT4_GROUP_SIZES = (32, 64, 128)
#: methods fitted on calibration text
CALIBRATED_METHODS = ("awq", "gptq")


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
    backend: str = option("x86", help="Quantized kernels.", choices=BACKENDS)
    per_channel: bool = option(
        True,
        help="Per-tensor weight scales instead of per-channel (the default).",
        flag="--per-tensor",
        negate=True,
    )
    float_modules: tuple[str, ...] = option(
        (),
        help="Keep this module (by name, e.g. layers.2.conv1) in float and don't trace into it (repeatable).",
        flag="--exclude",
        metavar="MODULE",
        repeat=True,
        aliases=("exclude",),
    )
    engine: str = option(
        DEFAULT_ENGINE,
        help="fx: torch.ao graph mode, int8 TorchScript; pt2e: torchao PT2E compiled by AOTInductor into a "
        ".pt2 package (static/qat, x86); openvino (static): NNCF int8 of the OpenVINO IR (.xml); auto "
        "(static's default): static: fx, then pt2e, then openvino (-o NAME.xml: openvino alone), the whole "
        "model first, then the most sensitive layers kept float until the int8 rule holds (what stayed float "
        "and why is printed); qat: both, the faster within 0.5 points. --mode weight-only: torchao (a Hugging "
        "Face folder) or openvino (NNCF weights, OpenVINO IR).",
    )
    compile: bool = option(
        True,
        help="pt2e: compile the int8 graph into an AOTInductor package (default), or with --no-compile "
        "write the int8 ExportedProgram .pt2 (run it with torch.compile, or ptopt export --target aoti later).",
        toggle=True,
        applies=("static", "qat"),
        note="the pt2e engine's option",
    )
    static_batches: tuple[int, ...] = option(
        (),
        help="pt2e: also compile a fixed-batch model for each of these batch sizes into the package (run for "
        "a batch of exactly that size; what export --static-batch does for fp32).",
        flag="--static-batch",
        metavar="B[,B...]",
        csv=True,
        applies=("static", "qat"),
        note="the pt2e engine's option",
    )

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown backend {self.backend!r} (known: {', '.join(BACKENDS)})")
        object.__setattr__(self, "float_modules", tuple(self.float_modules))
        object.__setattr__(self, "static_batches", batch_list(self.static_batches))
        if self.static_batches and not self.compile:
            raise UsageError(
                "--static-batch compiles fixed-batch models into the package; --no-compile writes none"
            )


def engine_observer(engine: str) -> str | None:
    """The activation observer ``engine`` calibrates with when the config names none.

    fx: the histogram (its int8 also quantizes the ops between layers). PT2E: min-max where its
    activations are 8-bit (a CPU with VNNI or AMX), the histogram where they are 7-bit (AVX2 only,
    ``engine_pt2e.reduce_range``). ptopt's int8 rule is the worst sample's, and min-max clips no input
    calibration showed, where the histogram (torchao's default) trades the extremes for resolution in the
    bulk, which 7 bits need more. Worst cosine over six draws of 64 unseen samples, 512 calibration
    samples, random weights, the layers ``bench_int8_archs`` kept float, histogram / min-max:
    8-bit: LeViT 0.958 / 0.994, DistilBERT 0.9949 / 0.9965, RoBERTa 0.9951 / 0.9963, the other eight
    PT2E models held with both (min-max at most 0.0015 lower); 7-bit: ConvNeXt 0.9944 / 0.9857,
    ShuffleNetV2 0.9918 / 0.9868 (LeViT missed with both)."""
    if engine == "fx":
        return "histogram"
    if engine == "pt2e":
        from ptopt.core.isa import int8_dot_products

        return "minmax" if int8_dot_products() else "histogram"
    return None


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
    layers: tuple[str, ...] = option(
        DYNAMIC_LAYERS, help="Layer types to quantize, comma-separated.", csv=True, choices=DYNAMIC_LAYERS
    )

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
    engine: str = STATIC_ENGINE
    observer: str | None = option(
        None,
        help="Activation observer: histogram (error-minimizing, 'entropy'), minmax, percentile (99.99); "
        "the engine's by default (fx histogram; pt2e minmax on CPUs with VNNI or AMX, else histogram); QAT "
        "learns min-max ranges.",
        default_label="the engine's",
    )
    calibration_batches: int = option(32, help="Calibrate on at most this many batches.")
    batch_size: int = option(32, help="Batch size of calibration or QAT training.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.observer is not None:
            object.__setattr__(self, "observer", normalize_observer(self.observer))
        if self.calibration_batches < 1 or self.batch_size < 1:
            raise UsageError("--calibration-batches and --batch-size must be >= 1")

    def observed(self) -> StaticQuantConfig:
        """This config with its engine's activation observer (``engine_observer``) when it names none:
        what an engine's handler calibrates with and records."""
        own = engine_observer(self.engine)
        return self if self.observer is not None or own is None else self.replace(observer=own)


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
    epochs: int = option(1, help="Fine-tuning epochs.")
    lr: float = option(5e-5, help="Learning rate of the fine-tuning.")
    batch_size: int = 64
    weight_decay: float = option(0.0, help="AdamW weight decay of the fine-tuning.")
    freeze_bn_after: float = option(
        0.5, help="BatchNorm running statistics stop moving after this fraction of the steps."
    )
    freeze_observers_after: float = option(
        0.75, help="Quantization ranges stop moving after this fraction of the steps."
    )
    seed: int = option(0, help="Seed of the fine-tuning's shuffling.")
    max_steps: int | None = option(
        None,
        help="Stop after this many optimizer steps (the learning-rate schedule and the freeze fractions "
        "span them).",
        metavar="N",
    )

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
        if self.max_steps is not None and self.max_steps < 1:
            raise UsageError(f"--max-steps must be >= 1, got {self.max_steps}")
        for f in ("freeze_bn_after", "freeze_observers_after"):
            if not 0 <= getattr(self, f) <= 1:
                raise UsageError(f"{f} must be a fraction in [0, 1], got {getattr(self, f)}")


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
    bits: int = option(8, help="Weight bits.", choices=("8", "4"))
    group_size: int | None = option(
        None,
        help="A scale per this many input columns (int4: 32, 64, 128 [128]; int8: per output channel "
        "unless given).",
    )
    method: str = option(
        "rtn",
        help="rtn (round to nearest), hqq (int4), awq or gptq (int4; both fitted on --calib-data text).",
        choices=WEIGHT_ONLY_METHODS,
    )
    calibration_samples: int = option(16, help="awq/gptq: windows of calibration text.")
    calibration_length: int = option(256, help="awq/gptq: tokens per window.")
    decode_step: int = option(
        0,
        help="Also write decode_step.pt2, the decode step as a torch.export ExportedProgram with a static KV "
        "cache of TOKENS positions (checked against the model before it is written).",
        metavar="TOKENS",
    )

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

    @property
    def group_flag(self) -> str:
        """``--group-size N`` as a message names it: the default said so (the user never typed it)."""
        return f"--group-size {self.groups}" + (" (int4's default)" if self.group_size is None else "")

    def __post_init__(self) -> None:
        if self.bits not in WEIGHT_ONLY_BITS:
            raise UsageError(f"--bits {self.bits}: weight-only quantization writes 8 or 4 bits")
        if self.method not in WEIGHT_ONLY_METHODS:
            raise UsageError(f"unknown --method {self.method!r} (known: {', '.join(WEIGHT_ONLY_METHODS)})")
        if self.method == "hqq" and self.bits != 4:
            raise UsageError(
                "--method hqq is int4 here (torchao's HQQ scales): use --bits 4, or rtn for int8"
            )
        if self.method == "gptq" and self.bits != 4:  # it packs into the int4 CPU layout only
            raise UsageError(
                "--method gptq is int4 here (ptopt's GPTQ): use --bits 4, or rtn or awq for int8"
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
#: the old spelling of a search's accuracy budget: validate's gate has that name (one meaning per name)
_OLD_BUDGET = {
    spelling: "the budget a search aims at is --accuracy-budget / accuracy_budget= (the same points of top-1); "
    "--max-accuracy-drop is validate's gate on a measured artifact"
    for spelling in ("--max-accuracy-drop", "max_accuracy_drop")
}
#: the modes accuracy-aware quantization searches
SEARCHED = ("dynamic", "static")
SENSITIVITY_METHODS = ("alone", "float")
_NOT_SEARCHED = (
    "accuracy-aware search runs on --mode static and dynamic; QAT trains instead, and a weight-only model "
    "is judged on perplexity: pass --eval-data text, and gate with ptopt validate --max-perplexity-increase"
)


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """Accuracy-aware quantization (``ptopt.compress.quantize.autoquant``): the goal the search aims
    at, how long it may search, and how it ranks the layers. Active with a goal or ``analyze``."""

    accuracy_budget: float | None = option(
        None,
        help="The search's budget: keep the top-1 accuracy drop on labelled --eval-data <= PTS points; the "
        "fastest candidate that holds is written (exit 1 with the best one if none does).",
        deprecated=_OLD_BUDGET,
        metavar="PTS",
        applies=SEARCHED,
        note=_NOT_SEARCHED,
    )
    min_cosine: float | None = option(
        None,
        help="Keep the per-sample cosine of int8 to fp32 outputs >= C on --eval-data (no labels needed); the "
        "fastest candidate that holds is written.",
        metavar="C",
        applies=SEARCHED,
        note=_NOT_SEARCHED,
    )
    tuning_budget: str | int | None = option(
        None,
        help="How long the accuracy-aware search may take: N candidates (e.g. 30) or a time (90s, 5m); "
        "default 24 candidates.",
        metavar="N|TIME",
        applies=SEARCHED,
        note=_NOT_SEARCHED,
    )
    analyze: bool = option(
        False,
        help="Print the ranked layer sensitivity on --eval-data and write nothing.",
        applies=SEARCHED,
        note=_NOT_SEARCHED,
    )
    threads: int | None = option(
        None,
        help="Accuracy-aware: torch threads while timing candidates (default: the current setting).",
        applies=SEARCHED,
        note=_NOT_SEARCHED,
    )
    sensitivity: str = option(
        "alone",
        help="Accuracy-aware: rank each layer quantized alone, or left float while the rest is int8.",
        choices=SENSITIVITY_METHODS,
        applies=SEARCHED,
        note=_NOT_SEARCHED,
    )
    latency_batch_size: int = option(
        32,
        help="Accuracy-aware: the batch size candidates are timed at.",
        applies=SEARCHED,
        note=_NOT_SEARCHED,
    )
    sensitivity_samples: int = option(
        256,
        help="Accuracy-aware: eval samples the layer sensitivity is measured on.",
        applies=SEARCHED,
        note=_NOT_SEARCHED,
    )

    def __post_init__(self) -> None:
        if not self.active and (self.tuning_budget is not None or self.threads is not None):
            raise UsageError(
                "--tuning-budget and --threads tune accuracy-aware quantization: give --accuracy-budget "
                "PTS or --min-cosine C (or --analyze)"
            )

    @property
    def active(self) -> bool:
        """A goal or ``analyze`` was given: quantize searches instead of quantizing once."""
        return self.accuracy_budget is not None or self.min_cosine is not None or self.analyze


def _mode_takes(mode: str) -> Collection[str]:
    """The options a mode takes: its config's fields (the search's are everywhere it applies)."""
    return fields_of(CONFIGS[mode]).keys()


def _modes() -> list[str]:
    return list(CONFIGS)


#: the options of ``ptopt quantize`` / ``ptopt.quantize``: every mode's config, and the search's
OPTIONS = Options(
    "quantize",
    lambda: (*(CONFIGS[m] for m in _modes()), SearchOptions),
    Selector(
        "mode",
        "dynamic: Linear/LSTM/GRU/Embedding weights int8, no calibration; static: graph-mode int8 calibrated "
        "on --calib-data; qat: fake-quant fine-tuning on --train-data, then int8; weight-only: a language "
        "model's Linear weights to int8/int4 (--bits), written as a Hugging Face folder.",
        _modes,
        _mode_takes,
        label=lambda c: getattr(c, "mode", "") or c.__name__,
    ),
)


def require_data(config: QuantConfig, **data: Any) -> None:
    """Fail on missing data before loading anything (``data``: ``calib_data=...``, ``train_data=...``)."""
    if config.needs is not None and data.get(config.needs[0]) is None:
        raise UsageError(config.needs[1])


def refuse_no_compile(config: QuantConfig) -> None:
    """For engines without an ExportedProgram or a package of their own: ``compile=False`` and
    ``static_batches`` mean nothing there."""
    if not config.compile:
        raise UsageError(
            f"--no-compile keeps the int8 ExportedProgram of --engine pt2e; --engine {config.engine} has none"
        )
    if config.static_batches and config.engine != "auto":  # auto passes them on, should it pick pt2e
        raise UsageError(
            f"--static-batch compiles fixed-batch models into --engine pt2e's package; --engine {config.engine} "
            "writes none"
        )
