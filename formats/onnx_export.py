"""ONNX target: torch.export → ONNX (the dynamo exporter) with the specs' dynamic dimensions.

- Dynamic dims come from ``shapes.torch_export_dynamic_shapes`` and are renamed in the ONNX graph to
  the specs' symbolic names (``batch``, ``dim1``...), so tools and ``trtexec`` see readable names.
- One file when the weights are small (< ``EXTERNAL_DATA_BYTES``), else ``model.onnx`` +
  ``model.onnx.data``; both are listed in the sidecar's files and sizes.
- ``onnx.checker`` must pass; ``--optimize`` saves ORT's offline graph optimization (level
  "extended": fusions that stay portable across CPUs) instead of the raw export.
- A TorchScript source cannot go through torch.export: it takes the TorchScript exporter
  (``dynamo=False``) with ``dynamic_axes`` from the same specs; so does a model with an LSTM / GRU
  (torch.export unrolls it at one sequence length, the TorchScript exporter writes ONNX's RNN ops).
- An op the exporter cannot translate is an UnsupportedModelError naming the op and the module
  (from the ExportedProgram's ``nn_module_stack``) it is in.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec, make_inputs
from ptopt.formats.capture import (
    example_for_export,
    export_program,
    failing_op,
    first_lines,
    graph_output_names,
    quiet_export,
    torchlib_registry_reused,
    weight_bytes,
)
from ptopt.formats.shapes import onnx_dim_names

#: Above this many bytes of weights, write external data (protobuf files cannot exceed 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30
#: opset of the TorchScript exporter (dynamo=False) when none is asked: what eager/FX int8 needs.
TORCHSCRIPT_EXPORTER_OPSET = 17
#: the lowest opset torch's dynamo exporter writes: asked for less, it writes this one (REFERENCE.md),
#: so a lower ``--opset`` goes through the TorchScript exporter, which writes what it is asked (7-20)
DYNAMO_MIN_OPSET = 18


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


@contextlib.contextmanager
def onnx_attention(module: Any) -> Iterator[str | None]:
    """Run a Hugging Face model's attention as ``eager`` while it is exported to ONNX and checked.

    torch's SDPA gives a row whose every key is masked (a left-padded token under GPT-2's causal
    mask) zeros; its ONNX translation gives it the mean of the values. Only padded positions differ
    (measured on GPT-2: 0.12 there, 2e-7 elsewhere), but the parity check compares every output, so
    the export was refused. ``eager`` adds the mask's finfo.min before a softmax, which ONNX computes
    the same at every position. Yields the implementation used (None: left as it was)."""
    config = getattr(module, "config", None)
    was = getattr(config, "_attn_implementation", None)
    if was != "sdpa" or not callable(getattr(module, "set_attn_implementation", None)):
        yield None
        return
    module.set_attn_implementation("eager")
    try:
        yield "eager"
    finally:
        module.set_attn_implementation(was)


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
    old_opset = check_opset(opset, style, source_format, names)
    x = make_inputs(specs, style, which="opt")
    outs = graph_output_names(module, x, names)
    big = weight_bytes(module) >= EXTERNAL_DATA_BYTES if external_data is None else bool(external_data)
    import torch

    scripted = source_format == "torchscript" or isinstance(module, torch.jit.ScriptModule)
    if scripted or has_rnn(module) or old_opset:
        exporter = torchscript_exporter(
            module, specs, style, path, names, outs, opset, _way_out(scripted, old_opset)
        )
    else:
        exporter = _export_dynamo(module, specs, style, path, names, outs, opset)
    model = onnx.load(str(path))
    rename_dims(model, specs, names)
    save_onnx(model, path, big)
    check_onnx(path)
    if optimize:
        _optimize(path, big)
        check_onnx(path)
    final = onnx.load(str(path), load_external_data=False)
    written = default_opset(final)
    if opset is not None and written != opset:
        raise UnsupportedModelError(
            f"--opset {opset}: {exporter.split(',')[0]} wrote opset {written} instead (it cannot convert this "
            f"graph to {opset}); ask for opset {written}, or leave --opset out for the exporter's default"
        )
    files = [path.name] + (
        [path.name + ".data"] if big and (path.parent / (path.name + ".data")).exists() else []
    )
    return {
        "files": files,
        "opset": written,
        "exporter": exporter,
        "input_names": names,
        "output_names": outs,
        "external_data": big,
        "optimized": bool(optimize),
    }


def check_opset(opset: int | None, style: str, source_format: str, names: Sequence[str]) -> bool:
    """UsageError, before anything is exported, for an ``--opset`` the export cannot write: one the
    installed onnx does not know, or one below 18 (the TorchScript exporter's) for a model that takes
    named inputs. Returns whether ``opset`` is below 18."""
    import onnx
    import onnx.defs

    newest = onnx.defs.onnx_opset_version()
    if opset is not None and opset > newest:
        raise UsageError(f"--opset {opset}: the newest opset onnx {onnx.__version__} knows is {newest}")
    old = opset is not None and opset < DYNAMO_MIN_OPSET
    if old and style == "keyword" and source_format != "torchscript":
        raise UsageError(
            f"--opset {opset}: below {DYNAMO_MIN_OPSET} ONNX is written by torch's TorchScript exporter, which "
            f"passes inputs by position; this model takes named inputs ({', '.join(names)}), which it can "
            f"mis-bind (BERT: 'multiple values for use_cache'): use --opset {DYNAMO_MIN_OPSET} or later"
        )
    return old


def default_opset(model: Any) -> int | None:
    """The opset of ONNX's own operator domain that ``model`` imports (other domains have their own)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def has_rnn(module: Any) -> bool:
    """An eager module with an LSTM / GRU / RNN layer: torch.export unrolls its time loop, fixing the
    sequence length (``dim1 ... specialized to be a constant``); the TorchScript exporter writes
    ONNX's own LSTM / GRU / RNN op, which takes any length."""
    from torch import nn

    return isinstance(module, nn.Module) and any(isinstance(m, nn.RNNBase) for m in module.modules())


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
        with quiet_export(), torchlib_registry_reused():
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
        older = (
            ""
            if style == "keyword"
            else f"--opset {TORCHSCRIPT_EXPORTER_OPSET} (torch's TorchScript exporter), "
        )
        raise UnsupportedModelError(
            f"the ONNX exporter cannot translate {op or 'the model'}: {_summary(e)}. Rewrite that part with "
            f"ops ONNX supports, or export with {older}--target torchscript or --target exported_program"
        ) from None
    return f"torch.onnx (dynamo=True), torch {torch.__version__}"


def _way_out(scripted: bool, old_opset: bool) -> str:
    """Why the TorchScript exporter was taken, as the way around it when it fails."""
    if scripted:
        return (
            "; a TorchScript archive goes through that exporter only: export the original nn.Module "
            "(pkg.module:factory --weights W) to take torch.export's"
        )
    return "; --opset 18 or later takes torch.export's exporter" if old_opset else ""


def _summary(e: BaseException) -> str:
    """The exporter's own cause (its 'Exception summary': 'Cannot view a tensor with shape ...'), not its
    step banner ('Failed to decompose the FX graph ... This is step 2/3 ... Next steps:'), colours removed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    m = re.search(r"## Exception summary\s*<class '[^']*'>: (.*)", text) or re.search(
        r"DispatchError'>: (.*)", text
    )
    return first_lines(m.group(1) if m else text, 1).rstrip(".!")


def torchscript_exporter(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    names: list[str],
    outs: list[str],
    opset: int | None,
    way_out: str = "",
) -> str:
    """The TorchScript exporter: for ScriptModules (and eager/FX int8 models, as QDQ graphs).
    ``way_out``: what the user can do when it fails (``_way_out``), appended to the error."""
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
            f"the ONNX exporter (TorchScript path) cannot translate {op or 'the model'}: {first_lines(str(e), 1)}"
            f"{way_out}"
        ) from None
    return f"torch.onnx (dynamo=False, TorchScript exporter), torch {torch.__version__}"


def save_onnx(model: Any, path: Path, external: bool) -> None:
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


def check_onnx(path: Path) -> None:
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        raise UnsupportedModelError(
            f"the exported ONNX model fails onnx.checker: {first_lines(str(e), 2)}"
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
    save_onnx(model, path, external)


def relocate_external_data(src: Path, dest: Path) -> list[str]:
    """Write the ONNX model at ``src`` (with external data) as ``dest`` + ``dest.data``: the same
    graph and weight bytes, the external-data location pointing at the new name. Returns the files."""
    import onnx

    model = onnx.load(str(src), load_external_data=True)
    save_onnx(model, dest, True)
    return [dest.name, dest.name + ".data"]
