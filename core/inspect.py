"""``ptopt inspect``: what a model is — inputs, outputs, parameters, size, and which layers each
technique can act on; with data, one batch is run so a data/model mismatch shows up here."""

from __future__ import annotations

from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.core.inputspec import flatten_inputs, format_shape, parse_named_shapes
from ptopt.core.modelref import load_model, resolve_inputs, run_checked

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


def _type_name(m: Any) -> str:
    return getattr(m, "original_name", None) or type(m).__name__


def layer_table(module: Any) -> list[dict[str, Any]]:
    """Leaf-ish layers with parameters, with the techniques that apply to each."""
    rows = []
    last_linear = None
    for name, m in module.named_modules():
        if _type_name(m) == "Linear":
            last_linear = name
    for name, m in module.named_modules():
        t = _type_name(m)
        if t not in _TECHNIQUES:
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


def _implied_or_suggested(loaded: Any, report: dict[str, Any]) -> None:
    """No specs yet: the ones the model implies (a Hugging Face config), else a suggested shape."""
    from ptopt.core.errors import UsageError
    from ptopt.core.input_infer import suggest_input_shapes
    from ptopt.core.modelref import require_input_specs

    if loaded.input_specs or loaded.module is None:
        return
    try:
        require_input_specs(loaded)
    except UsageError:
        report["suggested_input_shapes"] = suggest_input_shapes(loaded.module)


def inspect_model(
    model: str,
    data: Any = None,
    weights: str | None = None,
    allow_pickle: bool = False,
    input_shapes: Any = (),
) -> dict[str, Any]:
    """Describe MODEL; with ``data`` (a DATA reference or Dataset) run one batch through it."""
    from ptopt.core.data import load_data

    loaded = load_model(model, weights=weights, allow_pickle=allow_pickle)
    if input_shapes and isinstance(next(iter(input_shapes)), str):
        input_shapes = parse_named_shapes(input_shapes)
    declared = list(loaded.input_specs)
    ds = load_data(data) if data is not None else None
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
        resolve_inputs(loaded, data=ds)
        report["data"] = {"name": ds.name, "samples": len(ds), "labels": ds.has_labels}
    elif input_shapes:
        resolve_inputs(loaded, input_shapes=input_shapes)
    _implied_or_suggested(loaded, report)
    report["inputs"] = [s.to_dict() | {"describe": s.describe()} for s in loaded.input_specs]
    report["input_style"] = loaded.input_style

    if loaded.module is not None:
        module = loaded.module
        params = list(module.parameters())
        report["parameters"] = sum(p.numel() for p in params)
        report["parameter_bytes"] = sum(p.numel() * p.element_size() for p in params)
        report["layers"] = layer_table(module)
        if loaded.input_specs:
            x = ds.first_batch(min(len(ds), 8)).x if ds is not None else loaded.example_inputs(which="opt")
            out = run_checked(loaded, x, what=ds.name if ds is not None else "sample input")
            report["outputs"] = [
                {"name": n, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
                for n, t in named_outputs(out)
            ]
            report["ran_batch"] = {n: format_shape(t.shape) for n, t in flatten_inputs(x)}
    else:
        report["parameters"] = None
        report["layers"] = []
    return report
