"""``ExportConfig``: what an export is asked to do, validated once, recorded in the sidecar, replayable.

``ptopt.export(model, config=ExportConfig(target="onnx", precision="int8"), data=calib)`` is the same
as passing the loose options; passing a config *and* a loose option that contradicts it is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ptopt.core.config import Config, register_config
from ptopt.core.errors import UsageError

#: target → (artifact format, file suffix it conventionally gets)
TARGETS: dict[str, tuple[str, str]] = {
    "torchscript": ("torchscript", ".pt"),
    "onnx": ("onnx", ".onnx"),
    "tensorrt": ("tensorrt", ".ep"),
    "exported_program": ("exported_program", ".pt2"),
    # an AOTInductor package: the model compiled for this CPU with Inductor (ptopt.export.aoti)
    "aoti": ("aoti_package", ".pt2"),
}
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
#: half precisions: weights and floating-point activations in float16 / bfloat16 (model.to(dtype),
#: inputs cast at the boundary); TensorRT instead enables them as kernel precisions
HALF = ("fp16", "bf16")
#: precisions a target can convert to (besides keeping the source's precision)
CONVERTS: dict[str, tuple[str, ...]] = {
    "torchscript": HALF,
    "exported_program": HALF,
    "aoti": HALF,
    "onnx": ("int8", *HALF),
    "tensorrt": ("fp16", "bf16", "int8"),
}
#: targets that take ``--device`` (the model is traced / compiled on it and checked there)
DEVICE_TARGETS = ("torchscript", "exported_program", "aoti", "onnx", "tensorrt")
INT8_METHODS = ("auto", "ort_static", "qdq_export")
#: the options a config carries that ``export()`` also takes loose
LOOSE_OPTIONS = (
    "precision",
    "opset",
    "optimize",
    "script",
    "atol",
    "rtol",
    "int8_method",
    "device",
    "cuda_graphs",
    "static_batches",
)


@register_config
@dataclasses.dataclass(frozen=True)
class ExportConfig(Config):
    """What an export was asked to do (recorded in the sidecar with what was resolved: the
    precision and int8 method actually used, the calibration data's reference).

    ``precision`` None keeps the source's (an int8 artifact stays int8); ``int8_method`` None is
    ``auto`` (see ``ptopt.export.onnx_int8``); ``atol``/``rtol`` None are the parity defaults.
    ``device``: ``cpu`` (None) or ``cuda[:N]``, where the model is traced/compiled and checked
    (``ptopt.core.device.resolve_device`` checks it exists when the export runs); ``cuda_graphs``:
    an AOTInductor package on CUDA run through CUDA graphs (``ptopt.core.cudagraph``);
    ``static_batches``: batch sizes that get a fixed-batch model in an AOTInductor package.
    """

    type_name = "export"
    target: str = "onnx"
    precision: str | None = None
    opset: int | None = None
    optimize: bool = False
    script: bool = False
    atol: float | None = None
    rtol: float | None = None
    int8_method: str | None = None
    calib_data: str | None = None
    device: str | None = None
    cuda_graphs: bool = False
    static_batches: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "static_batches", _batch_list(self.static_batches))
        if self.static_batches and self.target != "aoti":
            raise UsageError(
                f"--static-batch is for --target aoti (fixed-batch models inside one AOTInductor package), "
                f"not --target {self.target}"
            )
        target, precision = self.target, self.precision
        if target not in TARGETS:
            raise UsageError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
        if precision is not None and precision not in PRECISIONS:
            raise UsageError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        if precision not in (None, "fp32", *CONVERTS[target]):
            raise UsageError(
                f"--precision {precision} is not available for --target {target} "
                f"(it can build: fp32, {', '.join(CONVERTS[target])}; for int8 quantize first: ptopt quantize)"
            )
        self._check_device()
        if self.int8_method is not None and self.int8_method not in INT8_METHODS:
            raise UsageError(
                f"unknown int8 ONNX method {self.int8_method!r} (choose from {', '.join(INT8_METHODS)})"
            )
        if self.opset is not None and (not isinstance(self.opset, int) or self.opset <= 0):
            raise UsageError(f"opset must be a positive integer, got {self.opset!r}")
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise UsageError(f"{name} must be >= 0, got {value!r}")

    def _check_device(self) -> None:
        """What the device string alone decides (whether that device exists is checked at export)."""
        on_cuda = str(self.device or "cpu").strip().lower().startswith("cuda")
        if self.device is not None and self.target not in DEVICE_TARGETS:
            raise UsageError(f"--device is not available for --target {self.target}")
        if self.precision == "fp16" and not on_cuda and self.target != "tensorrt":
            raise UsageError(
                "--precision fp16 on the CPU: CPU kernels for float16 are missing or slow and nothing "
                "deploys fp16 there; use --precision bf16 on the CPU, or fp16 with --device cuda"
            )
        if self.precision == "bf16" and self.target == "onnx" and not on_cuda:
            raise UsageError(
                "--target onnx --precision bf16 on the CPU: ONNX Runtime's CPU provider has no bfloat16 "
                "kernels (MatMul, Conv, Add), so the artifact cannot be checked or run here; use "
                "--target torchscript/exported_program/aoti for bf16 on the CPU, or --device cuda with "
                "onnxruntime-gpu"
            )
        if self.cuda_graphs and (self.target != "aoti" or not on_cuda):
            raise UsageError(
                "--cuda-graphs needs --target aoti --device cuda: CUDA graphs replay GPU kernel launches, "
                f"and this export is --target {self.target} on {self.device or 'cpu'}"
            )

    @property
    def on_cuda(self) -> bool:
        return str(self.device or "cpu").strip().lower().startswith("cuda")

    @property
    def format(self) -> str:
        return TARGETS[self.target][0]

    @property
    def suffix(self) -> str:
        return TARGETS[self.target][1]


def settle_config(target: str | None, config: ExportConfig | None, **loose: object) -> ExportConfig:
    """One source of truth: the config, or one built from ``target`` and the loose options.

    A loose option given with a config must agree with it (else UsageError naming both values)."""
    given = {k: v for k, v in loose.items() if v is not None}
    if config is None:
        if target is None:
            raise UsageError(f"export needs a target (choose from {', '.join(TARGETS)}) or config=")
        if given.get("int8_method") == "auto":
            given.pop("int8_method")
        return ExportConfig(target=target, **given)  # type: ignore[arg-type]
    if not isinstance(config, ExportConfig):
        raise UsageError(f"config must be an ExportConfig, got {type(config).__name__}")
    if target is not None and target != config.target:
        raise UsageError(f"target {target!r} contradicts the config's target {config.target!r}; pass one")
    for name, value in given.items():
        have = getattr(config, name)
        if name == "static_batches":
            value = _batch_list(value)
        if have != value and not (name == "int8_method" and value == "auto" and have is None):
            raise UsageError(
                f"{name}={value!r} contradicts the config's {name}={have!r}; pass the option in the "
                f"config or loose, not both"
            )
    return config


def _batch_list(value: Any) -> tuple[int, ...]:
    """``"1,32"`` / ``[1, 32]`` / ``()`` as a sorted tuple of positive batch sizes (UsageError otherwise)."""
    if isinstance(value, int):
        value = [value]
    items = value.split(",") if isinstance(value, str) else list(value or ())
    try:
        batches = sorted({int(str(b).strip()) for b in items if str(b).strip()})
    except (TypeError, ValueError):
        raise UsageError(f"--static-batch {value!r}: give batch sizes as integers, e.g. 1,32") from None
    if any(b <= 0 for b in batches):
        raise UsageError(f"--static-batch {value!r}: batch sizes must be positive")
    return tuple(batches)
