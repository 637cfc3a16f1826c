"""Runners: each artifact run the way it is deployed, by its format's row (``ptopt.formats``).

``open_runner(ref)`` loads the reference (``ptopt.core.modelref``: the sidecar's format, else the
file's) and asks that format's row for its runner (``Format.runner``); MODEL references
(``zoo:NAME``, ``pkg.mod:factory``) and ``nn.Module`` objects run eagerly. Formats that are packages
or weights (``.mar``, Triton repositories, state_dicts) are refused with what they are.

``validate --compile`` adds ``compiled.CompiledRunner`` rows: an eager / ExportedProgram model behind
``torch.compile`` (a ``compiled.CompiledRef`` wraps the reference it opens).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.core.errors import ModelLoadError, PtoptError
from ptopt.core.formats import find_format, sniff_file
from ptopt.formats.runner import ArtifactRunError, Runner, primary_output

__all__ = ["ArtifactRunError", "Runner", "open_runner", "primary_output"]


def open_runner(
    ref: Any,
    name: str | None = None,
    *,
    weights: Any = None,
    allow_pickle: bool = False,
    providers: Sequence[str] | None = None,
) -> Runner:
    """Load ``ref`` (a path, MODEL reference, nn.Module or LoadedModel) into the runner for its format."""
    from ptopt.core.modelref import as_loaded
    from ptopt.validate.runners.compiled import CompiledRef

    name = name or display_name(ref)
    if isinstance(ref, CompiledRef):
        return _open_compiled(ref, name, weights=weights, allow_pickle=allow_pickle)
    if isinstance(ref, (str, Path)) and Path(str(ref)).is_file():
        _refuse_not_runnable(Path(str(ref)), name)
    try:
        loaded = as_loaded(ref, weights=weights, allow_pickle=allow_pickle)
    except PtoptError as e:
        msg = str(e)
        raise type(e)(msg if name in msg else f"{name}: {msg}") from None
    return runner_for_loaded(name, loaded, providers=providers)


def _refuse_not_runnable(path: Path, name: str) -> None:
    """A package or weights file (its sidecar's format, else its suffix) is refused with what it is."""
    try:
        art = Artifact.maybe_load(path)
    except PtoptError as e:
        raise ModelLoadError(f"{name}: {e}") from None
    row = find_format(art.format) if art is not None else sniff_file(path)
    if row is not None and row.not_runnable:
        raise ModelLoadError(f"{name}: cannot be run: it is {row.not_runnable}")


def _open_compiled(ref: Any, name: str, **options: Any) -> Runner:
    from ptopt.validate.runners.compiled import COMPILABLE_FORMATS, CompiledRunner

    base = open_runner(ref.base, name, **options)
    if base.format not in COMPILABLE_FORMATS:
        base.close()
        raise ModelLoadError(
            f"{name}: torch.compile takes eager and ExportedProgram models, not {base.format}"
        )
    return CompiledRunner.wrap(base, name, ref.mode)


def runner_for_loaded(name: str, loaded: Any, providers: Sequence[str] | None = None) -> Runner:
    """The runner of ``loaded``'s format (its row in ``ptopt.core.formats``)."""
    row = find_format(loaded.format)
    if row is None:
        raise ModelLoadError(f"{name}: no runner for format {loaded.format!r}")
    runner = row.runner(name, loaded, providers=providers)
    extra = loaded.artifact.extra if loaded.artifact is not None else {}
    runner.recorded_layer = extra.get("output_layer") if isinstance(extra.get("output_layer"), str) else None
    return runner


def display_name(ref: Any) -> str:
    """How an artifact is named in reports: its file name, the reference text, or the module's class."""
    import torch

    if isinstance(ref, torch.nn.Module):
        return type(ref).__name__
    text = str(getattr(ref, "ref", ref))
    p = Path(text)
    if p.exists():
        return p.name
    scheme, sep, rest = text.partition(":")
    parts = Path(rest).parts
    if len(text) > LONG_NAME and sep and len(parts) > 2:  # hf:/long/path/to/model: its last two folders
        return f"{scheme}:…/{'/'.join(parts[-2:])}"
    return text


#: a reference longer than this is shortened in reports' tables (they must fit 100 columns)
LONG_NAME = 40
