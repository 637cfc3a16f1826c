"""``ptopt.export``: one function, dispatching to one file per target, each export checked for parity.

    export(model, "onnx", "model.onnx", dynamic_batch="1:8:64")

Order of work, so that bad input fails fast and nothing is half-written:

1. the target, the precision and (for TensorRT) the backend are checked before the model loads;
2. the InputSpecs are settled (``shapes.settle_specs``) and the source runs at the min and max
   shapes (a wrong rank is a ShapeMismatchError naming expected vs got);
3. the target writes into a staging folder next to the output;
4. the artifact runs in its own runtime against the source at min/opt/max (``parity``); past
   tolerance it is moved aside as ``OUT.failed`` and ParityError (exit 2) is raised;
5. the files are renamed into place and the sidecar is written.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.core.config import Config, register_config
from ptopt.core.errors import ParityError, UsageError
from ptopt.core.inputspec import InputSpec, make_inputs

#: target → (artifact format, file suffix it conventionally gets)
TARGETS: dict[str, tuple[str, str]] = {
    "torchscript": ("torchscript", ".pt"),
    "onnx": ("onnx", ".onnx"),
    "tensorrt": ("tensorrt", ".ep"),
    "exported_program": ("exported_program", ".pt2"),
}
PRECISIONS = ("fp32", "fp16", "int8")
#: precisions a target can convert to (besides keeping the source's precision)
CONVERTS: dict[str, tuple[str, ...]] = {
    "torchscript": (),
    "exported_program": (),
    "onnx": ("int8",),
    "tensorrt": ("fp16", "int8"),
}


@register_config
@dataclasses.dataclass(frozen=True)
class ExportConfig(Config):
    """What an export was asked to do (recorded in the sidecar; replayable)."""

    type_name = "export"
    target: str = "onnx"
    precision: str = "fp32"
    opset: int | None = None
    optimize: bool = False
    script: bool = False
    atol: float | None = None
    rtol: float | None = None
    int8_method: str | None = None
    calib_data: str | None = None


def export(
    model: Any,
    target: str,
    output: str | os.PathLike,
    *,
    min_shape: Any = None,
    opt_shape: Any = None,
    max_shape: Any = None,
    dynamic_batch: Any = None,
    input_specs: Sequence[InputSpec | dict] | None = None,
    precision: str | None = None,
    opset: int | None = None,
    optimize: bool = False,
    script: bool = False,
    atol: float | None = None,
    rtol: float | None = None,
    data: Any = None,
    weights: Any = None,
    allow_pickle: bool = False,
    int8_method: str = "auto",
    external_data: bool | None = None,
) -> Artifact:
    """Export ``model`` to ``target`` at ``output``; returns the written Artifact.

    - ``min_shape/opt_shape/max_shape``: ``"1x1x32x32"``, ``["input_ids=1x16", ...]`` or
      ``{"input_ids": (1, 16)}``; ``dynamic_batch``: ``"1:8:64"`` (dimension 0 of every input).
      Without any, the model's declared inputs (or ``data``'s) are used, batch dynamic in [1, 64].
    - ``precision``: default the source's (an int8 artifact stays int8). ``onnx`` converts fp32 →
      int8 with ``data`` as calibration; ``tensorrt`` builds fp16/int8 engines.
    - ``data``: DATA reference or Dataset: input shapes when the model declares none, and int8
      calibration (overrides what an int8 source's sidecar records).
    - ``atol/rtol``: parity tolerance (defaults in ``ptopt.export.parity.DEFAULT_TOLERANCES``).
    - ``int8_method``: ``auto`` | ``ort_static`` | ``qdq_export`` (see ``ptopt.export.onnx_int8``).
    """
    if target not in TARGETS:
        raise UsageError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
    if precision is not None and precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    if precision is not None and precision != "fp32" and not CONVERTS[target]:
        raise UsageError(
            f"--precision {precision} is not available for --target {target}: it keeps the source's "
            f"precision; quantize first (ptopt quantize) or export to onnx/tensorrt"
        )
    if precision is not None and precision not in ("fp32", *CONVERTS[target]):
        raise UsageError(
            f"--precision {precision} is not available for --target {target} "
            f"(it can build: fp32, {', '.join(CONVERTS[target])})"
        )
    if target == "tensorrt":
        from ptopt.export.tensorrt import check_available

        check_available()
    fmt, _ = TARGETS[target]
    out = Path(output)
    if out.is_dir():
        raise UsageError(
            f"output {out} is a folder; give a file path, e.g. {out / ('model' + TARGETS[target][1])}"
        )

    from ptopt.core.modelref import as_loaded
    from ptopt.export import onnx_int8

    loaded = as_loaded(model, weights, allow_pickle)
    if loaded.format == "onnx":
        raise UsageError(f"{loaded.ref} is already ONNX; export starts from a PyTorch model")
    module = loaded.require_module(f"--target {target}")
    src_precision = (
        "int8"
        if onnx_int8.is_int8_source(loaded)
        else (loaded.artifact.precision if loaded.artifact is not None else "fp32")
    )
    want = precision or src_precision
    if want != src_precision and want not in CONVERTS[target]:
        raise UsageError(
            f"--precision {want}: the source is {src_precision} and --target {target} cannot "
            f"convert it; export its fp32 parent instead"
        )
    if target == "tensorrt" and src_precision == "int8":
        raise UsageError(
            "--target tensorrt takes an fp32 model: export the int8 artifact's fp32 parent with "
            "--precision int8 --data CALIB"
        )

    calib, calib_ref = _calibration(data, loaded, want, src_precision, target)
    specs, style = _settle(loaded, calib, input_specs, min_shape, opt_shape, max_shape, dynamic_batch)
    _source_runs(loaded, specs, style)

    config = ExportConfig(
        target=target,
        precision=want,
        opset=opset,
        optimize=optimize,
        script=script,
        atol=atol,
        rtol=rtol,
        calib_data=calib_ref,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    # absolute: ORT's quantization tools run in a temporary working directory
    stage = Path(tempfile.mkdtemp(prefix=".ptopt-export-", dir=out.parent)).resolve()
    try:
        tmp = stage / out.name
        info = _write(
            target,
            loaded,
            module,
            specs,
            style,
            tmp,
            want,
            src_precision,
            calib,
            opset=opset,
            optimize=optimize,
            script=script,
            int8_method=int8_method,
            external_data=external_data,
            allow_pickle=allow_pickle,
        )
        if info.get("int8_method"):
            config = config.replace(int8_method=info["int8_method"])
        metrics = _parity(
            loaded, module, tmp, fmt, specs, style, want, atol, rtol, stage, out, info["files"], samples=calib
        )
        for f in info["files"]:
            os.replace(stage / f, out.parent / f)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

    extra = {k: v for k, v in info.items() if k != "files"}
    if target == "onnx":
        from ptopt.export.shapes import trtexec_shapes

        extra["trtexec_shapes"] = trtexec_shapes(specs, info.get("input_names"))
    outputs = [{"name": n} for n in info.get("output_names", [])]
    return Artifact(
        path=out,
        format=fmt,
        inputs=specs,
        input_style=style,
        outputs=outputs,
        config=config.to_dict(),
        parent=loaded.parent_record(),
        precision=want,
        files=info["files"],
        metrics={"parity": metrics},
        extra=extra,
    ).finalize()


def _calibration(
    data: Any, loaded: Any, want: str, src_precision: str, target: str
) -> tuple[Any, str | None]:
    """The Dataset to calibrate with (None when not needed/known) and its reference string."""
    from ptopt.core.data import load_data
    from ptopt.export.onnx_int8 import recorded_calib_data

    needs = want == "int8" and (src_precision != "int8" or target == "onnx")
    ref = data if isinstance(data, (str, os.PathLike)) else None
    if data is None and needs and src_precision == "int8":
        ref = recorded_calib_data(loaded)
        data = ref
    if needs and data is None and src_precision != "int8":
        raise UsageError(
            f"--precision int8 for --target {target} needs calibration data: pass --data CALIB "
            f"(e.g. builtin:digits32:train)"
        )
    ds = load_data(data) if data is not None else None
    return ds, (str(ref) if ref is not None else None)


def _settle(
    loaded: Any,
    data: Any,
    input_specs: Any,
    min_shape: Any,
    opt_shape: Any,
    max_shape: Any,
    dynamic_batch: Any,
) -> tuple[list[InputSpec], str]:
    from ptopt.core.inputspec import input_style
    from ptopt.export.shapes import settle_specs

    style = loaded.input_style
    if input_specs:
        base = [s if isinstance(s, InputSpec) else InputSpec.from_dict(s) for s in input_specs]
        style = _infer_style(loaded.module, base, style)
    elif loaded.input_specs:
        base = list(loaded.input_specs)
    elif data is not None:
        base = data.input_specs()
        style = input_style(data.first_batch(1).x)
    else:
        base = []
    specs = settle_specs(
        base, min_shape=min_shape, opt_shape=opt_shape, max_shape=max_shape, dynamic_batch=dynamic_batch
    )
    if not base:
        style = _infer_style(loaded.module, specs, style)
    if style == "keyword":
        specs = _forward_order(loaded.module, specs)
    return specs, style


def _forward_order(module: Any, specs: list[InputSpec]) -> list[InputSpec]:
    """Keyword inputs in ``forward``'s parameter order: exporters name graph inputs in that order."""
    import inspect

    try:
        order = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return specs
    return sorted(specs, key=lambda s: order.index(s.name) if s.name in order else len(order))


def _infer_style(module: Any, specs: Sequence[InputSpec], default: str) -> str:
    """Keyword when several inputs are named after ``forward``'s parameters (``input_ids=...``)."""
    import inspect

    if len(specs) < 2:
        return default
    try:
        params = set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return default
    return "keyword" if all(s.name in params for s in specs) else default


def _source_runs(loaded: Any, specs: list[InputSpec], style: str) -> None:
    """The source must accept the min and max shapes before any export work starts."""
    from ptopt.core.modelref import run_checked

    for which in ("min", "max"):
        run_checked(loaded, make_inputs(specs, style, which=which), what=f"the {which} shape")


def _write(
    target: str,
    loaded: Any,
    module: Any,
    specs: list[InputSpec],
    style: str,
    tmp: Path,
    want: str,
    src_precision: str,
    calib: Any,
    *,
    opset: Any,
    optimize: bool,
    script: bool,
    int8_method: str,
    external_data: Any,
    allow_pickle: bool,
) -> dict:
    fmt = loaded.format
    if target == "torchscript":
        from ptopt.export.torchscript import export_torchscript

        return export_torchscript(module, specs, style, tmp, script=script, source_format=fmt)
    if target == "exported_program":
        from ptopt.export.exported_program import export_exported_program

        return export_exported_program(module, specs, style, tmp, source_format=fmt)
    if target == "tensorrt":
        from ptopt.export.tensorrt import export_tensorrt

        return export_tensorrt(module, specs, style, tmp, precision=want, calib=calib)
    if want == "int8":
        from ptopt.export import onnx_int8

        method = onnx_int8.choose_method(int8_method, loaded, calib is not None)
        if method == "qdq_export":
            return onnx_int8.qdq_export(module, specs, style, tmp, opset=opset, source_format=fmt)
        if src_precision == "int8":
            parent = onnx_int8.fp32_parent(loaded, allow_pickle)
            fp32_module, parent_fmt = parent.require_module("ORT static quantization"), parent.format
        else:
            fp32_module, parent_fmt = module, fmt
        info = onnx_int8.ort_static_quantize(
            fp32_module, specs, style, tmp, calib, opset=opset, source_format=parent_fmt
        )
        info["quantized_from"] = parent.parent_record() if src_precision == "int8" else loaded.parent_record()
        return info
    from ptopt.export.onnx import export_onnx

    return export_onnx(
        module,
        specs,
        style,
        tmp,
        opset=opset,
        optimize=optimize,
        external_data=external_data,
        source_format=fmt,
    )


def _parity(
    loaded: Any,
    module: Any,
    tmp: Path,
    fmt: str,
    specs: list[InputSpec],
    style: str,
    precision: str,
    atol: Any,
    rtol: Any,
    stage: Path,
    out: Path,
    files: list[str],
    samples: Any = None,
) -> dict:
    from ptopt.export.parity import artifact_runner, check_parity, torch_runner

    try:
        return check_parity(
            torch_runner(module),
            artifact_runner(tmp, fmt, specs),
            specs,
            style,
            precision=precision,
            atol=atol,
            rtol=rtol,
            what=f"the exported {fmt} model",
            samples=samples,
        )
    except ParityError as e:
        kept = []
        for f in files:
            dest = out.parent / (f + ".failed")
            os.replace(stage / f, dest)
            kept.append(str(dest))
        raise ParityError(
            f"{e}; the artifact is kept aside for inspection as {', '.join(kept)} "
            f"(loosen with --atol/--rtol if this drift is acceptable)"
        ) from None
