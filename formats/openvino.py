"""OpenVINO IR (``model.xml`` + ``model.bin``), run by OpenVINO's CPU plugin.

Written from the model's ``torch.export`` ExportedProgram (the InputSpecs' ``Dim``s, as every other
format) with ``openvino.convert_model``; when OpenVINO cannot convert the program, from the ONNX
export of the same model instead (``extra["converted_from"]`` says which). The IR's inputs get the
specs' bounds (``Dimension(min, max)`` on dynamic dims). Precisions:

- ``fp32``: the IR as converted; compiled with ``INFERENCE_PRECISION_HINT=f32`` (OpenVINO's CPU plugin
  otherwise runs bf16 on CPUs that have it);
- ``bf16``: the same fp32 IR compiled with ``INFERENCE_PRECISION_HINT=bf16``: the CPU plugin's own bf16
  kernels (weights stay fp32 on disk). Refused on a CPU whose plugin reports no ``BF16`` capability;
- ``int8``: ``nncf.quantize`` of the IR with the calibration data (``--data``), the ops NNCF leaves
  float compiled with ``INFERENCE_PRECISION_HINT=f32``: the plugin's default would run them in bf16 on
  a CPU with avx512_bf16 or AMX, so an IR checked on one CPU would compute differently on another (the
  all-MiniLM-L6-v2 int8 IR gave a worst held-out cosine of 0.863 on an AMX Xeon). A graph with
  attention (``Softmax`` or ``ScaledDotProductAttention``) uses ``model_type=TRANSFORMER`` (NNCF then
  applies SmoothQuant and keeps the attention's softmax path float itself) with SmoothQuant's alpha at
  ``SMOOTH_QUANT_ALPHA`` for the MatMuls instead of NNCF's 0.95.

The precision hint is written into the IR itself (``rt_info``: ``ptopt/inference_precision``), so
ptopt's loaders compile it as it was checked. Plain OpenVINO loads the IR with
``openvino.Core().read_model("model.xml")``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, ModelLoadError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec, flatten_inputs
from ptopt.formats.base import Format, loaded_model
from ptopt.formats.runner import Runner, primary_output

INSTALL_HINT = "pip install 'ptopt[openvino]'"
#: the rt_info key of the inference precision ptopt checked the IR at
HINT_KEY = ("ptopt", "inference_precision")
#: int8: the ops NNCF left float run in f32 on every CPU (the plugin's default is bf16 wherever the CPU has
#: avx512_bf16 or AMX: the numbers ptopt checked would not be the ones a bf16 CPU computes). What it costs
#: there: ptopt's zoo:resnet int8 IR ran at 0.94x the NNCF peer compiled with the defaults at batch 32 on an
#: AVX512-BF16 EPYC (benchmarks/bench_real.py); on a CPU without bf16 the two are the same
_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}
#: SmoothQuant's alpha for the MatMuls of a transformer (NNCF's default: 0.95). all-MiniLM-L6-v2 int8, 128
#: calibration sentences, worst cosine on 256 unseen ones (AVX2 EPYC): 0.953 at 0.95, 0.990 at 0.75, 0.979
#: at 0.85, 0.955 at 0.5 (benchmarks/bench_isa.py --nncf-alphas)
SMOOTH_QUANT_ALPHA = 0.75
#: calibration samples NNCF sees (its default subset size)
CALIB_SAMPLES = 300
#: the batch NNCF's calibration items are made of
CALIB_BATCH = 8


class OpenVINO(Format):
    name = "openvino"
    label = "OpenVINO IR"
    suffixes = (".xml",)
    target = "openvino"
    runtime = "openvino"
    converts = ("bf16", "int8")
    devices = ("cpu",)
    half_weights = False
    requantizes_int8 = True
    reexportable = False
    packages = ("openvino", "nncf")
    #: the CPU plugin's own oneDNN follows ONEDNN_MAX_CPU_ISA (its convolutions, int8 matrix products and
    #: jit kernels: ``brgconv_avx2`` becomes ``jit_sse42``), but its fp32 FullyConnected runs MLAS
    #: (``gemm_mlas_f32``), which no variable caps (benchmarks/probe_isa.py)
    isa_libraries = ("onednn", "mlas")
    #: TorchServe runs it through ptopt's handler (which needs openvino in the worker's environment)
    servers = ("torchserve", "ray")
    write_options = frozenset({"calib", "fp32_module", "model_type", "accuracy_control", "float_modules"})
    sniff_rank = 4
    target_order = 25

    def sniff(self, path: Path) -> bool:
        if path.suffix.lower() != ".xml":
            return False
        try:
            with open(path, "rb") as fh:
                return b"<net" in fh.read(512)
        except OSError:
            return False

    def files(self, path: Path) -> list[Path]:
        return [path, path.with_suffix(".bin")]

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        model = read_ir(path)
        specs = specs_from_ir(model)
        info = {"openvino_precision": precision_of(model)}
        return loaded_model(path, self.name, None, path, art, specs=specs, info=info)

    def describe(self, loaded: Any) -> dict[str, Any]:
        from ptopt.formats.graph_facts import openvino_facts

        model = read_ir(loaded.path)
        return openvino_facts(model, precision_of(model) if model.has_rt_info(list(HINT_KEY)) else None)

    def write(self, module: Any, path: Path, **kw: Any) -> dict[str, Any]:
        return write_ir(module, path, **kw)

    def relocate(self, path: Path, dest: Path, files: list[str]) -> list[str]:
        import shutil

        shutil.copyfile(path, dest)  # the .xml names no file: the .bin is found beside it by name
        shutil.copyfile(path.with_suffix(".bin"), dest.with_suffix(".bin"))
        return [dest.name, dest.with_suffix(".bin").name]

    def reload(self, path: Path, *, style: str = "positional", device: str = "cpu", **kw: Any) -> Any:
        return OpenVINOModel(path, style=style)

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        return OpenVINORunner.create(name, loaded)

    def check_config(self, config: Any) -> None:
        if config.device is not None and config.on_cuda:
            raise UsageError("--target openvino runs on the CPU (OpenVINO's CPU plugin); drop --device")
        if config.float_modules and config.precision != "int8":
            raise UsageError("--exclude keeps layers of an int8 IR float: add --precision int8")
        if config.accuracy_control:
            if config.precision != "int8":
                raise UsageError("--accuracy-control is NNCF's accuracy-aware int8: add --precision int8")
            if config.min_cosine is None and config.accuracy_budget is None:
                raise UsageError(
                    "--accuracy-control needs its goal: --min-cosine C (worst-sample cosine with the fp32 "
                    "model) or --accuracy-budget PTS (top-1, labelled validation data)"
                )

    def check_available(self, config: Any) -> None:
        require_openvino(config.precision == "int8")
        if config.precision == "bf16":
            check_bf16()

    def export_options(self, source: Any, config: Any, calib: Any, **kw: Any) -> tuple[dict, dict | None]:
        if (config.precision or source.precision) != "int8":
            return {}, None
        parent = source.loaded
        if source.precision == "int8":
            from ptopt.formats.onnx_int8 import fp32_parent

            parent = fp32_parent(source.loaded, kw.get("allow_pickle", False))
        options = {"calib": calib, "fp32_module": parent.require_module("NNCF quantization")}
        if config.float_modules:
            options["float_modules"] = tuple(config.float_modules)
        if config.accuracy_control:
            options["accuracy_control"] = control_goal(config, kw.get("validation") or calib)
        return options, (parent.parent_record() if parent is not source.loaded else None)


FORMAT = OpenVINO()


def require_openvino(nncf: bool = False) -> None:
    """MissingDependencyError naming ``ptopt[openvino]`` when openvino (or, for int8, nncf) is missing."""
    import importlib.util

    missing = [m for m in ("openvino", *(["nncf"] if nncf else [])) if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependencyError(
            f"--target openvino needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: {INSTALL_HINT}"
        )


def check_bf16() -> None:
    """bf16 runs only where OpenVINO's CPU plugin has bf16 kernels: UsageError naming the flags seen."""
    ov = imported("openvino")

    from ptopt.core.isa import LIBRARIES, openvino_bf16_capped_away

    if openvino_bf16_capped_away():
        cap = LIBRARIES["onednn"].env
        raise UsageError(
            f"--target openvino --precision bf16: {cap}={os.environ.get(cap or '')} caps oneDNN below AVX-512, "
            f"where OpenVINO's CPU plugin has no bf16 kernels (a CPU without AVX-512 runs f32); use fp32 or int8"
        )
    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if "BF16" not in caps:
        from ptopt.core.system import cpu_info

        isa = ", ".join(k for k, v in cpu_info().get("isa", {}).items() if v) or "none of the tracked"
        raise UsageError(
            f"--target openvino --precision bf16: this CPU has no bf16 kernels in OpenVINO (its CPU plugin "
            f"reports {', '.join(caps)}; ISA flags seen: {isa}; bf16 needs avx512_bf16 or amx_bf16); use "
            f"fp32 or int8"
        )


def read_ir(path: Path) -> Any:
    """``openvino.Core().read_model`` of the IR at ``path``; ModelLoadError when it cannot be read."""
    require_openvino()
    ov = imported("openvino")

    from ptopt.core.quiet import silenced

    try:
        with silenced(("openvino",), native=True):  # its frontends' probing logs, on a file it cannot read
            return ov.Core().read_model(str(path))
    except Exception as e:  # noqa: BLE001 - OpenVINO raises RuntimeError with its own text
        raise ModelLoadError(f"{path}: not a readable OpenVINO IR: {openvino_message(e)}") from None


def openvino_message(e: BaseException) -> str:
    """The line of an OpenVINO exception that says what went wrong (not ``Exception from src/...``)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith(("Exception from ", "Check '"))]
    return ((said or lines or [type(e).__name__])[0])[:300]


def precision_of(model: Any) -> str:
    """The precision ptopt checked the IR at (``rt_info``), fp32 for an IR ptopt did not write."""
    try:
        return str(model.get_rt_info(list(HINT_KEY)).astype(str))
    except Exception:  # noqa: BLE001 - no such rt_info entry
        return "fp32"


def compile_ir(model: Any, threads: int | None = None) -> Any:
    """The IR compiled for the CPU at its precision, ``threads`` intra-op threads, latency hint."""
    ov = imported("openvino")

    config: dict[str, Any] = {
        "PERFORMANCE_HINT": "LATENCY",
        **level_properties(_HINTS.get(precision_of(model), "f32")),
    }
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return ov.Core().compile_model(model, "CPU", config)


def level_properties(wanted: str | None) -> dict[str, Any]:
    """The CPU plugin's properties for a model run at ``wanted`` precision (``bf16``, ``f32``; None: the
    plugin's default), as a CPU at this process's oneDNN cap gets them. The plugin (2026.4) decides bf16
    and the dynamic int8 quantization of activations (for weight-compressed FullyConnected layers) from the
    CPU itself, not from ``ONEDNN_MAX_CPU_ISA``, then finds no kernels under the cap ("could not create a
    primitive descriptor"): capped below AVX-512 it is asked for f32 (:func:`inference_hint`), below VNNI
    for no dynamic quantization, which is what a CPU at that level gets (its rule: avx2_vnni or
    avx512_core_vnni)."""
    from ptopt.core.isa import INT8_DOT_FLAGS, onednn_capped_without

    props: dict[str, Any] = {}
    hint = inference_hint(wanted)
    if hint:
        props["INFERENCE_PRECISION_HINT"] = hint
    if onednn_capped_without(INT8_DOT_FLAGS):
        props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = 0
    return props


def inference_hint(wanted: str | None) -> str | None:
    """The ``INFERENCE_PRECISION_HINT`` to compile with for ``wanted`` (``bf16``, ``f32``; None: the
    plugin's default, bf16 on a CPU with bf16 instructions): f32 where a oneDNN cap took the bf16 kernels
    away (``ptopt.core.isa.openvino_bf16_capped_away``: below AVX-512 for bf16 asked for, below AVX-512 BF16
    for the default), as a CPU at that level runs it."""
    from ptopt.core.isa import openvino_bf16_capped_away

    if wanted in (None, "bf16") and openvino_bf16_capped_away(default=wanted is None):
        return "f32"
    return wanted


def specs_from_ir(model: Any) -> list[InputSpec]:
    """Input specs read from the IR's inputs (a dynamic dim: its bounds, else 1 .. 64)."""
    specs = []
    for port in model.inputs:
        lo, hi = [], []
        for d in port.get_partial_shape():
            lo.append(d.get_min_length() if d.is_dynamic else d.get_length())
            top = d.get_max_length() if d.is_dynamic else d.get_length()
            hi.append(top if top > 0 else 64)
        lo = [max(1, v) for v in lo]
        dtype = port.get_element_type().to_dtype().name
        specs.append(InputSpec(port.get_any_name(), tuple(lo), tuple(lo), tuple(hi), dtype))
    return specs


# -- writing ---------------------------------------------------------------------------------------------


def write_ir(
    module: Any,
    path: Path,
    *,
    specs: Sequence[InputSpec],
    style: str,
    precision: str = "fp32",
    calib: Any = None,
    fp32_module: Any = None,
    model_type: str | None = None,
    accuracy_control: dict[str, Any] | None = None,
    float_modules: Sequence[str] = (),
    **_: Any,
) -> dict[str, Any]:
    """Convert ``module`` (``fp32_module`` for int8 from an int8 source) to an IR at ``path`` (+ .bin);
    int8 with ``accuracy_control`` (``control_goal``): NNCF's accuracy-aware quantization; ``float_modules``:
    the source's modules (Linear, Conv) whose ops NNCF leaves float (``ignored_scope``)."""
    require_openvino(precision == "int8")
    ov = imported("openvino")

    source = fp32_module if fp32_module is not None else module
    model, converted_from = convert_ir(source, specs, style)
    info: dict[str, Any] = {"method": f"openvino.convert_model ({converted_from})"}
    if precision == "int8":
        if calib is None:
            raise UsageError("--target openvino --precision int8 needs calibration data: pass --data CALIB")
        ignored = ignored_scope(model, source, float_modules)
        if accuracy_control:
            model, info["nncf"] = _quantize_controlled(
                model, source, calib, style, model_type, accuracy_control, ignored
            )
            info["method"] += " + nncf.quantize_with_accuracy_control"
        else:
            model, info["nncf"] = quantize_ir(model, calib, model_type, ignored)
            info["method"] += " + nncf.quantize"
        if float_modules:
            info["nncf"]["float_modules"] = list(float_modules)
    if style != "keyword":  # keyword inputs are bound by name, and the IR has forward's names already
        _name_inputs(model, specs)
    _name_outputs(model, source, specs, style)
    model.set_rt_info(precision, list(HINT_KEY))
    with quiet():
        ov.save_model(model, str(path), compress_to_fp16=False)

    info.update(
        files=[path.name, path.with_suffix(".bin").name],
        converted_from=converted_from,
        openvino=ov.__version__,
        inference_precision=_HINTS[precision],
        output_names=[o.get_any_name() for o in model.outputs],
    )
    return info


def _name_inputs(model: Any, specs: Sequence[InputSpec]) -> None:
    """The IR's inputs named as the specs, the sidecar, ``inspect`` and the ONNX export name them
    (``input``, ``input_0``): the conversion from the program named them after ``forward``'s arguments
    (``x``), so a client feeding ``{"input": ...}`` to the IR failed. Inputs named as the specs already
    (keyword inputs: ``input_ids``) are left in the IR's own order."""
    ports = list(model.inputs)
    if len(ports) != len(specs) or [p.get_any_name() for p in ports if p.get_names()] == [
        s.name for s in specs
    ]:
        return
    if {p.get_any_name() for p in ports if p.get_names()} == {s.name for s in specs}:
        return  # the same names in another order: keep the IR's binding
    for port, spec in zip(ports, specs, strict=True):
        port.get_tensor().set_names({spec.name})


def _name_outputs(model: Any, source: Any, specs: Sequence[InputSpec], style: str) -> None:
    """The IR's outputs named as the ONNX export names them (``formats.capture.graph_output_names``: the
    model's dict keys, else ``output`` / ``output_i``); the conversion named them after the last op
    (``view:0``), which is what a server answered. Left as converted where the outputs do not match."""
    from ptopt.core.inputspec import make_inputs
    from ptopt.formats.capture import graph_output_names

    try:
        x = make_inputs(specs, style, "min", batch=1)
        names = graph_output_names(source, x, [i.get_any_name() for i in model.inputs if i.get_names()])
    except Exception:  # noqa: BLE001 - a source that does not run on sampled inputs keeps the converted names
        return
    if len(names) == len(model.outputs):
        for out, name in zip(model.outputs, names, strict=True):
            out.get_tensor().set_names({name})


def convert_ir(module: Any, specs: Sequence[InputSpec], style: str) -> tuple[Any, str]:
    """The IR of ``module``: from its ExportedProgram, else (conversion failed) from its ONNX export. An
    IR from the program that still computes shapes at run time (``ShapeOf``: ``view(n, t, heads, d)``
    with a symbolic batch) is converted from the ONNX export too, and the smaller graph is kept: the
    ONNX exporter folds that shape arithmetic, and on all-MiniLM-L6-v2 the program's IR (504 ops) ran
    bf16 at 0.86x / 0.93x (batch 1 / 64) of the same model read from its ONNX export (417 ops)."""
    import torch

    ov = imported("openvino")

    from ptopt.formats.capture import export_program, first_lines

    if isinstance(module, torch.jit.ScriptModule):  # torch.export takes no ScriptModule; its ONNX export does
        model = _convert_via_onnx(module, specs, style, "a TorchScript model has no ExportedProgram")
        _bound_inputs(model, specs)
        return model, "ONNX (the source is TorchScript)"
    ep = export_program(module, specs, style)
    try:
        with quiet():
            model = ov.convert_model(ep)
        how = "ExportedProgram"
    except Exception as e:  # noqa: BLE001 - the frontend raises OpConversionFailure & co.
        first = first_lines(str(e), 1)
        model = _convert_via_onnx(module, specs, style, first)
        how = f"ONNX (the ExportedProgram failed to convert: {first[:200]})"
    else:
        model, how = _fewer_shape_ops(model, module, specs, style)
    _bound_inputs(model, specs)
    return model, how


def _fewer_shape_ops(model: Any, module: Any, specs: Sequence[InputSpec], style: str) -> tuple[Any, str]:
    """The program's IR, or the ONNX export's when the program's computes shapes at run time and the
    ONNX one has fewer ops (an ONNX export that fails leaves the program's)."""
    ops = lambda m: len(m.get_ops())  # noqa: E731
    if not any(op.get_type_name() == "ShapeOf" for op in model.get_ops()):
        return model, "ExportedProgram"
    try:
        other = _convert_via_onnx(module, specs, style, "")
    except Exception:  # noqa: BLE001 - the program's IR stands
        return model, "ExportedProgram"
    if ops(other) < ops(model):
        return other, (
            f"ONNX (fewer ops than the ExportedProgram's IR, which computes shapes at run time: "
            f"{ops(other)} vs {ops(model)})"
        )
    return model, "ExportedProgram"


def _convert_via_onnx(module: Any, specs: Sequence[InputSpec], style: str, why: str) -> Any:
    ov = imported("openvino")

    from ptopt.formats.onnx_export import export_onnx

    with tempfile.TemporaryDirectory(prefix="ptopt-ov-") as d:
        onnx_path = Path(d) / "model.onnx"
        export_onnx(module, specs, style, onnx_path)
        try:
            with quiet():
                return ov.convert_model(str(onnx_path))
        except Exception as e:  # noqa: BLE001
            raise UnsupportedModelError(
                f"OpenVINO cannot convert the model: from its ExportedProgram: {why}; from its ONNX export: "
                f"{str(e).strip().splitlines()[0][:200]}"
            ) from None


def _bound_inputs(model: Any, specs: Sequence[InputSpec]) -> None:
    """Give each IR input the spec's shape: fixed dims fixed, dynamic ones bounded by [min, max]."""
    ov = imported("openvino")

    shapes = {}
    for port, spec in zip(model.inputs, specs, strict=False):
        dims = [
            ov.Dimension(lo) if lo == hi else ov.Dimension(lo, hi)
            for lo, hi in zip(spec.min_shape, spec.max_shape, strict=True)
        ]
        shapes[port.get_any_name()] = ov.PartialShape(dims)
    model.reshape(shapes)


def _nncf_options(model: Any, calib: Any, model_type: str | None) -> tuple[list, dict[str, Any], dict]:
    """The calibration items, the options both NNCF entry points take, and their record."""
    nncf = imported("nncf")

    names = [p.get_any_name() for p in model.inputs]
    items = [_feed(b.x, names) for b in calib.take(CALIB_SAMPLES).batches(CALIB_BATCH)]
    attention = any(op.get_type_name() in ("Softmax", "ScaledDotProductAttention") for op in model.get_ops())
    kind = model_type or ("transformer" if attention else "default")
    # a CNN gets the full bias correction, not the fast one (the zoo ResNet's worst-sample cosine on
    # digits: 0.9907 -> 0.9977 for a few seconds more); a transformer keeps NNCF's fast one (the full
    # one wrecks all-MiniLM-L6-v2: worst held-out cosine 0.973 -> 0.198)
    transformer = kind == "transformer"
    options: dict[str, Any] = {"subset_size": len(items), "fast_bias_correction": transformer}
    if transformer:
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            AdvancedSmoothQuantParameters,
        )

        options["model_type"] = nncf.ModelType.TRANSFORMER
        alphas = AdvancedSmoothQuantParameters(matmul=SMOOTH_QUANT_ALPHA)
        options["advanced_parameters"] = AdvancedQuantizationParameters(smooth_quant_alphas=alphas)
    record = {
        "version": nncf.__version__,
        "model_type": kind,
        "calibration_samples": sum(len(next(iter(i.values()))) for i in items),
        "fast_bias_correction": transformer,
    }
    if transformer:
        record["smooth_quant_alpha"] = SMOOTH_QUANT_ALPHA
    return items, options, record


def quantize_ir(
    model: Any, calib: Any, model_type: str | None = None, ignored: Any = None
) -> tuple[Any, dict]:
    """``nncf.quantize`` of the fp32 IR ``model`` with the calibration batches (``ignored``: an
    ``nncf.IgnoredScope``, ``ignored_scope``); returns the int8 IR and what NNCF was asked."""
    nncf = imported("nncf")

    items, options, record = _nncf_options(model, calib, model_type)
    if ignored is not None:
        options["ignored_scope"] = ignored
    with quiet():
        quantized = nncf.quantize(model, nncf.Dataset(items), **options)
    return quantized, record


def ignored_scope(model: Any, source: Any, float_modules: Sequence[str]) -> Any:
    """An ``nncf.IgnoredScope`` of the IR's ops that carry ``float_modules``' weights (modules of the
    torch ``source``: Linear, Conv), found by their weights' values, which the conversion keeps (the IR's
    op names need not name the modules: an IR converted from ONNX has ``node_MatMul_12``); None for none.
    UsageError naming a module that is not in the source or whose weight is in no op."""
    if not float_modules:
        return None
    nncf = imported("nncf")

    consts = _weight_consts(model)
    names = []
    for name in float_modules:
        try:
            weight = source.get_submodule(name).weight.detach().float().cpu().numpy()
        except AttributeError:
            raise UsageError(f"--exclude {name}: no module with a weight of that name in the model") from None
        found = [op.get_friendly_name() for op, c in consts if _carries(c, weight)]
        if not found:
            raise UsageError(
                f"--exclude {name}: its weight is in no op of the IR (an op OpenVINO fused away?)"
            )
        names += found
    return nncf.IgnoredScope(names=names)


def weight_ops(model: Any, source: Any, names: Sequence[str]) -> dict[str, list[str]]:
    """The IR ops (friendly names) that carry each of ``names``' weights (Linear / Conv modules of the
    torch ``source``), found by the weights' values in the fp32 IR ``model``."""
    consts = _weight_consts(model)
    out = {}
    for name in names:
        weight = source.get_submodule(name).weight.detach().float().cpu().numpy()
        out[name] = [op.get_friendly_name() for op, c in consts if _carries(c, weight)]
    return out


def int8_ops(model: Any) -> set[str]:
    """The MatMul / Convolution ops of the int8 IR ``model`` whose weight is int8: an 8-bit constant
    (NNCF's compressed weight, through its Convert and scale) or a FakeQuantize on its way."""
    out = set()
    for op in model.get_ops():
        if op.get_type_name() not in ("MatMul", "Convolution", "GroupConvolution"):
            continue
        todo = [op.input_value(1).get_node()]
        while todo:
            node = todo.pop()
            kind = node.get_type_name()
            if kind == "FakeQuantize" or (
                kind == "Constant" and node.get_element_type().get_type_name() in ("i8", "u8", "i4", "u4")
            ):
                out.add(op.get_friendly_name())
                break
            if kind in ("Convert", "Multiply", "Subtract", "Reshape", "Transpose"):
                todo += [v.get_node() for v in node.input_values()]
    return out


def _weight_consts(model: Any) -> list[tuple[Any, Any]]:
    """(op, its fp32 weight constant) for every MatMul / Convolution of the IR whose second input is one
    (through a Convert, as a compressed IR stores it)."""
    out = []
    for op in model.get_ops():
        if op.get_type_name() not in ("MatMul", "Convolution", "GroupConvolution"):
            continue
        src = op.input_value(1).get_node()
        while src.get_type_name() == "Convert":
            src = src.input_value(0).get_node()
        if src.get_type_name() == "Constant":
            out.append((op, src.get_data().astype("float32")))
    return out


def _carries(const: Any, weight: Any) -> bool:
    """The IR constant is the module's weight: the same values (as a MatMul may hold them, transposed), or,
    for a convolution whose BatchNorm the export folded in, the same per-output-channel directions."""
    import numpy as np

    if const.size != weight.size:
        return False
    flat = _same_layout(weight, const)
    if np.array_equal(const.reshape(-1), flat):
        return True
    if weight.ndim < 3 or const.shape[0] != weight.shape[0]:
        return False

    def rows(w: Any) -> Any:
        w = w.reshape(w.shape[0], -1)
        return w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-30)

    return bool(np.allclose(np.abs(rows(const)), np.abs(rows(weight)), atol=1e-5))


def _same_layout(weight: Any, const: Any) -> Any:
    """``weight`` flattened as ``const`` holds it: as is, or transposed (a MatMul's ``[in, out]``)."""
    if weight.shape == const.shape or weight.ndim != 2:
        return weight.reshape(-1)
    return weight.T.reshape(-1)


def control_goal(config: Any, data: Any) -> dict[str, Any]:
    """What NNCF's accuracy-aware quantization must hold, on which samples: the worst-sample cosine with
    the fp32 model (``min_cosine``), or top-1 within ``accuracy_budget`` points (labelled data; when
    both are given the drop is the goal and the cosine only the export's parity rule)."""
    from ptopt.core.errors import DataError

    if data is None:
        raise UsageError("--accuracy-control needs validation samples: pass --data (or --validation-data)")
    if config.accuracy_budget is not None and getattr(data, "y", None) is None:
        raise DataError(
            "--accuracy-control --accuracy-budget needs labelled validation data (x and y); for unlabelled "
            "data use --min-cosine"
        )
    if config.accuracy_budget is not None:
        return {"data": data, "max_accuracy_drop": float(config.accuracy_budget)}
    return {"data": data, "min_cosine": float(config.min_cosine)}


def _validation(source: Any, control: dict[str, Any], names: Sequence[str], style: str) -> tuple[list, Any]:
    """NNCF's validation items (a batch of inputs, and the fp32 model's outputs or the labels) and the
    validation function: top-1 (a fraction), or the worst sample's cosine with the fp32 outputs projected
    to ``REFERENCE_SAMPLES`` samples (``ptopt.core.tail``: what ``optimize --min-cosine`` accepts by, so the
    ops NNCF reverts to float make the model hold on data it never saw, not only on the few it validates
    on); each item's value is its own samples' projection."""
    import numpy as np
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.core.tail import project_worst_cosine

    data, cosine = control["data"], "min_cosine" in control
    items = []
    with torch.inference_mode():
        for b in data.batches(CALIB_BATCH):
            if cosine:
                out = primary_output(call_model(source, b.x))
                target = out.detach().float().reshape(len(out), -1).numpy()
            else:
                target = b.y.numpy()
            items.append((_feed(b.x, names), target))

    def score(out: Any, target: Any) -> tuple[Any, float]:
        out = np.asarray(out, dtype=np.float64).reshape(len(target), -1)
        if not cosine:
            return float((out.argmax(-1) == target).sum()), float(len(target))
        ref = target.astype(np.float64)
        cos = (out * ref).sum(1) / np.maximum(
            np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1), 1e-12
        )
        return cos, 1.0

    def validation_fn(compiled: Any, batch: Any) -> tuple[float, list[float]]:
        scored = [score(compiled(feed)[compiled.outputs[0]], target) for feed, target in batch]
        if cosine:
            values = [project_worst_cosine(v).projected for v, _ in scored]
            return project_worst_cosine(np.concatenate([v for v, _ in scored])).projected, values
        return sum(v for v, _ in scored) / sum(n for _, n in scored), [v / n for v, n in scored]

    return items, validation_fn


def _quantize_controlled(
    model: Any,
    source: Any,
    calib: Any,
    style: str,
    model_type: str | None,
    control: dict[str, Any],
    ignored: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """``nncf.quantize_with_accuracy_control``: int8, then the ops that cost the most reverted to float
    until the validation metric holds the goal (``control_goal``); returns the IR and its record."""
    nncf = imported("nncf")
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    items, options, record = _nncf_options(model, calib, model_type)
    if ignored is not None:
        options["ignored_scope"] = ignored
    if "advanced_parameters" in options:  # this entry point's name for them
        options["advanced_quantization_parameters"] = options.pop("advanced_parameters")
    names = [p.get_any_name() for p in model.inputs]
    val_items, validation_fn = _validation(source, control, names, style)
    cosine = "min_cosine" in control
    max_drop = 1.0 - control["min_cosine"] if cosine else control["max_accuracy_drop"] / 100.0
    restorer = AdvancedAccuracyRestorerParameters(num_ranking_workers=1)
    with quiet():
        quantized = nncf.quantize_with_accuracy_control(
            model, nncf.Dataset(items), nncf.Dataset(val_items, lambda item: item[0]), validation_fn,
            max_drop=max_drop, drop_type=nncf.DropType.ABSOLUTE,
            advanced_accuracy_restorer_parameters=restorer, **options,
        )  # fmt: skip
    from ptopt.core.tail import REFERENCE_SAMPLES

    fq = lambda m: sum(op.get_type_name() == "FakeQuantize" for op in m.get_ops())  # noqa: E731
    goal = {k: v for k, v in control.items() if k != "data"}
    record["accuracy_control"] = {
        **goal,
        "metric": f"worst-sample cosine vs fp32, projected to {REFERENCE_SAMPLES} samples"
        if cosine
        else "top-1",
        "max_drop": round(max_drop, 6),
        "validation_samples": len(control["data"]),
        **({"reference_samples": REFERENCE_SAMPLES} if cosine else {}),
        "validation_data": getattr(control["data"], "name", "data"),
        "fake_quantize_ops": fq(quantized),
    }
    return quantized, record


def _feed(x: Any, names: Sequence[str]) -> dict[str, Any]:
    """A torch batch as OpenVINO's input dict (by name for keyword inputs, else in order)."""
    if isinstance(x, dict) and set(x) == set(names):
        return {n: x[n].detach().cpu().numpy() for n in names}
    return {n: t.detach().cpu().numpy() for n, (_, t) in zip(names, flatten_inputs(x), strict=False)}


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """OpenVINO's converter and NNCF print progress bars and warnings: ptopt says what matters itself.
    They send no usage events either (``telemetry_off``)."""
    import logging

    from ptopt.core.quiet import silenced

    nncf_log = logging.getLogger("nncf")
    level = nncf_log.level
    nncf_log.setLevel(logging.ERROR)
    try:
        with silenced(("nncf", "openvino"), streams=True), telemetry_off():
            yield
    finally:
        nncf_log.setLevel(level)


_TELEMETRY_LOCK = threading.Lock()
_telemetry_depth = 0
_telemetry_send: Any = None  # TelemetrySender.send while telemetry_off replaces it


@contextlib.contextmanager
def telemetry_off() -> Iterator[None]:
    """No usage events from OpenVINO's converter or NNCF in the block, unless the user opted in.

    ``openvino_telemetry`` sends events to Google Analytics unless the user opted out (its consent file
    absent counts as yes for ``convert_model``). Each event forks the whole process from a background
    thread, which then tries HTTPS for up to 3 s: CPU taken while ptopt times models, and data a ptopt
    user did not choose to send. A user who opted in (``opt_in_out --opt_in``: the consent file says 1)
    keeps OpenVINO's behaviour. Re-entrant and thread-safe; process-wide, as the sender is (another
    thread's OpenVINO calls send nothing while a block is open either); the sender is restored after the
    last block. Should ``openvino_telemetry`` change its API, events go out as OpenVINO sends them:
    telemetry never breaks an export."""
    sender = _telemetry_sender()
    if sender is None:
        yield
        return
    global _telemetry_depth, _telemetry_send
    with _TELEMETRY_LOCK:
        if _telemetry_depth == 0:
            _telemetry_send, sender.send = sender.send, _drop_event
        _telemetry_depth += 1
    try:
        yield
    finally:
        with _TELEMETRY_LOCK:
            _telemetry_depth -= 1
            if _telemetry_depth == 0:
                sender.send = _telemetry_send


def _telemetry_sender() -> Any:
    """``openvino_telemetry``'s ``TelemetrySender`` class when events are to be dropped: None where the
    package is missing (nothing is sent then), where the user opted in, or where its API is not the one
    known here (then OpenVINO does as it would)."""
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
        from openvino_telemetry.utils.sender import TelemetrySender

        opted_in = OptInChecker().check(enable_opt_in_dialog=False) == ConsentCheckResult.ACCEPTED
        known = callable(getattr(TelemetrySender, "send", None))
    except Exception:  # noqa: BLE001 - missing or changed: never a reason to fail an export
        return None
    return TelemetrySender if known and not opted_in else None


def _drop_event(*args: Any, **kwargs: Any) -> None:
    """``TelemetrySender.send`` inside ``telemetry_off``: the event is dropped."""


def imported(name: str) -> Any:
    """``import openvino`` / ``import nncf`` inside ``telemetry_off``: OpenVINO's first import sends a
    usage event (``openvino.tools.ovc``'s ``general_import``); once imported, the module as it is."""
    import importlib
    import sys

    if name in sys.modules:
        return sys.modules[name]
    with telemetry_off():
        return importlib.import_module(name)


# -- running ---------------------------------------------------------------------------------------------


class OpenVINOModel:
    """An IR compiled for the CPU, callable like the PyTorch model it came from (torch tensors in and
    out; one output -> a tensor, several -> a tuple)."""

    def __init__(self, path: str | Path, *, style: str = "positional", threads: int | None = None):
        import torch

        self.path = Path(path)
        self.style = style
        model = read_ir(self.path)
        self.compiled = compile_ir(model, threads or torch.get_num_threads())
        self.input_names = [p.get_any_name() for p in model.inputs]

    @classmethod
    def of(cls, model: Any, *, style: str = "positional", threads: int | None = None) -> OpenVINOModel:
        """An IR in memory (``openvino.Model``), compiled as a file of it would be."""
        import torch

        self = cls.__new__(cls)
        self.path, self.style = None, style
        self.compiled = compile_ir(model, threads or torch.get_num_threads())
        self.input_names = [p.get_any_name() for p in model.inputs]
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        x = kwargs if kwargs and not args else (args[0] if len(args) == 1 else args)
        outs = self.compiled(_feed(x, self.input_names))
        tensors = tuple(torch.from_numpy(outs[o].copy()) for o in self.compiled.outputs)
        return tensors[0] if len(tensors) == 1 else tensors

    def eval(self) -> OpenVINOModel:
        return self


@dataclasses.dataclass
class OpenVINORunner(Runner):
    """An IR run as deployed: compiled by the CPU plugin at its precision hint, ``threads`` inference
    threads, the latency hint; numpy in and out (the conversion is part of every timed call)."""

    model: Any = None
    compiled: Any = None
    input_names: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def create(cls, name: str, loaded: Any) -> OpenVINORunner:
        art = loaded.artifact
        model = read_ir(loaded.path)
        precision = art.precision if art else precision_of(model)
        return cls(
            name=name,
            ref=loaded.ref,
            format="openvino",
            runtime="OpenVINO (CPU)",
            input_specs=list(loaded.input_specs),
            input_style=loaded.input_style,
            path=loaded.path,
            files=FORMAT.files(loaded.path),
            precision=precision,
            batch_range=_batch_range(loaded.input_specs),
            info=dict(loaded.info),
            model=model,
        )

    @property
    def input_dtype(self) -> Any:
        return None  # bf16 is the plugin's inference precision: inputs stay fp32

    def prepare(self, threads: int) -> None:
        super().prepare(threads)
        self.compiled = compile_ir(self.model, threads)
        self.input_names = [p.get_any_name() for p in self.model.inputs]

    def call(self, x: Any) -> Any:
        import torch

        outs = self.compiled(_feed(x, self.input_names))
        return torch.from_numpy(outs[self.compiled.outputs[0]].copy())

    def output_layer(self, x: Any) -> str | None:
        from ptopt.core.scores import openvino_output_layer

        return openvino_output_layer(self.model) if self.model is not None else None

    def named_outputs(self, x: Any) -> list[tuple[str, Any]]:
        import torch

        outs = self.compiled(_feed(x, self.input_names))
        return [
            (o.get_any_name() if o.get_names() else f"output__{i}", torch.from_numpy(outs[o].copy()))
            for i, o in enumerate(self.compiled.outputs)
        ]

    def timed_call(self, x: Any) -> Callable[[], Any]:
        compiled, names = self.compiled, self.input_names
        return lambda: compiled(_feed(x, names))

    def close(self) -> None:
        self.compiled = self.model = None


def _batch_range(specs: Sequence[InputSpec]) -> tuple[int, int] | None:
    if specs and specs[0].min_shape:
        return (specs[0].min_shape[0], specs[0].max_shape[0])
    return None
