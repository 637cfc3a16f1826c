"""int8 ONNX: an int8 source stays int8 in ONNX, a graph ORT runs with its int8 kernels.

The ways:

- ``ort_static`` (default): ORT's own static quantization of the **fp32 parent** (recorded in the
  int8 artifact's sidecar) with the **calibration data the sidecar records** (``config.calib_data``;
  ``data=`` overrides): export the parent to fp32 ONNX, ``quant_pre_process``, then
  ``quantize_static`` (QDQ, per-channel int8 weights, uint8 activations with ``reduce_range``,
  MinMax calibration). Works for every int8 source, TorchScript archives included, and for an fp32
  model with ``--precision int8 --data CALIB``.
- ``ort_dynamic``: ORT's dynamic quantization (int8 weights, activations quantized per batch) of an
  fp32 model, or of a **dynamic** int8 source's fp32 parent: ``auto`` picks it for a source whose
  sidecar records ``mode: dynamic``, so the ONNX file quantizes what the source quantized.
- ``qdq_export``: the quantized nn.Module itself (eager or FX int8) through the TorchScript exporter
  (``dynamo=False``, opset 17: the only exporter that knows the quantized ops). TorchScript int8
  archives do not export this way (their packed weights are not constants the exporter can read).

Which is the default was measured on zoo:resnet (benchmarks/bench_export.py, docs/export.md):
``ort_static`` was faster in ORT at batch 32 and at least as accurate.

Why ``reduce_range``: without AVX512-VNNI, ORT's u8×s8 kernels (VPMADDUBSW) can saturate the int16
accumulators; 7-bit weights avoid it (the same choice torch's x86 qconfig makes). Measured on
zoo:resnet here: plain s8/s8 per-channel 68.5 % accuracy, with reduce_range 99.4 % (fp32 99.4 %).
``ort_dynamic`` makes the same choice: a 32-64-10 MLP under ORT 1.32's ``quantize_dynamic`` gave a worst
cosine of 0.927 to fp32 with 8-bit s8 weights and 0.9998 with ``reduce_range`` (AMD EPYC, AVX2; CI's
machine failed the same test).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec, flatten_inputs

METHODS = ("auto", "ort_static", "ort_dynamic", "qdq_export")
#: chosen by measurement (see the module docstring)
DEFAULT_METHOD = "ort_static"
#: calibration samples ORT sees at most (MinMax over more changes nothing measurable here)
CALIB_SAMPLES = 2048
CALIB_BATCH = 64


def is_int8_source(loaded: Any) -> bool:
    art = loaded.artifact
    if art is not None and art.precision == "int8":
        return True
    module = loaded.module
    if module is None or loaded.format == "torchscript":
        return False
    import torch

    return any(isinstance(t, torch.Tensor) and t.is_quantized for t in module.state_dict().values()) or any(
        type(m).__module__.startswith("torch.ao.nn.quantized") for m in module.modules()
    )


def recorded_calib_data(loaded: Any) -> str | None:
    art = loaded.artifact
    cfg = (art.config or {}) if art is not None else {}
    ref = cfg.get("calib_data")
    return ref if isinstance(ref, str) and ref else None


def fp32_parent(loaded: Any, allow_pickle: bool = False) -> Any:
    """The fp32 model an int8 artifact was made from: in memory for a stage's Result (its source),
    else loaded from its sidecar's parent record."""
    from ptopt.core.modelref import load_model

    if loaded.info.get("source") is not None:
        return loaded.info["source"]
    art = loaded.artifact
    parent = art.parent if art is not None else None
    if not parent or not parent.get("path"):
        raise ModelLoadError(f"{loaded.ref}: its sidecar records no parent fp32 model to quantize with ORT")
    try:
        return load_model(parent["path"], weights=parent.get("weights"), allow_pickle=allow_pickle)
    except ModelLoadError as e:
        raise ModelLoadError(f"{loaded.ref}: cannot load its fp32 parent {parent['path']!r}: {e}") from None


def int8_options(
    options: dict[str, Any], source: Any, config: Any, calib: Any, allow_pickle: bool
) -> tuple[dict[str, Any], dict | None]:
    """The ONNX writer's options for an int8 export (``options``: the common ones), and the record of
    the fp32 model ORT quantized (None for ``qdq_export``, which exports the int8 model itself)."""
    method = choose_method(config.int8_method or "auto", source.loaded, calib is not None)
    if method == "qdq_export":
        return {**options, "int8_method": method}, None
    if method == "ort_dynamic" and source.precision != "int8":
        return {**options, "int8_method": method, "fp32_module": source.module}, None
    parent = source.loaded
    if method == "ort_dynamic":  # a dynamic int8 source: ORT's dynamic quantization of its fp32 parent
        parent = fp32_parent(source.loaded, allow_pickle)
        fp32 = parent.require_module("ORT dynamic quantization")
        return {**options, "int8_method": method, "fp32_module": fp32}, parent.parent_record()
    if source.precision == "int8":
        parent = fp32_parent(source.loaded, allow_pickle)
    fp32 = parent.require_module("ORT static quantization")
    options.update(int8_method=method, calib=calib, fp32_module=fp32, fp32_source_format=parent.format)
    return options, parent.parent_record()


def choose_method(method: str, loaded: Any, have_calib: bool) -> str:
    if method not in METHODS:
        raise UsageError(f"unknown int8 ONNX method {method!r} (choose from {', '.join(METHODS)})")
    source_int8 = is_int8_source(loaded)
    parent = loaded.artifact.parent if loaded.artifact is not None else None
    if method == "ort_dynamic" and source_int8 and not (parent and parent.get("path")):
        raise UsageError(
            "int8 method ort_dynamic quantizes an fp32 model's matrix products; this source is int8 and its "
            "sidecar records no fp32 parent: export the fp32 model with --precision int8 --int8-method ort_dynamic"
        )
    if method == "qdq_export" and not source_int8:
        raise UsageError(
            "int8 method qdq_export exports an already quantized model; this source is fp32 "
            "(use the default ort_static with --data for calibration)"
        )
    if method != "auto":
        return method
    if not source_int8:
        return "ort_static"
    if parent and parent.get("path") and _source_mode(loaded) == "dynamic":
        return "ort_dynamic"  # the source's own scheme: int8 weights, activations quantized per batch
    if have_calib and parent and parent.get("path"):
        return DEFAULT_METHOD
    if loaded.format == "torchscript":
        raise UsageError(
            f"{loaded.ref} is an int8 TorchScript archive: ONNX needs ORT's static quantization of its fp32 "
            f"parent, but its sidecar records no "
            + (
                "calibration data; pass --data CALIB"
                if parent
                else "parent model; export the fp32 model with --precision int8 --data CALIB"
            )
        )
    return "qdq_export"


def _source_mode(loaded: Any) -> str | None:
    """How the int8 source was quantized, as its sidecar records it (``dynamic``, ``static``, ``qat``)."""
    art = loaded.artifact
    return (art.config or {}).get("mode") if art is not None else None


class _Reader:
    """onnxruntime.quantization CalibrationDataReader over a Dataset (inputs matched by name / order)."""

    def __init__(self, data: Any, input_names: Sequence[str]):
        self._batches = iter(data.take(CALIB_SAMPLES).batches(CALIB_BATCH))
        self._names = list(input_names)

    def get_next(self) -> dict | None:
        b = next(self._batches, None)
        if b is None:
            return None
        if isinstance(b.x, dict) and all(n in b.x for n in self._names):
            return {n: b.x[n].numpy() for n in self._names}
        return {n: t.numpy() for n, (_, t) in zip(self._names, flatten_inputs(b.x), strict=False)}

    def rewind(self) -> None:  # pragma: no cover - ORT calls it only for some calibrators
        pass


@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    # quant_pre_process leaves temporary files in the working directory when it fails
    prev = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(prev)


def ort_static_quantize(
    fp32_module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    calib: Any,
    *,
    opset: int | None = None,
    source_format: str = "eager",
) -> dict:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from ptopt.core.data import load_data
    from ptopt.formats.capture import quiet_export
    from ptopt.formats.onnx_export import check_onnx, export_onnx

    if opset is not None and opset < 13:
        raise UsageError(
            f"--opset {opset}: ORT's static int8 writes per-channel weights (DequantizeLinear's axis), which "
            "need opset 13 or later"
        )
    calib = load_data(calib)
    calib.check_finite()
    path = Path(path).resolve()  # quant_pre_process runs in the temporary folder below
    with tempfile.TemporaryDirectory(prefix="ptopt-int8-") as d:
        tmp = Path(d)
        info = export_onnx(
            fp32_module, specs, style, tmp / "fp32.onnx", opset=opset, source_format=source_format
        )
        pre, info["pre_process"] = pre_process(tmp / "fp32.onnx", tmp)
        try:
            with quiet_export(), _in_dir(tmp):
                quantize_static(
                    str(pre),
                    str(path),
                    _Reader(calib, info["input_names"]),
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                    reduce_range=True,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                )
        except (ValueError, RuntimeError, KeyError, TypeError, IndexError) as e:
            raise ort_failure("static", e) from None
    check_onnx(path)
    info.update(
        {
            "files": [path.name],
            "int8_method": "ort_static",
            "quantization": {
                "format": "QDQ",
                "per_channel": True,
                "reduce_range": True,
                "activations": "uint8",
                "weights": "int8",
                "calibration": "MinMax",
                "calibration_samples": min(len(calib), CALIB_SAMPLES),
            },
        }
    )
    return info


#: the ops ORT's dynamic quantization makes int8: matrix products only (ConvInteger, the dynamic
#: convolution, runs 7x slower than fp32 on the CPU: REFERENCE.md)
DYNAMIC_OPS = ("MatMul", "Gemm", "Attention", "LSTM", "GRU")


def ort_dynamic_quantize(
    fp32_module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    *,
    opset: int | None = None,
    source_format: str = "eager",
) -> dict:
    """``onnxruntime.quantization.quantize_dynamic`` of the model's fp32 ONNX export: int8 weights
    (per channel) for the matrix products, activations quantized per call; no calibration data."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from ptopt.formats.capture import quiet_export
    from ptopt.formats.onnx_export import check_onnx, export_onnx

    path = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="ptopt-int8-") as d:
        tmp = Path(d)
        info = export_onnx(
            fp32_module, specs, style, tmp / "fp32.onnx", opset=opset, source_format=source_format
        )
        pre, info["pre_process"] = pre_process(tmp / "fp32.onnx", tmp)
        try:
            with quiet_export(), _in_dir(tmp):
                quantize_dynamic(
                    str(pre), str(path), per_channel=True, reduce_range=True, weight_type=QuantType.QInt8,
                    op_types_to_quantize=list(DYNAMIC_OPS),
                )  # fmt: skip
        except (ValueError, RuntimeError, KeyError, TypeError, IndexError) as e:
            raise ort_failure("dynamic", e) from None
    check_onnx(path)
    info.update(
        files=[path.name],
        int8_method="ort_dynamic",
        quantization={
            "format": "QOperator (dynamic)",
            "per_channel": True,
            "reduce_range": True,
            "weights": "int8",
            "ops": list(DYNAMIC_OPS),
        },
    )
    return info


def pre_process(src: Path, tmp: Path) -> tuple[Path, str]:
    """ORT's ``quant_pre_process`` (shape inference, graph optimization) of ``src``, falling back when
    its symbolic shape inference fails on a real graph (e.g. on an ``Expand``: ``TypeError ...
    NoneType has no len()``) to the pass without it, and then to the graph as it is. Returns the file to
    quantize and which pass it had (recorded in the sidecar)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from ptopt.formats.capture import quiet_export

    out = tmp / "pre.onnx"
    for how, options in (
        ("full", {"auto_merge": True}),
        ("no symbolic shapes", {"skip_symbolic_shape": True}),
    ):
        try:
            with quiet_export(), _in_dir(tmp):
                quant_pre_process(str(src), str(out), **options)
            return out, how
        except Exception:  # noqa: BLE001 - onnxruntime's shape inference raises whatever the graph provokes
            continue
    return src, "none (onnxruntime's pre-processing failed on this graph)"


def ort_failure(kind: str, e: BaseException) -> Exception:
    """A failure inside onnxruntime's quantization, naming it and its version."""
    import onnxruntime

    text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return UnsupportedModelError(
        f"onnxruntime {onnxruntime.__version__}'s {kind} quantization failed on this graph: "
        f"{type(e).__name__}: {text}"
    )


def qdq_export(
    int8_module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    *,
    opset: int | None = None,
    source_format: str = "eager",
) -> dict:
    from ptopt.core.inputspec import make_inputs
    from ptopt.formats.capture import graph_output_names
    from ptopt.formats.onnx_export import check_onnx, default_opset, torchscript_exporter

    names = [s.name for s in specs]
    outs = graph_output_names(int8_module, make_inputs(specs, style, which="opt"), names)
    try:
        exporter = torchscript_exporter(int8_module, specs, style, path, names, outs, opset)
    except UnsupportedModelError as e:
        hint = (
            " (an int8 TorchScript archive keeps its weights packed; use the ort_static method)"
            if source_format == "torchscript"
            else ""
        )
        raise UnsupportedModelError(f"{e}{hint}") from None
    check_onnx(path)
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {
        "files": [path.name],
        "int8_method": "qdq_export",
        "exporter": exporter,
        "input_names": names,
        "output_names": outs,
        "opset": default_opset(model),
        "external_data": False,
        "optimized": False,
    }
