"""The table of artifact formats: one row per format, filled by the format modules of ``ptopt.formats``.

``ptopt.core`` imports no stage and knows no format by name. Each module of ``ptopt.formats``
(TorchScript, ExportedProgram, AOTInductor, ONNX, TensorRT, ...) defines one
:class:`ptopt.formats.base.Format` (its suffixes, sidecar ``format``, export target, precisions,
devices, servers, and how to load, write, reload and run it), and ``ptopt/formats/__init__.py``
registers every one here when ``import ptopt`` imports ``ptopt.formats``. Everything that needs to know a format reads this
table: ``core.modelref`` (loading a MODEL file), ``export`` (targets, writers), ``validate`` (runners),
``optimize`` (suffixes, runtimes) and ``serve`` (what a server runs as it is).

Adding a format is its module in ``formats/``, its tests and its docs section; nothing here changes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptopt.core.errors import UsageError

_TABLE: dict[str, Any] = {}


def register_format(fmt: Any) -> Any:
    """Add ``fmt`` (a ``ptopt.formats.base.Format``) to the table under ``fmt.name``. A second,
    different row for the same name or export target is a programming error."""
    old = _TABLE.get(fmt.name)
    if old is not None and type(old) is not type(fmt):
        raise RuntimeError(f"artifact format {fmt.name!r} registered twice")
    target = getattr(fmt, "target", None)
    clash = [f.name for f in _TABLE.values() if target and f.target == target and f.name != fmt.name]
    if clash:
        raise RuntimeError(f"export target {target!r} claimed by formats {clash[0]!r} and {fmt.name!r}")
    _TABLE[fmt.name] = fmt
    return fmt


def formats() -> list[Any]:
    """Every registered format, in the order sniffing tries them (``sniff_rank``, then name)."""
    return sorted(_TABLE.values(), key=lambda f: (f.sniff_rank, f.name))


def get_format(name: str) -> Any:
    """The row for a sidecar ``format`` name; UsageError listing the known ones otherwise."""
    fmt = _TABLE.get(name)
    if fmt is None:
        raise UsageError(f"unknown artifact format {name!r} (formats: {', '.join(sorted(_TABLE))})")
    return fmt


def find_format(name: str | None) -> Any | None:
    """The row for ``name``, or None (no error) when it is None or unknown."""
    return _TABLE.get(name) if name else None


def targets() -> dict[str, Any]:
    """``export --target`` name -> its format row, in the order the CLI lists them."""
    rows = sorted((f for f in _TABLE.values() if f.target), key=lambda f: (f.target_order, f.target))
    return {f.target: f for f in rows}


def format_for_target(target: str) -> Any:
    """The format ``export --target TARGET`` writes; UsageError listing the targets otherwise."""
    found = targets().get(target)
    if found is None:
        raise UsageError(f"unknown target {target!r} (choose from {', '.join(targets())})")
    return found


def sniff_file(path: str | os.PathLike) -> Any | None:
    """The format of a file without a sidecar, from its suffix and contents (None: not one we know)."""
    p = Path(path)
    for fmt in formats():
        if fmt.sniff(p):
            return fmt
    return None


def file_suffixes() -> list[str]:
    """The suffix of each format ptopt exports, in target order (``model.pt``-style help and errors)."""
    out: list[str] = []
    for fmt in targets().values():
        if fmt.suffix and fmt.suffix not in out:
            out.append(fmt.suffix)
    return out


def model_files() -> str:
    """The files a MODEL can be, from the table (help texts): ``model.pt (TorchScript), model.pt2
    (ExportedProgram or AOTInductor package), ...``, each suffix ptopt exports once, with every format
    written with it."""
    labels: dict[str, list[str]] = {}
    for fmt in targets().values():
        if fmt.suffix:
            labels.setdefault(fmt.suffix, []).append(fmt.label)
    return ", ".join(f"model{suffix} ({' or '.join(names)})" for suffix, names in labels.items())


def runtime_names() -> str:
    """The runtimes the artifacts ptopt exports run in, from the table (help texts): ``TorchScript,
    ExportedProgram, ..., OpenVINO IR, TensorRT``, after eager PyTorch."""
    return ", ".join(["eager PyTorch", *(fmt.label for fmt in targets().values())])


def with_article(label: str) -> str:
    """``label`` after "a" or "an" (by its first letter: "an ONNX model", "a TorchScript archive")."""
    return ("an " if label[:1].lower() in "aeiou" else "a ") + label
