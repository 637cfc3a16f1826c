"""The one place that turns an in-memory model into a model file, and checks the file it wrote.

Every stage writes models through :func:`write_model` (``ptopt.export`` and, through it, compress's
quantize / prune / distill), so a format has one set of rules:

Each format's own rules (how it is captured, saved and loaded back) live in its module of
``ptopt.formats`` (``FORMAT.write`` / ``FORMAT.reload``); this module is the one path every stage
takes through them, and the check every written file gets.

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
import dataclasses
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core import progress
from ptopt.core.device import half_dtype, half_specs, to_device
from ptopt.core.errors import ModelLoadError, ParityError, UnsupportedModelError, UsageError
from ptopt.core.formats import get_format
from ptopt.core.inputspec import InputSpec


@dataclasses.dataclass(frozen=True)
class Check:
    """How a written file is checked: reloaded and compared with ``reference`` (default: the module
    written) on ``samples`` (a Dataset or a batch; default: the example, else seeded random inputs at
    the specs' shapes) by the rule of :mod:`ptopt.export.parity`: ``atol``/``rtol``/``min_cosine``
    (defaults by precision). ``keep_failed_as=FINAL_PATH``: a failing file is moved beside it as
    ``<file>.failed`` first."""

    reference: Any = None
    samples: Any = None
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    keep_failed_as: str | os.PathLike | None = None
    #: what a failure is called and what it advises, for callers other than ``ptopt export`` (whose
    #: flags the default advice names): e.g. quantize's check of the artifact against its int8 model
    what: str | None = None
    advice: str | None = None


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
    check: bool | Check = True,
    precision: str = "fp32",
    source_format: str | None = None,
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
    - ``check``: False (no check), True (the default :class:`Check`) or a :class:`Check`: what the
      file must reproduce (default ``module``), on which samples (default ``example``), by which rule.
      ``precision``: the artifact's, for the default tolerances
      (``ptopt.export.parity.DEFAULT_TOLERANCES`` and ``MIN_COSINE``); ``fp16``/``bf16`` write the
      model in that half precision (see the module docstring). ``device``: cpu (default) or ``cuda[:N]``.
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
    rule = Check() if check is True else check
    if rule:
        rule = dataclasses.replace(
            rule,
            reference=module if rule.reference is None else rule.reference,
            samples=example if rule.samples is None else rule.samples,
        )
    row = get_format(fmt)
    dev = _device_name(row, device)
    half = half_dtype(precision) if row.half_weights else None
    # trace, export and compare in inference mode (BatchNorm statistics, no dropout); the caller's
    # modules get their training flags back afterwards
    what = f"writing {row.label} {precision}" + (" (compiling)" if row.name == "aoti_package" else "")
    with progress.step(what, announce=False), _eval_mode(module, rule.reference if rule else None):
        placed = _placed(module, "cpu" if row.captured_on_cpu else dev, half)
        wspecs = half_specs(specs, precision) if half is not None else specs
        wexample = None if example is None else to_device(example, None, half)
        info = _write(
            placed, fmt, path, specs=wspecs, style=style, example=wexample, source_format=source_format,
            precision=precision, device=dev, options=options,
        )  # fmt: skip
        facts = _facts(fmt, info, wspecs)
        layer = _source_layer(module, specs, style, example)
        if layer is not None:
            facts["extra"]["output_layer"] = layer
        if dev != "cpu" or half is not None:
            facts["extra"].update(device=dev, dtype=str(half or "torch.float32").replace("torch.", ""))
        if rule:
            parity = check_reload(
                path, fmt, specs, style, rule, precision=precision, files=facts["files"], device=dev,
                dtype=half, cuda_graphs=bool(options.get("cuda_graphs")),
            )  # fmt: skip
            facts["metrics"] = {"parity": parity}
    return facts


def _device_name(row: Any, device: Any) -> str:
    """``cpu``, or the checked ``cuda:N`` (a format built only on CUDA: always CUDA)."""
    from ptopt.core.device import resolve_device

    if "cpu" not in row.devices and device is None:
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
    it: ModelLoadError), or for ONNX an :class:`~ptopt.formats.onnx_session.OnnxModel` over an ONNX Runtime session (torch
    tensors in, torch tensors out). The loaded model does not need the file afterwards.
    ``device``: where it runs (ONNX: the CUDA provider for ``cuda``); ``cuda_graphs``: an AOTInductor
    package on CUDA wrapped in :class:`ptopt.core.cudagraph.CudaGraphed`.

    A file its runtime cannot load back (e.g. an ExportedProgram whose output is a string) is an
    UnsupportedModelError."""
    from ptopt.formats.capture import first_lines, quiet_export

    row = get_format(fmt)
    try:
        with quiet_export():  # the deserializers log whole tracebacks before raising
            return row.reload(Path(path), style=style, device=device, cuda_graphs=cuda_graphs)
    except ModelLoadError:
        raise  # said in one line already (e.g. an AOTInductor package built by another torch)
    except Exception as e:  # noqa: BLE001 - each runtime's loader raises its own kinds
        raise UnsupportedModelError(
            f"the written {fmt} file does not load back in its runtime: {type(e).__name__}: "
            f"{first_lines(str(e), 1)[:300]}"
        ) from None


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
    suffix = get_format(fmt).suffix or ".bin"
    with tempfile.TemporaryDirectory(prefix="ptopt-size-") as d:
        path = Path(d) / f"model{suffix}"
        facts = write_model(
            module, fmt, path, specs=specs, style=style, example=example, check=False, **options
        )
        return sum((path.parent / f).stat().st_size for f in facts["files"])


def check_reload(
    path: Path,
    fmt: str,
    specs: Sequence[InputSpec],
    style: str,
    rule: Check,
    *,
    precision: str = "fp32",
    files: Sequence[str] = (),
    model: Any = None,
    device: str = "cpu",
    dtype: Any = None,
    cuda_graphs: bool = False,
) -> dict[str, Any]:
    """The reload-and-compare check of a written file against ``rule.reference`` (see :class:`Check`
    and :mod:`ptopt.export.parity` for the rule: per output, error within ``atol + rtol`` × its scale
    and the worst sample's cosine at least ``min_cosine``, defaults by ``precision``); returns the parity
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
            torch_runner(rule.reference),
            runner,
            specs,
            style,
            precision=precision,
            atol=rule.atol,
            rtol=rule.rtol,
            min_cosine=rule.min_cosine,
            what=rule.what or f"the exported {fmt} model",
            samples=_as_samples(rule.samples),
        )
    except ParityError as e:
        kept = _keep_failed(path, files or [path.name], rule.keep_failed_as)
        where = f"; the artifact is kept aside for inspection as {', '.join(kept)}" if kept else ""
        drift = getattr(e, "metrics", None) is not None  # else outputs differ in number or shape
        hint = loosen_hint(e.metrics) if drift else ""  # type: ignore[attr-defined]
        hint = hint if rule.advice is None else rule.advice
        what = rule.what or f"the exported {fmt} model"
        err = ParityError(f"{e if drift else f'{what}: {e}'}{where}{hint}")
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


def _source_layer(module: Any, specs: Sequence[InputSpec], style: str, example: Any) -> str | None:
    """The layer behind ``module``'s primary output (``core.scores.output_layer``, on the example's
    first sample, else on one made at the smallest shape), recorded in the sidecar: the written file's
    own graph may not show it (ONNX and OpenVINO fold a last BatchNorm into the Conv before it; an
    AOTInductor package has no graph to read; an ``nn.Identity`` classifier leaves nothing behind).
    None where it cannot be read."""
    from ptopt.core.inputspec import make_inputs
    from ptopt.core.scores import output_layer

    try:
        x = (
            _as_samples(example).take(1).x
            if example is not None
            else make_inputs(specs, style, "min", batch=1)
        )
    except Exception:  # noqa: BLE001 - specs this helper cannot sample: the layer is simply not recorded
        return None
    params = module.parameters() if hasattr(module, "parameters") else iter(())
    where = next((p.device for p in params), None)  # a module already on a GPU reads its sample there
    return output_layer(module, to_device(x, str(where)) if where is not None and where.type != "cpu" else x)


def _source_format(module: Any) -> str:
    import torch

    return "torchscript" if isinstance(module, torch.jit.ScriptModule) else "eager"


def _write(module: Any, fmt: str, path: Path, **kw: Any) -> dict[str, Any]:
    """Dispatch to the format's writer, refusing options it does not take."""
    row = get_format(fmt)
    unknown = sorted(set(kw["options"]) - row.write_options)
    if unknown:
        raise UsageError(f"format {fmt} takes no option(s) {', '.join(unknown)}")
    options = kw.pop("options")
    return row.write(module, path, **kw, **options)


def _facts(fmt: str, info: dict[str, Any], specs: Sequence[InputSpec]) -> dict[str, Any]:
    """A writer's info dict → sidecar facts: files, outputs, and everything else as extra."""
    extra = {k: v for k, v in info.items() if k != "files"}
    extra.update(get_format(fmt).extra_facts(info, specs))
    return {
        "files": list(info["files"]),
        "extra": extra,
        "outputs": [{"name": n} for n in info.get("output_names", [])],
    }


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
