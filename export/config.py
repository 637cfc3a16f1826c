"""``ExportConfig``: what an export is asked to do, validated once, recorded in the sidecar, replayable.

``ptopt.export(model, config=ExportConfig(target="onnx", precision="int8"), data=calib)`` is the same
as passing the loose options; passing a config *and* a loose option that contradicts it is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ptopt.core.config import Config, reconcile, register_config
from ptopt.core.errors import UsageError
from ptopt.core.formats import format_for_target, targets
from ptopt.formats.base import HALF, PRECISIONS

__all__ = ["HALF", "INT8_METHODS", "PRECISIONS", "ExportConfig", "settle_config"]

INT8_METHODS = ("auto", "ort_static", "ort_dynamic", "qdq_export")
#: config fields that only some formats take -> (the CLI option, the write option that takes it)
_FORMAT_OPTIONS = {
    "static_batches": ("--static-batch", "static_batches"),
    "cuda_graphs": ("--cuda-graphs", "cuda_graphs"),
    "accuracy_control": ("--accuracy-control", "accuracy_control"),
    "float_modules": ("--exclude", "float_modules"),
}


@register_config
@dataclasses.dataclass(frozen=True)
class ExportConfig(Config):
    """What an export was asked to do (recorded in the sidecar with what was resolved: the
    precision and int8 method actually used, the calibration data's reference).

    ``precision`` None keeps the source's (an int8 artifact stays int8); ``int8_method`` None is
    ``auto`` (see ``ptopt.formats.onnx_int8``); ``atol``/``rtol``/``min_cosine`` None are the parity
    defaults (``min_cosine``: the worst sample's cosine with the source that the artifact must keep).
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
    min_cosine: float | None = None
    int8_method: str | None = None
    calib_data: str | None = None
    device: str | None = None
    cuda_graphs: bool = False
    static_batches: tuple[int, ...] = ()
    #: openvino int8: NNCF's accuracy-aware quantization, goal ``min_cosine`` or ``max_accuracy_drop``
    accuracy_control: bool = False
    max_accuracy_drop: float | None = None
    #: openvino int8: the model's modules (Linear, Conv names) whose ops NNCF leaves float
    float_modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "static_batches", _batch_list(self.static_batches))
        names = (
            [self.float_modules] if isinstance(self.float_modules, str) else list(self.float_modules or ())
        )
        object.__setattr__(self, "float_modules", tuple(str(n).strip() for n in names if str(n).strip()))
        if self.int8_method == "auto":  # the default, said out loud
            object.__setattr__(self, "int8_method", None)
        row = format_for_target(self.target)
        for name, (option, write_option) in _FORMAT_OPTIONS.items():
            if getattr(self, name) and write_option not in row.write_options:
                takers = [t for t, f in targets().items() if write_option in f.write_options]
                raise UsageError(f"{option} is for --target {' / '.join(takers)}, not --target {self.target}")
        precision = self.precision
        if precision is not None and precision not in PRECISIONS:
            raise UsageError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        if precision not in (None, "fp32", *row.converts):
            raise UsageError(
                f"--precision {precision} is not available for --target {self.target} "
                f"(it can build: fp32, {', '.join(row.converts)}; for int8 quantize first: ptopt quantize)"
            )
        row.check_config(self)
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
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise UsageError(f"--min-cosine is a cosine in [-1, 1], got {self.min_cosine!r}")
        if self.max_accuracy_drop is not None and not self.accuracy_control:
            raise UsageError("--max-accuracy-drop is the goal of --accuracy-control (openvino int8): add it")
        if self.max_accuracy_drop is not None and not self.max_accuracy_drop >= 0:
            raise UsageError(f"--max-accuracy-drop must be >= 0 points, got {self.max_accuracy_drop!r}")

    @property
    def on_cuda(self) -> bool:
        return str(self.device or "cpu").strip().lower().startswith("cuda")

    @property
    def row(self) -> Any:
        """The format this export writes (its row of ``ptopt.core.formats``)."""
        return format_for_target(self.target)

    @property
    def format(self) -> str:
        return self.row.name

    @property
    def suffix(self) -> str:
        return self.row.suffix


def settle_config(target: str | None, config: ExportConfig | None, **loose: object) -> ExportConfig:
    """One source of truth: the config, or one built from ``target`` and the loose options.

    A loose option given with a config must agree with it (else UsageError naming both values)."""
    given = {k: v for k, v in loose.items() if v is not None}
    if config is None:
        if target is None:
            raise UsageError(f"export needs a target (choose from {', '.join(targets())}) or config=")
        return ExportConfig(target=target, **given)  # type: ignore[arg-type]
    if not isinstance(config, ExportConfig):
        raise UsageError(f"config must be an ExportConfig, got {type(config).__name__}")
    if target is not None and target != config.target:
        raise UsageError(f"target {target!r} contradicts the config's target {config.target!r}; pass one")
    reconcile(config, given)
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
