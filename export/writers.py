"""The one place that turns an in-memory model into a model file, and checks the file it wrote.

Every stage writes models through :func:`write_model` (``ptopt.export`` and, through it, compress's
quantize / prune / distill), so a format has one set of rules:

- ``torchscript``: ``torch.jit.trace`` (default; on ``example``, else on the specs' opt shape) or
  ``torch.jit.script`` (``script=True``), then ``torch.jit.freeze``. A TorchScript source (e.g. an int8
  archive) is re-saved as it is, frozen when it can be. Tracer warnings (control flow baked in) go
  to ``extra["trace_warnings"]``; the reload check decides whether the trace holds.
- ``exported_program`` (``.pt2``): ``torch.export.export`` with the InputSpecs' ``Dim``s (the specs'
  [min, max], one ``Dim`` shared by inputs with the same range), ``torch.export.save``; loads with
  plain ``torch.export.load(path).module()``. Written through a buffer: ``torch.export.save``
  insists on a ``.pt2`` name and the caller's path may be a temporary one.
- ``onnx``: see :mod:`ptopt.export.onnx` (dynamo exporter, symbolic dims named after the specs,
  external data for large weights, ``optimize``) and :mod:`ptopt.export.onnx_int8` (``int8_method``:
  ``ort_static`` quantizes ``fp32_module`` with ``calib``; ``qdq_export`` takes the TorchScript
  exporter path of an eager/FX int8 module).
- ``aoti_package`` (``.pt2``): see :mod:`ptopt.export.aoti` (torch.export with the specs' ``Dim``s,
  ``torch._inductor.aoti_compile_and_package`` with freezing on; loads with plain
  ``torch._inductor.aoti_load_package``; refused on another torch version).
- ``tensorrt``: see :mod:`ptopt.export.tensorrt` (needs torch_tensorrt, TensorRT and CUDA).

**Precision and device.** ``precision="fp16"|"bf16"`` writes the model in half precision: a copy of
the module is cast (``module.to(dtype)``: weights and, through them, activations), floating-point
inputs are cast at the boundary, and the InputSpecs the file is captured with carry the half dtype
(integer inputs such as token ids keep theirs). TensorRT instead keeps fp32 weights and enables
the half precision as a kernel precision. ``device="cuda[:N]"``: the copy is traced / exported /
compiled on that GPU (ONNX is exported on the CPU and checked in ONNX Runtime's CUDA provider).
The check always compares with the fp32 ``reference`` on the host, at the precision's tolerance.

**The reload check** (``check=True``, the default): the written file is loaded in its own runtime
(:func:`reload`) and compared with ``reference`` (default: ``module``) at the InputSpecs' min, opt
and max shapes (:func:`ptopt.export.parity.check_parity`; real samples where ``samples`` has them,
else seeded random inputs). Past tolerance (``atol``/``rtol``, defaults by ``precision``) it raises
ParityError carrying ``.metrics``; with ``keep_failed_as=FINAL_PATH`` the written files are first
moved beside it as ``<file>.failed`` (listed in ``.failed``) for inspection.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.device import half_dtype, half_specs, program_on, to_device
from ptopt.core.errors import ParityError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec

#: formats ``write_model`` writes (tensorrt only where torch_tensorrt, TensorRT and CUDA are)
FORMATS = ("torchscript", "exported_program", "aoti_package", "onnx", "tensorrt")
#: the sidecar fields ``write_model``'s facts may carry (what ``core.result.Result`` merges)
FACT_KEYS = ("files", "extra", "metrics", "outputs")


def write_model(
    module: Any,
    fmt: str,
    path: str | os.PathLike,
    *,
    specs: Sequence[InputSpec] | None = None,
    style: str | None = None,
    example: Any = None,
    check: bool = True,
    reference: Any = None,
    samples: Any = None,
    precision: str = "fp32",
    atol: float | None = None,
    rtol: float | None = None,
    keep_failed_as: str | os.PathLike | None = None,
    source_format: str | None = None,
    min_cosine: float | None = None,
    device: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """Write ``module`` as ``fmt`` at ``path`` (exactly there; plus ``path.data`` for large ONNX
    weights) and, with ``check``, reload and compare it. Returns the sidecar facts, in the shape a
    ``core.result.Result`` writer returns: ``{"files": [...], "extra": {...}, "outputs": [...],
    "metrics": {"parity": {...}}}`` (``metrics`` only when checked).

    - ``specs``: the InputSpecs (min/opt/max shapes, dtypes); default inferred from ``example``
      (batch dynamic in [1, 64]). ``style``: ``"positional"`` or ``"keyword"`` (default: from
      ``example``, else positional). ``example``: a batch (tensor, tuple or dict) to trace / capture
      with where it fits the specs.
    - ``reference``: what the file must reproduce (default ``module``); ``samples``: a Dataset or a
      batch of real inputs for the check (default ``example``); ``precision``: the artifact's, for the
      default tolerances (``ptopt.export.parity.DEFAULT_TOLERANCES`` and ``MIN_COSINE``);
      ``atol``/``rtol``/``min_cosine`` override them; ``fp16``/``bf16`` write the model in that half
      precision (see the module docstring). ``device``: cpu (default) or ``cuda[:N]``.
    - ``source_format``: ``"torchscript"`` for a ScriptModule (detected when None), else eager.
    - ``options`` by format: torchscript ``script=False``, ``freeze=True``; onnx ``opset``, ``optimize``,
      ``external_data``, ``int8_method`` (None | ``"ort_static"`` | ``"qdq_export"``), ``calib``
      (a Dataset for ort_static), ``fp32_module`` (what ort_static quantizes; default ``module``),
      ``fp32_source_format``; aoti_package ``inductor_configs`` (on top of freezing), ``static_batches``; tensorrt
      ``calib``, and ``precision`` is the engine's.

    Raises UsageError (unknown format/option), UnsupportedModelError (cannot be captured),
    ParityError (the reloaded file drifts).
    """
    specs, style = _settle_inputs(specs, style, example)
    path = Path(path)
    if source_format is None:
        source_format = _source_format(module)
    reference = module if reference is None else reference
    dev = _device_name(fmt, device)
    half = half_dtype(precision) if fmt != "tensorrt" else None
    # trace, export and compare in inference mode (BatchNorm statistics, no dropout); the caller's
    # modules get their training flags back afterwards
    with _eval_mode(module, reference):
        placed = _placed(module, "cpu" if fmt == "onnx" else dev, half)
        wspecs = half_specs(specs, precision) if half is not None else specs
        wexample = None if example is None else to_device(example, None, half)
        info = _write(placed, fmt, path, wspecs, style, wexample, source_format, precision, options, dev)
        facts = _facts(fmt, info, wspecs)
        if dev != "cpu" or half is not None:
            facts["extra"].update(device=dev, dtype=str(half or "torch.float32").replace("torch.", ""))
        if check:
            tolerance = dict(precision=precision, atol=atol, rtol=rtol, min_cosine=min_cosine)
            parity = check_reload(
                path,
                fmt,
                reference,
                specs,
                style,
                **tolerance,
                samples=example if samples is None else samples,
                files=facts["files"],
                keep_failed_as=keep_failed_as,
                device=dev,
                dtype=half,
                cuda_graphs=bool(options.get("cuda_graphs")),
            )
            facts["metrics"] = {"parity": parity}
    return facts


def _device_name(fmt: str, device: Any) -> str:
    """``cpu``, or the checked ``cuda:N`` (TensorRT: always CUDA)."""
    from ptopt.core.device import resolve_device

    if fmt == "tensorrt" and device is None:
        device = "cuda"
    return str(resolve_device(device, allow_auto=False))


def _placed(module: Any, device: str, dtype: Any) -> Any:
    """``module`` on ``device`` in ``dtype`` (None: as it is): a copy when either changes, so the
    caller's fp32 model (the parity reference) stays as it was."""
    if device == "cpu" and dtype is None:
        return module
    import copy

    placed = copy.deepcopy(module)
    return placed.to(device=device, dtype=dtype) if dtype is not None else placed.to(device)


def reload(
    path: str | os.PathLike,
    fmt: str,
    *,
    style: str = "positional",
    device: str = "cpu",
    cuda_graphs: bool = False,
) -> Any:
    """The model file at ``path`` loaded the way a user loads it, callable like its source:
    a ScriptModule (``torch.jit.load``), the ExportedProgram's ``.module()`` (``torch.export.load``),
    an AOTInductor package (``torch._inductor.aoti_load_package``, refused when another torch built
    it: ModelLoadError), or for ONNX an :class:`~ptopt.export.onnx_model.OnnxModel` over an ONNX Runtime session (torch
    tensors in, torch tensors out). The loaded model does not need the file afterwards.
    ``device``: where it runs (ONNX: the CUDA provider for ``cuda``); ``cuda_graphs``: an AOTInductor
    package on CUDA wrapped in :class:`ptopt.core.cudagraph.CudaGraphed`.

    A file its runtime cannot load back (e.g. an ExportedProgram whose output is a string) is an
    UnsupportedModelError."""
    from ptopt.export.tracing import first_lines, quiet_export

    if fmt not in FORMATS:
        raise UsageError(f"cannot load format {fmt!r} (formats: {', '.join(FORMATS)})")
    if fmt == "aoti_package":
        from ptopt.export.aoti import check_version

        check_version(path)  # before any of its native code loads: a clear line naming both versions
    try:
        with quiet_export():  # the deserializers log whole tracebacks before raising
            model = _load(Path(path), fmt, style, device)
            if cuda_graphs and fmt == "aoti_package" and device.startswith("cuda"):
                from ptopt.core.cudagraph import CudaGraphed

                model = CudaGraphed(model, device)
            return model
    except Exception as e:  # noqa: BLE001 - each runtime's loader raises its own kinds
        raise UnsupportedModelError(
            f"the written {fmt} file does not load back in its runtime: {type(e).__name__}: "
            f"{first_lines(str(e), 1)[:300]}"
        ) from None


def _load(path: Path, fmt: str, style: str, device: str) -> Any:
    import torch

    if fmt == "torchscript":
        return torch.jit.load(str(path), map_location=device).eval()
    if fmt == "exported_program":
        # through a buffer: torch.export.load warns about a file not named .pt2 (a temporary one)
        ep = torch.export.load(io.BytesIO(path.read_bytes()))
        return program_on(ep, device).module()
    if fmt == "aoti_package":
        from ptopt.export.aoti import load_aoti

        return load_aoti(path, device=device)
    if fmt == "onnx":
        from ptopt.export.onnx_model import OnnxModel

        return OnnxModel(path, style=style, device=device)
    import torch_tensorrt  # noqa: F401 - registers the TensorRT runtime ops the program calls

    return torch.export.load(str(path)).module()


def serialized_bytes(
    module: Any,
    fmt: str,
    example: Any = None,
    *,
    specs: Sequence[InputSpec] | None = None,
    style: str | None = None,
    **options: Any,
) -> int:
    """Bytes on disk of ``module`` written as ``fmt`` (all its files), unchecked: for size
    comparisons (e.g. fp32 TorchScript vs its int8 artifact). Nothing is left behind."""
    suffix = {"torchscript": ".pt", "exported_program": ".pt2", "aoti_package": ".pt2", "onnx": ".onnx"}.get(
        fmt, ".bin"
    )
    with tempfile.TemporaryDirectory(prefix="ptopt-size-") as d:
        path = Path(d) / f"model{suffix}"
        facts = write_model(
            module, fmt, path, specs=specs, style=style, example=example, check=False, **options
        )
        return sum((path.parent / f).stat().st_size for f in facts["files"])


def check_reload(
    path: Path,
    fmt: str,
    reference: Any,
    specs: Sequence[InputSpec],
    style: str,
    *,
    precision: str = "fp32",
    atol: float | None = None,
    rtol: float | None = None,
    samples: Any = None,
    files: Sequence[str] = (),
    keep_failed_as: str | os.PathLike | None = None,
    model: Any = None,
    min_cosine: float | None = None,
    device: str = "cpu",
    dtype: Any = None,
    cuda_graphs: bool = False,
) -> dict[str, Any]:
    """The reload-and-compare check of a written file (see the module docstring and
    :mod:`ptopt.export.parity` for the rule: per output, error within ``atol + rtol`` × its scale and
    the worst sample's cosine at least ``min_cosine``, defaults by ``precision``); returns the parity
    metrics or raises ParityError (with ``.metrics``, and ``.failed``: the kept files) naming the
    worst output.

    ``model``: the file already loaded with :func:`reload` (default: load it here). ``device``: where
    the artifact runs; ``dtype``: the half dtype its floating-point inputs are cast to (the reference
    always runs in fp32 on the CPU, and outputs are compared there in float64)."""
    from ptopt.export.parity import check_parity, loosen_hint, torch_runner

    if model is None:
        model = reload(path, fmt, style=style, device=device, cuda_graphs=cuda_graphs)
    runner = torch_runner(model, device=device, dtype=dtype)
    try:
        return check_parity(
            torch_runner(reference),
            runner,
            specs,
            style,
            precision=precision,
            atol=atol,
            rtol=rtol,
            min_cosine=min_cosine,
            what=f"the exported {fmt} model",
            samples=_as_samples(samples),
        )
    except ParityError as e:
        kept = _keep_failed(path, files or [path.name], keep_failed_as)
        where = f"; the artifact is kept aside for inspection as {', '.join(kept)}" if kept else ""
        drift = getattr(e, "metrics", None) is not None  # else outputs differ in number or shape
        hint = loosen_hint(e.metrics) if drift else ""  # type: ignore[attr-defined]
        err = ParityError(f"{e if drift else f'the exported {fmt} model: {e}'}{where}{hint}")
        err.metrics = getattr(e, "metrics", None)  # type: ignore[attr-defined]
        err.failed = kept  # type: ignore[attr-defined]
        raise err from None


# -- steps ---------------------------------------------------------------------------------------


def _settle_inputs(specs: Any, style: str | None, example: Any) -> tuple[list[InputSpec], str]:
    from ptopt.core.inputspec import input_style, specs_from_example

    if style is None:
        style = input_style(example) if example is not None else "positional"
    if specs:
        return [s if isinstance(s, InputSpec) else InputSpec.from_dict(s) for s in specs], style
    if example is None:
        raise UsageError("write_model needs the input specs or an example batch")
    return specs_from_example(example), style


@contextlib.contextmanager
def _eval_mode(*modules: Any) -> Iterator[None]:
    """Every module in eval mode inside the block; afterwards each submodule gets its own training
    flag back. (An ExportedProgram's module cannot switch modes: it stays as it is.)"""
    flags: dict[Any, bool] = {}
    try:
        for m in modules:
            if not getattr(m, "training", False) or not hasattr(m, "modules"):
                continue
            before = {sub: sub.training for sub in m.modules()}
            try:
                m.eval()
            except NotImplementedError:
                continue
            flags.update(before)
        yield
    finally:
        for sub, was in flags.items():
            sub.training = was


def _source_format(module: Any) -> str:
    import torch

    return "torchscript" if isinstance(module, torch.jit.ScriptModule) else "eager"


def _write(
    module: Any,
    fmt: str,
    path: Path,
    specs: list[InputSpec],
    style: str,
    example: Any,
    source_format: str,
    precision: str,
    options: dict[str, Any],
    device: str = "cpu",
) -> dict[str, Any]:
    """Dispatch to the format's writer."""
    allowed = _OPTIONS.get(fmt)
    if allowed is None:
        raise UsageError(f"unknown model format {fmt!r} (formats: {', '.join(FORMATS)})")
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise UsageError(f"format {fmt} takes no option(s) {', '.join(unknown)}")
    if fmt == "torchscript":
        return _torchscript(module, path, specs, style, example, source_format, device=device, **options)
    if fmt == "exported_program":
        return _exported_program(module, path, specs, style, example, source_format, device)
    if fmt == "aoti_package":
        from ptopt.export.aoti import write_aoti

        return write_aoti(module, path, specs, style, example, source_format, device=device, **options)
    if fmt == "onnx":
        return _onnx(module, path, specs, style, source_format, **options)
    from ptopt.export.tensorrt import export_tensorrt

    return export_tensorrt(module, specs, style, path, precision=precision, device=device, **options)


_OPTIONS: dict[str, set[str]] = {
    "torchscript": {"script", "freeze"},
    "exported_program": set(),
    "aoti_package": {"inductor_configs", "cuda_graphs", "static_batches"},
    "onnx": {
        "opset",
        "optimize",
        "external_data",
        "int8_method",
        "calib",
        "fp32_module",
        "fp32_source_format",
    },
    "tensorrt": {"calib"},
}


def _facts(fmt: str, info: dict[str, Any], specs: Sequence[InputSpec]) -> dict[str, Any]:
    """A writer's info dict → sidecar facts: files, outputs, and everything else as extra."""
    extra = {k: v for k, v in info.items() if k != "files"}
    if fmt == "onnx":
        from ptopt.export.shapes import trtexec_shapes

        extra["trtexec_shapes"] = trtexec_shapes(specs, info.get("input_names"))
    return {
        "files": list(info["files"]),
        "extra": extra,
        "outputs": [{"name": n} for n in info.get("output_names", [])],
    }


def _torchscript(
    module: Any,
    path: Path,
    specs: Sequence[InputSpec],
    style: str,
    example: Any,
    source_format: str,
    script: bool = False,
    freeze: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    import torch

    from ptopt.core.device import to_device
    from ptopt.export import tracing

    notes: list[str] = []
    if source_format == "torchscript":
        sm, how = module, "re-saved TorchScript"
    elif script:
        sm, how = tracing.script(module), "torch.jit.script"
    else:
        x = example if example is not None else tracing.example_for_export(specs, style)
        sm, notes = tracing.trace(module, to_device(x, device), style)
        how = "torch.jit.trace"
    sm = sm.eval()
    frozen = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if freeze:  # freeze=False keeps the submodules and state_dict (e.g. a pruned model's weights)
                sm = torch.jit.freeze(sm, preserved_attrs=_self_serializing(sm))
                frozen = True
        except (RuntimeError, AttributeError) as e:
            # an already frozen archive has no attributes left to fold; keep it as it is
            notes.append(f"not frozen: {str(e).splitlines()[0][:200]}")
        torch.jit.save(sm, str(path))
    return {"files": [path.name], "method": how, "frozen": frozen, "trace_warnings": notes}


def _self_serializing(module: Any) -> list[str]:
    """Every path to a submodule of a TorchScript ``module`` that stores its own state once and says
    so with a ``ptopt_self_serializing`` method (the int8 table of a tied embedding and output layer,
    ``compress.quant_tied``). Freezing keeps them as they are: folded, the table would be stored once
    per path. (torch's quantized modules have a ``__setstate__`` too, and must be frozen.)"""
    if not hasattr(getattr(module, "_c", None), "_has_method"):
        return []
    mods = module.named_modules(remove_duplicate=False)
    return [n for n, m in mods if n and m._c._has_method("ptopt_self_serializing")]


def _exported_program(
    module: Any,
    path: Path,
    specs: Sequence[InputSpec],
    style: str,
    example: Any,
    source_format: str,
    device: str = "cpu",
) -> dict[str, Any]:
    import torch

    from ptopt.export.tracing import export_program, fits_for_export, quiet_export

    if source_format == "torchscript":
        raise UnsupportedModelError(
            "a TorchScript model cannot go through torch.export; export the original nn.Module "
            "(pkg.module:factory --weights W, or zoo:NAME) to --target exported_program"
        )
    x = example if example is not None and fits_for_export(specs, example) else None
    ep = export_program(module, specs, style, device=device, example=x)
    buf = io.BytesIO()  # torch.export.save insists on a .pt2 name; the caller's (temporary) path may differ
    with quiet_export():
        torch.export.save(ep, buf)
    path.write_bytes(buf.getvalue())
    return {"files": [path.name], "method": "torch.export.export (strict=False)"}


def _onnx(
    module: Any,
    path: Path,
    specs: Sequence[InputSpec],
    style: str,
    source_format: str,
    *,
    opset: int | None = None,
    optimize: bool = False,
    external_data: bool | None = None,
    int8_method: str | None = None,
    calib: Any = None,
    fp32_module: Any = None,
    fp32_source_format: str | None = None,
) -> dict[str, Any]:
    from ptopt.export import onnx, onnx_int8

    if int8_method == "qdq_export":
        return onnx_int8.qdq_export(module, specs, style, path, opset=opset, source_format=source_format)
    if int8_method == "ort_static":
        parent = module if fp32_module is None else fp32_module
        fmt = fp32_source_format or _source_format(parent)
        return onnx_int8.ort_static_quantize(
            parent, specs, style, path, calib, opset=opset, source_format=fmt
        )
    if int8_method is not None:
        raise UsageError(f"unknown int8 ONNX method {int8_method!r} (choose from ort_static, qdq_export)")
    return onnx.export_onnx(
        module,
        specs,
        style,
        path,
        opset=opset,
        optimize=optimize,
        external_data=external_data,
        source_format=source_format,
    )


def _as_samples(samples: Any) -> Any:
    """A Dataset for the check's real inputs: a Dataset as is, a batch wrapped (None stays None)."""
    if samples is None:
        return None
    from ptopt.core.data import Dataset

    return samples if isinstance(samples, Dataset) else Dataset(samples, name="example")


def _keep_failed(path: Path, files: Sequence[str], keep_failed_as: Any) -> list[str]:
    """Move the written files beside ``keep_failed_as`` as ``<file>.failed``; their paths."""
    if keep_failed_as is None:
        return []
    dest_dir = Path(keep_failed_as).parent
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = Path(keep_failed_as).name
    kept = []
    for f in files:
        # the files were written under the artifact's final name (or a temporary one): keep the final
        name = final + f[len(path.name) :] if f.startswith(path.name) else f
        dest = dest_dir / (name + ".failed")
        os.replace(path.parent / f, dest)
        kept.append(str(dest))
    return kept
