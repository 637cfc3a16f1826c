"""ONNX target: torch.export → ONNX (the dynamo exporter) with the specs' dynamic dimensions.

- Dynamic dims come from ``shapes.torch_export_dynamic_shapes`` and are renamed in the ONNX graph to
  the specs' symbolic names (``batch``, ``dim1``...), so tools and ``trtexec`` see readable names.
- One file when the weights are small (< ``EXTERNAL_DATA_BYTES``), else ``model.onnx`` +
  ``model.onnx.data``; both are listed in the sidecar's files and sizes.
- ``onnx.checker`` must pass; ``--optimize`` saves ORT's offline graph optimization (level
  "extended": fusions that stay portable across CPUs) instead of the raw export.
- A TorchScript source cannot go through torch.export: it takes the TorchScript exporter
  (``dynamo=False``) with ``dynamic_axes`` from the same specs.
- An op the exporter cannot translate is an UnsupportedModelError naming the op and the module
  (from the ExportedProgram's ``nn_module_stack``) it is in.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import UnsupportedModelError
from ptopt.core.inputspec import InputSpec, make_inputs
from ptopt.export.shapes import onnx_dim_names, torch_export_dynamic_shapes

#: Above this many bytes of weights, write external data (protobuf files cannot exceed 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30
#: opset of the TorchScript exporter (dynamo=False) when none is asked: what eager/FX int8 needs.
TORCHSCRIPT_EXPORTER_OPSET = 17


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """The exporters print progress and log warnings (missing torchvision ops, opset conversion)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    sink = io.StringIO()
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lv in zip(loggers, levels, strict=False):
            lg.setLevel(lv)


def output_names(n: int) -> list[str]:
    return ["output"] if n == 1 else [f"output_{i}" for i in range(n)]


def count_outputs(module: Any, x: Any) -> int:
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.export.parity import flatten_outputs

    with torch.inference_mode():
        return len(flatten_outputs(call_model(module, x)))


def weight_bytes(module: Any) -> int:
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        total += t.numel() * t.element_size()
    return total


def example_for_export(specs: Sequence[InputSpec], style: str) -> Any:
    """Sample inputs at the opt shape, except that a dynamic dim of size 1 becomes 2: torch.export
    specializes sizes 0 and 1 to constants, which would contradict the dynamic Dim."""
    import dataclasses

    fixed = []
    for s in specs:
        opt = tuple(
            min(2, hi) if (d == 1 and lo != hi) else d
            for d, lo, hi in zip(s.opt_shape, s.min_shape, s.max_shape, strict=False)
        )
        fixed.append(dataclasses.replace(s, opt_shape=opt))
    return make_inputs(fixed, style, which="opt")


def export_program(module: Any, specs: Sequence[InputSpec], style: str, device: str = "cpu") -> Any:
    """``torch.export.export`` with the specs' Dims; a failure names what torch.export could not trace."""
    import torch

    x = example_for_export(specs, style)
    args, kwargs = ((), dict(x)) if style == "keyword" else ((x,) if not isinstance(x, tuple) else x, {})
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    dyn = torch_export_dynamic_shapes(specs, style)
    try:
        with quiet_export():
            return torch.export.export(module, args, kwargs or None, dynamic_shapes=dyn, strict=False)
    except Exception as e:  # noqa: BLE001 - torch.export raises many kinds (UserError, GuardOnDataDependent...)
        msg = _first_lines(str(e), 3)
        raise UnsupportedModelError(
            f"torch.export cannot capture the model with inputs {', '.join(s.describe() for s in specs)}: "
            f"{type(e).__name__}: {msg}. If a dimension must stay fixed, give the same min/opt/max for it; "
            f"a model torch.export cannot trace can still go to --target torchscript"
        ) from None


def _first_lines(text: str, n: int) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " ".join(lines[:n])[:400]


def failing_op(error: BaseException, ep: Any = None) -> str:
    """'op aten.linalg_eigh in module inner.solver (Solver)' from an exporter error, as far as it says."""
    text = str(error)
    m = (
        re.search(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)", text)
        or re.search(r"target=torch\.ops\.([\w.]+)\]", text)
        or re.search(r"operator '([\w:.]+)'", text)
    )
    if not m:
        return ""
    op = m.group(1)
    where = ""
    if ep is not None:
        key = _op_key(op)
        for node in ep.graph.nodes:
            if node.op == "call_function" and _op_key(str(node.target)) == key:
                stack = node.meta.get("nn_module_stack") or {}
                if stack:
                    path, typ = list(stack.values())[-1]
                    typ_name = (
                        typ.rsplit(".", 1)[-1] if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
                    )
                    where = (
                        f" in module {path!r} ({typ_name})"
                        if path
                        else f" in the top-level module ({typ_name})"
                    )
                else:
                    where = " in the top-level module"
                break
    return f"op {op}{where}"


def _op_key(target: str) -> str:
    """'aten._linalg_eigh.default' and 'aten.linalg_eigh.default' → 'linalg_eigh'."""
    parts = target.replace("::", ".").split(".")
    parts = [p for p in parts if p not in ("aten", "torch", "ops", "default", "prims", "Tensor")]
    return parts[0].lstrip("_") if parts else target


def rename_dims(model: Any, specs: Sequence[InputSpec], input_names: Sequence[str]) -> None:
    """Give the graph's symbolic dims the specs' names (the exporter invents s0, s43...)."""
    wanted = onnx_dim_names(specs)
    mapping: dict[str, str] = {}
    for vi, spec in zip([i for i in model.graph.input if i.name in input_names], specs, strict=False):
        for idx, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.dim_param and idx in wanted.get(spec.name, {}):
                mapping.setdefault(d.dim_param, wanted[spec.name][idx])
    if not mapping:
        return
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in mapping:
                d.dim_param = mapping[d.dim_param]


def export_onnx(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    *,
    opset: int | None = None,
    optimize: bool = False,
    external_data: bool | None = None,
    source_format: str = "eager",
) -> dict:
    """Write ``path`` (+ ``path.data`` when large); return facts for the sidecar (files, opset, exporter...)."""
    import onnx

    names = [s.name for s in specs]
    x = make_inputs(specs, style, which="opt")
    outs = output_names(count_outputs(module, x))
    big = weight_bytes(module) >= EXTERNAL_DATA_BYTES if external_data is None else bool(external_data)
    if source_format == "torchscript":
        exporter = _export_torchscript_exporter(module, specs, style, path, names, outs, opset)
    else:
        exporter = _export_dynamo(module, specs, style, path, names, outs, opset)
    model = onnx.load(str(path))
    rename_dims(model, specs, names)
    _save(model, path, big)
    _check(path)
    if optimize:
        _optimize(path, big)
        _check(path)
    final = onnx.load(str(path), load_external_data=False)
    files = [path.name] + (
        [path.name + ".data"] if big and (path.parent / (path.name + ".data")).exists() else []
    )
    return {
        "files": files,
        "opset": final.opset_import[0].version if final.opset_import else None,
        "exporter": exporter,
        "input_names": names,
        "output_names": outs,
        "external_data": big,
        "optimized": bool(optimize),
    }


def _export_dynamo(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    names: list[str],
    outs: list[str],
    opset: int | None,
) -> str:
    import torch

    ep = export_program(module, specs, style)
    x = example_for_export(specs, style)
    args, kwargs = ((), dict(x)) if style == "keyword" else ((x,) if not isinstance(x, tuple) else x, {})
    try:
        with quiet_export():
            torch.onnx.export(
                ep,
                args,
                str(path),
                kwargs=kwargs or None,
                input_names=names,
                output_names=outs,
                opset_version=opset,
                external_data=False,
                dynamo=True,
                verbose=False,
            )
    except Exception as e:  # noqa: BLE001 - exporter errors come in many types
        op = failing_op(e, ep)
        raise UnsupportedModelError(
            f"the ONNX exporter cannot translate {op or 'the model'}: {_summary(e)}. Rewrite that part with "
            f"ops ONNX supports, or export with --target torchscript or --target exported_program"
        ) from None
    return f"torch.onnx (dynamo=True), torch {torch.__version__}"


def _summary(e: BaseException) -> str:
    text = str(e)
    m = re.search(r"DispatchError'>: (.*)", text)
    return _first_lines(m.group(1) if m else text, 1)


def _export_torchscript_exporter(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    names: list[str],
    outs: list[str],
    opset: int | None,
) -> str:
    """The TorchScript exporter: for ScriptModules (and eager/FX int8 models, as QDQ graphs)."""
    import torch

    x = example_for_export(specs, style)
    args = tuple(x.values()) if isinstance(x, dict) else (x if isinstance(x, tuple) else (x,))
    axes: dict[str, dict[int, str]] = {k: v for k, v in onnx_dim_names(specs).items() if v}
    if axes and "batch" in {n for v in axes.values() for n in v.values()}:
        for o in outs:
            axes[o] = {0: "batch"}
    try:
        with quiet_export():
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=names,
                output_names=outs,
                opset_version=opset or TORCHSCRIPT_EXPORTER_OPSET,
                dynamic_axes=axes or None,
                dynamo=False,
            )
    except Exception as e:  # noqa: BLE001
        op = failing_op(e)
        raise UnsupportedModelError(
            f"the ONNX exporter (TorchScript path) cannot translate {op or 'the model'}: {_first_lines(str(e), 1)}"
        ) from None
    return f"torch.onnx (dynamo=False, TorchScript exporter), torch {torch.__version__}"


def _save(model: Any, path: Path, external: bool) -> None:
    import onnx

    data = path.parent / (path.name + ".data")
    if data.exists():
        data.unlink()
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(path))


def _check(path: Path) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        raise UnsupportedModelError(
            f"the exported ONNX model fails onnx.checker: {_first_lines(str(e), 2)}"
        ) from None


def _optimize(path: Path, external: bool) -> None:
    """Replace the file with ORT's offline-optimized graph (extended level: portable fusions)."""
    import onnx
    import onnxruntime as ort

    tmp = path.parent / (path.stem + ".opt.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp)
    so.log_severity_level = 3
    if external:
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", tmp.name + ".data"
        )
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    model = onnx.load(str(tmp))
    for p in (tmp, tmp.parent / (tmp.name + ".data")):
        if p.exists():
            p.unlink()
    _save(model, path, external)
