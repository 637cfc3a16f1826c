"""Output paths that would destroy an input: refused before anything is written.

A command must never write over what it reads (``ptopt prune in.pt -o in.pt``), nor write two of its
own outputs to one file (``--save-recipe`` equal to ``-o``, ``validate --json`` onto the model). A
path counts with its *companions*, the files ptopt writes or reads beside it: the sidecar
``<file>.ptopt.json`` and ONNX external data ``<file>.data``. Paths are compared resolved (symlinks
included, ``os.path.realpath``) and, where both exist, as files (hard links: same device and inode).

::

    check_outputs(inputs=[model_path], outputs={"-o": out, "--save-recipe": recipe})
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ptopt.core.errors import UsageError

SIDECAR_SUFFIX = ".ptopt.json"  # the same as ptopt.core.artifact.SIDECAR_SUFFIX
DATA_SUFFIX = ".data"

PathLike = str | os.PathLike
#: a ``{label: path}`` mapping, or an iterable of paths or of ``(label, path)`` pairs; None is skipped
Paths = Mapping[str, PathLike | None] | Iterable[PathLike | tuple | None]


def companions(path: PathLike) -> list[tuple[str, Path]]:
    """``path`` and the files that go with it, each with what it is to ``path`` ("" for itself)."""
    p = Path(path)
    return [
        ("", p),
        ("sidecar", Path(str(p) + SIDECAR_SUFFIX)),
        ("external data", Path(str(p) + DATA_SUFFIX)),
    ]


@dataclasses.dataclass
class _Place:
    """One file a command reads or writes: whose (label, path given) and what it is to that path."""

    label: str
    owner: Path
    role: str
    path: Path
    real: str
    inode: tuple[int, int] | None

    def same(self, other: _Place) -> bool:
        return self.real == other.real or (self.inode is not None and self.inode == other.inode)

    def __str__(self) -> str:
        return f"the {self.role} of {self.label} {self.owner}" if self.role else f"{self.label} {self.owner}"


def _places(label: str, path: Path) -> list[_Place]:
    out = []
    for role, p in companions(path):
        try:
            st = os.stat(p)
            inode: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            inode = None
        out.append(_Place(label, path, role, p, os.path.realpath(p), inode))
    return out


def _labelled(paths: Paths | None, default: str) -> list[tuple[str, Path]]:
    if paths is None:
        return []
    items = paths.items() if isinstance(paths, Mapping) else paths
    out = []
    for item in items:
        label, p = item if isinstance(item, tuple) else (default, item)
        if p is not None:
            out.append((label, Path(p)))
    return out


def check_outputs(inputs: Paths | None, outputs: Paths) -> None:
    """Raise :class:`UsageError` (exit 2) when an output, or one of its companions, is an input or an
    input's companion, or (a companion of) another output of the same command. Writes nothing.

    ``inputs`` / ``outputs``: paths, ``(label, path)`` pairs or a ``{label: path}`` mapping; a label
    names the option in the message (``"-o"``, ``"--json"``); by default ``input`` / ``output``.
    Inputs that are not files (``zoo:NAME``, ``builtin:digits``) match nothing and are harmless.
    """
    taken: list[_Place] = []
    for label, path in _labelled(inputs, "input"):
        taken += _places(label, path)
        real = Path(os.path.realpath(path))
        if real != Path(os.path.abspath(path)):  # an input through a link: its target's companions too
            taken += _places(label, real)
    for label, path in _labelled(outputs, "output"):
        mine = _places(label, path)
        for place in mine:
            for other in taken:
                if place.same(other):
                    whose = f" (its {place.role} {place.path})" if place.role else ""
                    raise UsageError(
                        f"{label} {path}{whose} would overwrite {other}; choose another file name"
                    )
        taken += mine
