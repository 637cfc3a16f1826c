"""``ptopt inspect``: what a model is — inputs, outputs, parameters, size, and which layers each
technique can act on; with data, one batch is run so a data/model mismatch shows up here."""

from __future__ import annotations

import os
from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.core.inputspec import flatten_inputs, format_shape, parse_named_shapes
from ptopt.core.modelref import as_loaded, resolve_inputs, run_checked
from ptopt.core.weights import type_name

#: module type -> techniques that can act on it
_TECHNIQUES = {
    "Conv1d": ("static-int8", "prune-unstructured", "prune-structured"),
    "Conv2d": ("static-int8", "prune-unstructured", "prune-structured"),
    "Conv3d": ("static-int8", "prune-unstructured", "prune-structured"),
    "Linear": ("static-int8", "dynamic-int8", "prune-unstructured", "prune-structured"),
    "LSTM": ("dynamic-int8",),
    "GRU": ("dynamic-int8",),
    "MultiheadAttention": ("dynamic-int8 (inner linears)",),
    "Embedding": ("weight-only",),
}


def named_outputs(out: Any) -> list[tuple[str, Any]]:
    """(name, tensor) for a model's output: a tensor, a tuple/list or a dict of tensors."""
    if isinstance(out, dict):
        return [(str(k), v) for k, v in out.items() if hasattr(v, "shape")]
    if isinstance(out, (tuple, list)):
        return [(f"output_{i}", v) for i, v in enumerate(out) if hasattr(v, "shape")]
    return [("output", out)]


def layer_table(module: Any, skip: Any = ()) -> list[dict[str, Any]]:
    """Leaf-ish layers with parameters, with the techniques that apply to each (``skip``: names of
    layers already int8, which ``int8_layers`` lists)."""
    rows = []
    last_linear = None
    for name, m in module.named_modules():
        if type_name(m) == "Linear":
            last_linear = name
    experts = _expert_rows(module)
    for name, m in module.named_modules():
        t = type_name(m)
        if name in experts:
            rows.append(experts[name])
        if t not in _TECHNIQUES or name in skip:
            continue
        params = sum(p.numel() for p in m.parameters(recurse=True))
        techniques = list(_TECHNIQUES[t])
        groups = getattr(m, "groups", 1)
        notes = []
        if t.startswith("Conv") and isinstance(groups, int) and groups > 1:
            notes.append("depthwise" if groups == getattr(m, "in_channels", -1) else f"groups={groups}")
        if name == last_linear:
            notes.append("classifier: outputs never pruned")
            techniques = [x for x in techniques if x != "prune-structured"]
        rows.append({"name": name, "type": t, "params": params, "techniques": techniques, "notes": notes})
    return rows


#: what acts on a mixture of experts' fused expert tensors, and what does not
EXPERTS_NOTE = (
    "fused expert tensors (3-D Parameters, not Linear layers): weight-only --engine openvino compresses "
    "them; torchao weight-only, the int8 modes and pruning leave them float"
)


def _expert_rows(module: Any) -> dict[str, dict[str, Any]]:
    """{experts module: its table row} for a mixture of experts (``core.lm.expert_tensors``)."""
    from ptopt.core.lm import expert_tensors

    rows: dict[str, dict[str, Any]] = {}
    for tensor, n in expert_tensors(module).items():
        owner = tensor.rpartition(".")[0]
        row = rows.setdefault(owner, {"name": owner, "type": type_name(module.get_submodule(owner)), "params": 0,
                                      "techniques": ["weight-only (openvino)"], "notes": [EXPERTS_NOTE]})  # fmt: skip
        row["params"] += n
    return rows


def module_weights(module: Any, report: dict[str, Any]) -> None:
    """Parameters, int8 layers and float layers of a torch module into ``report``: the packed weights of
    int8 modules counted, and a frozen TorchScript's weights read from its graph's constants."""
    from ptopt.core.lm import stored_bytes
    from ptopt.core.weights import dtype_name, graph_weights, module_packed_layers

    tensors = list(module.parameters())
    int8 = module_packed_layers(module)
    if not int8 and not tensors:  # a frozen TorchScript: its weights are constants of the graph
        int8, tensors = graph_weights(module)
    report["parameters"] = sum(t.numel() for t in tensors) + sum(r["params"] for r in int8)
    # as stored: a weight-only int8/int4 tensor's bytes, not its elements times the float dtype it shows
    report["parameter_bytes"] = sum(stored_bytes(t) for t in tensors) + sum(r["bytes"] for r in int8)
    report["layers"] = layer_table(module, skip={r["name"] for r in int8})
    report["int8_layers"] = int8
    elements: dict[str, int] = {}
    for dtype, n in [(dtype_name(t), t.numel()) for t in tensors] + [(r["dtype"], r["params"]) for r in int8]:
        elements[dtype] = elements.get(dtype, 0) + n
    report["weight_dtypes"] = elements


def lm_runtime_facts(loaded: Any, report: dict[str, Any]) -> None:
    """A language-model folder another runtime runs (ONNX Runtime, OpenVINO, torch.export: no torch
    module's parameters to count): the weight bytes its runtime holds and its graph's inputs and outputs
    as the folder's record names them. Nothing is run: a decoder step takes a KV cache, not one batch."""
    from ptopt.core.formats import find_format
    from ptopt.core.lm import weight_bytes

    record = getattr(loaded.module, "record", None) or {}
    row = find_format(loaded.format)
    report["parameters"] = None
    report["weight_bytes"] = weight_bytes(loaded.module)
    report["lm_graph"] = {
        k: record[k] for k in ("inputs", "outputs", "batch", "max_positions") if k in record
    }
    report["runtime"] = getattr(row, "runtime", None) or getattr(loaded.module, "runtime", None)
    report["layers"] = []


def compiled_facts(loaded: Any, report: dict[str, Any]) -> None:
    """A compiled model file (an AOTInductor package): its weights are constants of native code, with no
    parameters to count; the batch run below lists its outputs."""
    from ptopt.core.formats import find_format

    report["parameters"] = None
    report["runtime"] = getattr(find_format(loaded.format), "label", None)
    report["layers"] = []


#: how many tokens of a language model's text ``inspect --data`` runs, as one sequence
LM_TOKENS = 64


def _lm_sequence(loaded: Any, data: Any) -> Any:
    """A causal language model's text data (a .txt, ``builtin:pydoc-text:...``, 1-D token ids in a
    .pt/.npy, as validate and quantize read them) as one sequence of its first ``LM_TOKENS`` tokens
    (``input_ids`` [1, T]); None for other data (a dataset of batches), or another model. A 1-D ids
    file read as data was 300 scalar samples: 'does not fit'."""
    from pathlib import Path

    from ptopt.core.data import Dataset
    from ptopt.core.hf import is_causal_lm
    from ptopt.core.lm import token_ids
    from ptopt.core.text import ID_SUFFIXES, is_text_ref

    if data is None or not isinstance(data, (str, os.PathLike)) or not is_causal_lm(loaded.module):
        return None
    text = str(data)
    source: Any = text
    if not is_text_ref(text):  # a .pt/.npy of one row of ids, read once: that row is the data
        source = _one_row(Path(text)) if Path(text).suffix.lower() in ID_SUFFIXES else None
        if source is None:
            return None
    vocab = getattr(loaded.module.config, "vocab_size", None)
    name = "--data" if source is text else f"--data {text}"  # a file's reader names the file itself
    ids = token_ids(source, vocab, loaded.info.get("hf_dir"), name)[:LM_TOKENS].unsqueeze(0)
    return Dataset({"input_ids": ids}, name=f"{text} (its first {ids.shape[1]} tokens as one sequence)")


def _one_row(path: Any) -> Any:
    """The 1-D integer tensor (token ids) ``path`` holds, or None (not one: a dataset, unreadable)."""
    import numpy as np
    import torch

    try:
        obj = np.load(path) if path.suffix.lower() == ".npy" else torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - unreadable: the data reader says so
        return None
    if getattr(obj, "ndim", 0) != 1 or np.issubdtype(np.asarray(obj).dtype, np.floating):
        return None
    return obj if isinstance(obj, torch.Tensor) else torch.from_numpy(np.asarray(obj))


def _is_folder(loaded: Any) -> bool:
    from ptopt.core.formats import find_format

    return bool(getattr(find_format(loaded.format), "folder", False))


def _precision(loaded: Any, report: dict[str, Any]) -> None:
    """The artifact's precision and where it was read: its sidecar, else its graph or weights."""
    from ptopt.core.weights import precision_of_weights

    if loaded.artifact is not None and loaded.artifact.precision:
        report["precision"], report["precision_from"] = loaded.artifact.precision, "sidecar"
        return
    said = report.pop("graph_precision", None)
    if said:  # what the graph records (OpenVINO's rt_info), else what its weights' dtypes say
        report["precision"], report["precision_from"] = said, "graph"
    elif precision_of_weights(report.get("weight_dtypes") or {}):
        report["precision"] = precision_of_weights(report["weight_dtypes"])
        report["precision_from"] = "weights"


def _graph_facts(loaded: Any, report: dict[str, Any]) -> None:
    """What a file of another runtime's graph says without running it (its format's ``describe``):
    outputs, weight count and bytes (initializers / constants), the precision its weights say."""
    from ptopt.core.formats import find_format

    row = find_format(loaded.format)
    facts = row.describe(loaded) if row is not None else {}
    report["parameters"] = facts.get("parameters")
    if facts.get("parameters") is not None:
        report["parameter_bytes"] = facts["parameter_bytes"]
        report["weights"] = facts.get("weights", {})
    report["weight_dtypes"] = facts.get("weight_dtypes", {})
    if facts.get("precision"):
        report["graph_precision"] = facts["precision"]
    report["outputs"] = facts.get("outputs", [])
    report["layers"] = []


def _run_in_runtime(loaded: Any, x: Any, what: str) -> list[tuple[str, Any]]:
    """One batch through a file of another runtime (ONNX Runtime, OpenVINO) by its validate runner;
    a failure is a ShapeMismatchError naming what was given."""
    import torch

    from ptopt.core.errors import PtoptError, ShapeMismatchError
    from ptopt.core.formats import get_format

    runner = get_format(loaded.format).runner(loaded.ref, loaded)
    try:
        runner.prepare(torch.get_num_threads())
        return runner.named_outputs(x)
    except PtoptError:
        raise
    except Exception as e:  # noqa: BLE001 - each runtime raises its own types for a batch it cannot take
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        got = ", ".join(
            f"{n}: {format_shape(t.shape)} {str(t.dtype).replace('torch.', '')}" for n, t in flatten_inputs(x)
        )
        raise ShapeMismatchError(f"{what} does not fit model {loaded.ref}: {reason[:300]}", got=got) from None
    finally:
        runner.close()


def _batch_size(loaded: Any, ds: Any) -> int:
    """Up to 8 samples; a file whose batch dimension is fixed (or bounded) gets a batch it takes."""
    n = min(len(ds), 8)
    spec = loaded.input_specs[0]
    if spec.min_shape and not spec.min_shape[0] <= n <= spec.max_shape[0]:
        return max(1, min(max(spec.min_shape[0], min(n, spec.max_shape[0])), len(ds)))
    return n


def _run_batch(loaded: Any, ds: Any, report: dict[str, Any]) -> None:
    """Run one batch (of the data, else a sample input from the specs) and list the outputs it gave:
    a torch module in this process, a file of another runtime (ONNX, OpenVINO) in its own runtime,
    only with data (without, its outputs are read from its graph). The graph's output dtypes are kept
    (ONNX Runtime's bfloat16 comes back as float32)."""
    if ds is None and loaded.module is None:
        return
    x = ds.first_batch(_batch_size(loaded, ds)).x if ds is not None else loaded.example_inputs(which="opt")
    what = ds.name if ds is not None else "sample input"
    if loaded.module is not None:
        outs = named_outputs(run_checked(loaded, x, what=what))
    else:
        outs = _run_in_runtime(loaded, x, what)
    declared = {o["name"]: o["dtype"] for o in report.get("outputs", [])}
    report["outputs"] = [
        {"name": n, "shape": list(t.shape), "dtype": declared.get(n) or str(t.dtype).replace("torch.", "")}
        for n, t in outs
    ]
    report["ran_batch"] = {n: format_shape(t.shape) for n, t in flatten_inputs(x)}


def _implied_or_suggested(loaded: Any, report: dict[str, Any]) -> None:
    """No specs yet: the ones the model implies (a Hugging Face config), else a suggested shape."""
    from ptopt.core.errors import UsageError
    from ptopt.core.input_infer import suggest_input_shapes
    from ptopt.core.modelref import require_input_specs

    if loaded.input_specs or loaded.module is None or not hasattr(loaded.module, "parameters"):
        return
    try:
        require_input_specs(loaded)
    except UsageError:
        report["suggested_input_shapes"] = suggest_input_shapes(loaded.module)


def inspect_model(
    model: Any,
    data: Any = None,
    weights: str | None = None,
    allow_pickle: bool = False,
    input_shapes: Any = (),
) -> dict[str, Any]:
    """Describe MODEL (a reference, an nn.Module, a stage's Result); with ``data`` (a DATA reference or
    Dataset) run one batch through it."""
    from ptopt.core.data import load_data, refuse_missing_file

    refuse_missing_file(data=data)  # before the model loads
    loaded = as_loaded(model, weights=weights, allow_pickle=allow_pickle)
    if input_shapes and isinstance(next(iter(input_shapes)), str):
        input_shapes = parse_named_shapes(input_shapes)
    declared = list(loaded.input_specs)
    ds = _lm_sequence(loaded, data)
    if ds is not None:  # the model's own tokens, at any length: its implied inputs give way to them
        declared = []
    elif data is not None:
        ds = load_data(data, model=loaded)
    report: dict[str, Any] = {"model": loaded.ref, "format": loaded.format, "size_bytes": loaded.size_bytes}
    if loaded.path is not None and loaded.path.exists():
        # ok / missing / stale (a sidecar whose sha256 does not match the file: ignored) + why
        status = Artifact.sidecar_status(loaded.path)
        report["sidecar"] = {"state": status.state, "reason": status.reason}
    if loaded.artifact is not None:
        a = loaded.artifact
        report["artifact"] = {
            "precision": a.precision,
            "config": a.config,
            "parent": a.parent,
            "created": a.created,
        }

    if ds is not None:
        if loaded.module is None:
            from ptopt.core.inputspec import check_inputs

            check_inputs(loaded.input_specs, ds.first_batch(min(len(ds), 8)).x, what=ds.name)
        elif declared:
            # compare with what the model declares before running, for a precise message
            from ptopt.core.inputspec import check_inputs

            check_inputs(declared, ds.first_batch(min(len(ds), 8)).x, what=ds.name)
        if not declared:  # a file's inputs stay as it declares them ([1..16]x[8..64]); the data only runs
            resolve_inputs(loaded, data=ds)
        report["data"] = {"name": ds.name, "samples": len(ds), "labels": ds.has_labels}
    elif input_shapes:
        resolve_inputs(loaded, input_shapes=input_shapes)
    _implied_or_suggested(loaded, report)
    report["inputs"] = [s.to_dict() | {"describe": s.describe()} for s in loaded.input_specs]
    report["input_style"] = loaded.input_style

    if loaded.module is not None and not hasattr(loaded.module, "parameters"):
        (lm_runtime_facts if _is_folder(loaded) else compiled_facts)(loaded, report)
    elif loaded.module is not None:
        module_weights(loaded.module, report)
    else:
        _graph_facts(loaded, report)
    if loaded.input_specs:
        _run_batch(loaded, ds, report)
    _precision(loaded, report)
    return report
