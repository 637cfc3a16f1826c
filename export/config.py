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
from ptopt.core.inputspec import batch_list
from ptopt.core.options import Options, Selector, option
from ptopt.export.parity import DEFAULT_TOLERANCES, INT8_VS_FP32_RTOL
from ptopt.formats.base import HALF, PRECISIONS

#: the command that writes an int8 model of a target that cannot convert to int8 itself
INT8_FIRST = {
    "torchscript": "ptopt quantize MODEL --mode static --calib-data DATA -o model.int8.pt",
    "exported_program": "ptopt quantize MODEL --mode static --engine pt2e --no-compile --calib-data DATA "
    "-o model.int8.pt2",
    "aoti": "ptopt quantize MODEL --mode static --engine pt2e --calib-data DATA -o model.int8.pt2",
}


def _defaults(i: int) -> str:
    """The defaults of tolerance ``i`` (0: atol, 1: rtol) by precision, from ``DEFAULT_TOLERANCES``."""
    return ", ".join(f"{v[i]:g} {p}" for p, v in DEFAULT_TOLERANCES.items())


__all__ = ["HALF", "INT8_METHODS", "OPTIONS", "PRECISIONS", "ExportConfig", "ShapeOptions", "settle_config"]

INT8_METHODS = ("auto", "ort_static", "ort_dynamic", "qdq_export")


@register_config
@dataclasses.dataclass(frozen=True)
class ExportConfig(Config):
    """What an export was asked to do (recorded in the sidecar with what was resolved: the
    precision and int8 method actually used, the calibration data's reference). Its fields are
    ``ptopt export``'s options; one a format takes only (a ``write_options`` entry of its row in the
    format table) applies to that ``--target`` only.

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
    precision: str | None = option(
        None,
        help="Default: the source's. fp16/bf16: weights and activations in half precision (torchscript, "
        "exported_program, aoti, onnx; fp16 needs --device cuda); onnx: int8 via ORT static quantization; "
        "tensorrt: fp16/bf16/int8 engines.",
        choices=PRECISIONS,
    )
    opset: int | None = option(
        None, help="ONNX opset (default: the exporter's); below 18 through torch's TorchScript exporter."
    )
    optimize: bool = option(False, help="Save ORT's offline graph optimization of the model.")
    script: bool = option(False, help="torch.jit.script instead of tracing.")
    atol: float | None = option(
        None, help=f"Parity tolerance, absolute: a floor for outputs near zero (default {_defaults(0)})."
    )
    rtol: float | None = option(
        None,
        help=f"Parity tolerance, relative to the largest source output (default {_defaults(1)}; "
        f"{INT8_VS_FP32_RTOL:g} for int8 quantized here from an fp32 source).",
    )
    min_cosine: float | None = option(
        None,
        help="Your budget: the worst sample's cosine with the source the artifact must keep (default 0.99 "
        "int8, 0.999 half, 0.9999 fp32); with --accuracy-control also NNCF's goal.",
        metavar="C",
    )
    int8_method: str | None = option(
        None,
        help="int8 ONNX: auto | ort_static (ORT quantizes the fp32 parent with --data) | ort_dynamic (ORT "
        "quantize_dynamic: int8 matrix products, no calibration data) | qdq_export.",
        choices=INT8_METHODS,
    )
    #: the calibration data's reference, recorded by the export (not an option)
    calib_data: str | None = None
    device: str | None = option(
        None,
        help="cpu (default) | cuda | cuda:N: trace / export / compile and check the artifact on that GPU.",
    )
    cuda_graphs: bool = option(
        False, help="On --device cuda: replay the package through CUDA graphs (one capture per input shape)."
    )
    static_batches: tuple[int, ...] = option(
        (),
        help="Also compile a fixed-batch model for each of these batch sizes into the package (run for a "
        "batch of exactly that size; faster: Inductor prepacks conv weights only at a fixed batch).",
        flag="--static-batch",
        metavar="B[,B...]",
        csv=True,
    )
    accuracy_control: bool = option(
        False,
        help="int8: NNCF's accuracy-aware quantization (nncf.quantize_with_accuracy_control): the ops that "
        "cost the most stay float until --min-cosine C or --accuracy-budget PTS holds on the validation data.",
    )
    accuracy_budget: float | None = option(
        None,
        help="--accuracy-control's budget: points of top-1 below the fp32 model (labelled validation data).",
        deprecated={
            spelling: "the budget NNCF's search aims at is --accuracy-budget / accuracy_budget= (the same points "
            "of top-1); --max-accuracy-drop is validate's gate on a measured artifact"
            for spelling in ("--max-accuracy-drop", "max_accuracy_drop")
        },
        metavar="PTS",
        applies=("openvino",),
    )
    float_modules: tuple[str, ...] = option(
        (),
        help="int8: keep this module (a Linear or Conv of MODEL, e.g. layers.0.ff2) float; repeatable.",
        flag="--exclude",
        metavar="MODULE",
        repeat=True,
        aliases=("exclude",),
    )
    new_tokens: int | None = option(
        None,
        help="A causal LM (hf:DIR): the greedy tokens its export is checked on against transformers (default "
        "32), after the first 16 tokens of --data (text or token ids; default seeded random ids).",
        metavar="N",
        applies=("onnx", "openvino", "exported_program", "aoti"),
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "static_batches", batch_list(self.static_batches))
        names = (
            [self.float_modules] if isinstance(self.float_modules, str) else list(self.float_modules or ())
        )
        object.__setattr__(self, "float_modules", tuple(str(n).strip() for n in names if str(n).strip()))
        if self.int8_method == "auto":  # the default, said out loud
            object.__setattr__(self, "int8_method", None)
        row = format_for_target(self.target)
        OPTIONS.refuse_inapplicable(self, self.target)
        precision = self.precision
        if precision is not None and precision not in PRECISIONS:
            raise UsageError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
        if precision not in (None, "fp32", *row.converts):
            raise UsageError(
                f"--precision {precision} is not available for --target {self.target} "
                f"(it can build: fp32, {', '.join(row.converts)}"
                + (
                    f"; for int8 quantize first: {INT8_FIRST.get(self.target, 'ptopt quantize')}"
                    if precision == "int8"
                    else ""
                )
                + ")"
            )
        row.check_config(self)
        if self.int8_method is not None and self.int8_method not in INT8_METHODS:
            raise UsageError(
                f"unknown int8 ONNX method {self.int8_method!r} (choose from {', '.join(INT8_METHODS)})"
            )
        if self.opset is not None and (not isinstance(self.opset, int) or self.opset < 7):
            raise UsageError(
                f"--opset is an ONNX opset, 7 or later (what ONNX Runtime runs), got {self.opset!r}"
            )
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise UsageError(f"{name} must be >= 0, got {value!r}")
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise UsageError(f"--min-cosine is a cosine in [-1, 1], got {self.min_cosine!r}")
        if self.new_tokens is not None and (not isinstance(self.new_tokens, int) or self.new_tokens < 1):
            raise UsageError(f"--new-tokens must be a positive integer, got {self.new_tokens!r}")
        if self.accuracy_budget is not None and not self.accuracy_control:
            raise UsageError("--accuracy-budget is the budget of --accuracy-control (openvino int8): add it")
        if self.accuracy_budget is not None and not self.accuracy_budget >= 0:
            raise UsageError(f"--accuracy-budget must be >= 0 points, got {self.accuracy_budget!r}")

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


@dataclasses.dataclass(frozen=True)
class ShapeOptions:
    """The input shapes of an export beyond what the model or its data declares
    (``ptopt.formats.shapes.settle_specs``): each a ``[NAME=]SHAPE`` string, a list of them, a tuple
    of ints or ``{name: shape}``."""

    min_shape: Any = option(
        None,
        help="Smallest input shape, e.g. 1x1x32x32 or input_ids=1x16 (repeat per input).",
        metavar="[NAME=]SHAPE",
        repeat=True,
    )
    opt_shape: Any = option(
        None,
        help="Shape to optimize for (TensorRT's opt profile; the trace/export example).",
        metavar="[NAME=]SHAPE",
        repeat=True,
    )
    max_shape: Any = option(None, help="Largest input shape.", metavar="[NAME=]SHAPE", repeat=True)
    dynamic_batch: Any = option(
        None, help="Dynamic batch dimension for every input, e.g. 1:8:64.", metavar="MIN:OPT:MAX"
    )


def _write_options(target: str) -> frozenset[str]:
    return format_for_target(target).write_options


#: the options of ``ptopt export`` / ``ptopt.export``: the config's fields (a field a format's
#: ``write_options`` names applies to that format's target only) and the shapes
OPTIONS = Options(
    "export",
    lambda: (ExportConfig, ShapeOptions),
    Selector(
        "target",
        "torchscript | onnx | openvino (.xml IR, OpenVINO's CPU plugin) | tensorrt | exported_program (.pt2) | "
        "aoti (.pt2 AOTInductor package, compiled for this CPU, or the GPU of --device, and this torch).",
        lambda: list(targets()),
        _write_options,
    ),
)


def settle_config(
    target: str | None, config: ExportConfig | None, options: dict[str, Any]
) -> tuple[ExportConfig, ShapeOptions]:
    """One source of truth: the config, or one built from ``target`` and the loose ``options``
    (keywords of ``OPTIONS``), and the shapes. A loose option given with a config must agree with it
    (else UsageError naming both values)."""
    if config is not None and not isinstance(config, ExportConfig):
        raise UsageError(f"config must be an ExportConfig, got {type(config).__name__}")
    if config is not None and target is not None and target != config.target:
        raise UsageError(f"target {target!r} contradicts the config's target {config.target!r}; pass one")
    chosen = config.target if config is not None else target
    if chosen is None:
        raise UsageError(f"export needs a target (choose from {', '.join(targets())}) or config=")
    format_for_target(chosen)  # an unknown target: its one line before any option is judged by it
    given = OPTIONS.check(options, chosen)
    shapes = OPTIONS.build(ShapeOptions, given)
    if config is None:
        return OPTIONS.build(ExportConfig, given, target=chosen), shapes
    reconcile(config, OPTIONS.of(ExportConfig, given))
    return config, shapes
