"""What ``quantize``, ``prune`` and ``distill`` share around their technique.

Each of them runs the same named steps: resolve the config (one source of truth: a config object
*or* loose options, never both disagreeing) → load the eager model and the data (a MODEL/DATA
reference or in-memory objects) → settle the inputs and an example batch → run the technique →
measure → build a :class:`~ptopt.core.result.Result`. The helpers of those steps that are not
specific to one technique live here, so no technique imports another's private helpers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ptopt.core.errors import UnsupportedModelError, UsageError

_FORMAT_NAMES = {"torchscript": "TorchScript", "exported_program": "ExportedProgram"}
#: the placeholder path of an artifact template before ``Result.save``
UNSAVED = Path("<unsaved>")


# -- options ------------------------------------------------------------------------------------------


def ref_name(value: Any) -> str | None:
    """A reference as the sidecar records it; None for None, ``<Type>`` for in-memory objects."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    return f"<{type(value).__name__}>"


def check_output(output: Any, suffixes: Mapping[str, str] | None = None, hint: str = "") -> str | None:
    """Refuse a folder (or a suffix not in ``suffixes``) before any long work; returns the format."""
    if output is None:
        return None
    path = Path(output)
    if path.is_dir():
        raise UsageError(f"output {path} is a folder; give a file name{hint}")
    if suffixes is None:
        return None
    fmt = suffixes.get(path.suffix.lower())
    if fmt is None:
        names = " or ".join(f"{s} ({_FORMAT_NAMES.get(f, f)})" for s, f in suffixes.items())
        raise UsageError(f"output {path}: use {names}; the model is saved so that plain torch loads it")
    return fmt


def input_files(*refs: Any) -> tuple[Path, ...]:
    """The references that are files or folders (a Hugging Face model's, an earlier ptopt output's): a
    Result never saves over one of them."""
    return tuple(Path(r) for r in refs if isinstance(r, (str, os.PathLike)) and Path(r).exists())


# -- model and data -----------------------------------------------------------------------------------


def load_eager(
    model: Any, weights: Any, allow_pickle: bool, for_what: str, role: str = "", why: str = ""
) -> Any:
    """A LoadedModel holding an eager nn.Module that ``for_what`` can rewrite or train.

    TorchScript and ExportedProgram models are refused (``why`` says why, ``{format}`` filled in),
    naming the references that give an eager one; but a pruned file whose sidecar names its parent
    gets its eager module rebuilt (``compress.rebuild``).
    """
    from ptopt.compress import rebuild
    from ptopt.core.modelref import as_loaded

    loaded = as_loaded(model, weights, allow_pickle)
    consent = ""
    if rebuild.rebuildable(loaded):
        consent = rebuild.consent_missing(loaded, allow_pickle) or ""
        if not consent:
            loaded = rebuild.rebuild(loaded, allow_pickle, for_what, load_eager)
    module = loaded.require_module(for_what)
    if loaded.format in ("torchscript", "exported_program") or type(module).__name__ in (
        "RecursiveScriptModule",
        "ScriptModule",
    ):
        why = (why or "{for_what} needs the eager nn.Module").format(format=loaded.format, for_what=for_what)
        int8 = (
            "; an int8 model of this file itself (one with no sidecar naming its source has no other): "
            f"ptopt export {loaded.ref} --target openvino (or onnx) --precision int8 --data CALIB"
            if for_what == "quantization" and loaded.path is not None
            else ""
        )
        raise UnsupportedModelError(
            f"{role}{loaded.ref} is a {loaded.format} model; {why} "
            f"(pkg.module:factory --weights W, a zoo:NAME, or a pickled module with --allow-pickle){int8}"
            + (f"; {consent}" if consent else "")
        )
    _refuse_quantized(loaded, module, for_what, role)
    return loaded


def _refuse_quantized(loaded: Any, module: Any, for_what: str, role: str) -> None:
    """A model already compressed into a deployment format (a weight-only folder: its weights are torchao
    tensors no second rewrite takes) is refused, naming the source its sidecar records."""
    from ptopt.core.formats import find_format, with_article

    row = find_format(loaded.format)
    torchao = next(
        (type(p).__name__ for p in module.parameters() if type(p).__module__.startswith("torchao")), None
    )
    if (row is None or row.reexportable) and torchao is None:
        return
    what = (
        with_article(row.label)
        if row is not None and not row.reexportable
        else f"quantized ({torchao} weights)"
    )
    parent = (loaded.artifact.parent or {}).get("path") if loaded.artifact is not None else None
    source = f"; its sidecar names its source: {parent}" if parent else ""
    raise UsageError(f"{role}{loaded.ref} is already {what}: {for_what} starts from the fp32 model{source}")


def load_dataset(data: Any, what: str, *, finite: bool = True, model: Any = None) -> Any:
    """``data`` (a DATA reference or in-memory data) as a Dataset, or None; NaN/Inf refused. ``model``:
    the loaded model the data is for (a Hugging Face encoder reads a text file one sentence per line)."""
    if data is None:
        return None
    from ptopt.core.data import load_data

    ds = load_data(data, name=f"in-memory {what} data", model=model)
    if finite:
        ds.check_finite()
    return ds


def check_fits(loaded: Any, ds: Any) -> Any:
    """ShapeMismatchError (expected vs got) when ``ds`` does not fit the model; returns 2 samples."""
    from ptopt.core.inputspec import check_inputs
    from ptopt.core.modelref import run_checked

    x = ds.first_batch(min(len(ds), 2)).x
    if loaded.input_specs:
        check_inputs(loaded.input_specs, x, what=ds.name)
    ds.check_labels(run_checked(loaded, x, what=ds.name), str(loaded.ref))
    return x


def settle_inputs(loaded: Any, ds: Any, input_shapes: Any, data_hint: str = "data") -> Any:
    """Fix the artifact's input specs (data first, then ``input_shapes``, then the model's own) and
    return an example batch (2 samples) that the model has run."""
    from ptopt.core.inputspec import parse_named_shapes
    from ptopt.core.modelref import resolve_inputs, run_checked

    if ds is not None:
        x = check_fits(loaded, ds)
        resolve_inputs(loaded, data=ds)
        return x
    if input_shapes:
        if isinstance(next(iter(input_shapes)), str):
            input_shapes = parse_named_shapes(input_shapes)
        resolve_inputs(loaded, input_shapes=input_shapes)
    from ptopt.core.modelref import require_input_specs

    require_input_specs(loaded, data_hint)
    x = loaded.example_inputs(which="opt", batch=2)
    run_checked(loaded, x, what="sample input")
    return x


def count_parameters(module: Any) -> int:
    """All parameters of ``module`` (zeros included)."""
    return sum(p.numel() for p in module.parameters())


def count_nonzero_parameters(module: Any) -> int:
    """Parameters of ``module`` that are not zero (what unstructured pruning leaves)."""
    return sum(int((p.detach() != 0).sum()) for p in module.parameters())


# -- result -------------------------------------------------------------------------------------------


def finish(result: Any, output: Any) -> Any:
    """Save ``result`` at ``output`` when one was given (the ``output=`` shortcut); returns it."""
    if output is not None:
        result.save(output)
    return result


def refuse_if_unfaithful(result: Any, output: Any, advice: Any = None, what: str = "the int8 model") -> None:
    """ParityError (exit 2) when ``result.metrics["vs_fp32"]`` failed the parity rule: the worst output
    and its numbers, what ``advice()`` suggests, and with ``output`` the file kept aside as
    ``<output>.failed`` (nothing else written). The Result rides along as ``.result``."""
    from ptopt.compress.fidelity import failure
    from ptopt.core.errors import ParityError

    fid = result.metrics.get("vs_fp32")
    if fid is None or fid["passed"]:
        return
    hint = advice() if advice is not None else ""
    kept = keep_failed(result, output)
    where = f"; kept aside for inspection as {', '.join(kept)}" if kept else ""
    err = ParityError(f"{failure(fid, what)}{where}.{hint}")
    err.metrics = result.metrics  # type: ignore[attr-defined]
    err.failed = kept  # type: ignore[attr-defined]
    err.result = result  # type: ignore[attr-defined]
    raise err


def keep_failed(result: Any, output: Any) -> list[str]:
    """Write ``result``'s file(s) as ``<output>.failed`` (no sidecar: it is not a good artifact); a file
    beside it under a name of its own (an OpenVINO IR's ``.bin``) as ``<that name>.failed``."""
    if output is None:
        return []
    import tempfile

    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".ptopt-failed-") as d:
        path = Path(d) / out.name
        facts = result._writer(path) or {}
        for f in facts.get("files") or [path.name]:
            named = out.name + f[len(path.name) :] if f.startswith(path.name) else f
            dest = out.parent / (named + ".failed")
            os.replace(Path(d) / f, dest)
            kept.append(str(dest))
    return kept
