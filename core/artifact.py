"""Artifacts: every file ptopt writes, with a ``<file>.ptopt.json`` sidecar describing it.

The sidecar is enough to use an artifact: its format, input specs, the config that produced it,
its parent (path + sha256), sizes of all its files, library versions and creation time. Writes are
atomic: files are written under a temporary name in the destination folder and renamed into place
only when everything succeeded, so a crash never leaves a half-written artifact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError
from ptopt.core.inputspec import InputSpec
from ptopt.core.system import library_versions

SIDECAR_SUFFIX = ".ptopt.json"
SCHEMA_VERSION = 1

#: Known artifact formats and the file suffixes that imply them.
FORMATS = {
    "torchscript": (".pt", ".ts", ".torchscript"),
    "exported_program": (".pt2",),
    "aoti_package": (),  # also .pt2: the sidecar (or the archive's data/aotinductor/) tells them apart
    "onnx": (".onnx",),
    "tensorrt": (".ep", ".trt"),
    "state_dict": (".safetensors",),
    "pickle": (),
    "mar": (".mar",),
    "triton": (),
}


def sidecar_path(path: str | os.PathLike) -> Path:
    return Path(str(path) + SIDECAR_SUFFIX)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def gzip_size(paths: list[Path]) -> int:
    """Bytes after gzip (level 6): what the artifact costs to ship; zeros from pruning compress."""
    total = 0
    for p in paths:
        with open(p, "rb") as fh:
            total += len(gzip.compress(fh.read(), compresslevel=6, mtime=0))
    return total


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclasses.dataclass
class Artifact:
    """A file ptopt wrote (or read) plus what its sidecar says about it."""

    path: Path
    format: str
    inputs: list[InputSpec] = dataclasses.field(default_factory=list)
    #: "positional" (model(*xs)) or "keyword" (model(**xs)); decides how inputs are passed.
    input_style: str = "positional"
    outputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    config: dict[str, Any] | None = None
    parent: dict[str, Any] | None = None
    precision: str = "fp32"
    #: all files of the artifact, the main one first (e.g. model.onnx and model.onnx.data)
    files: list[str] = dataclasses.field(default_factory=list)
    size_bytes: int = 0
    sha256: str = ""
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    created: str = ""

    # -- reading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike) -> Artifact:
        """Read an artifact from its sidecar alone."""
        path = Path(path)
        side = sidecar_path(path)
        if not side.is_file():
            raise ModelLoadError(f"{path}: no sidecar {side.name} (not written by ptopt?)")
        try:
            data = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{side}: unreadable sidecar: {e}") from e
        return cls.from_dict(path, data)

    @classmethod
    def maybe_load(cls, path: str | os.PathLike) -> Artifact | None:
        return cls.load(path) if sidecar_path(path).is_file() else None

    @classmethod
    def from_dict(cls, path: Path, data: dict[str, Any]) -> Artifact:
        names = {f.name for f in dataclasses.fields(cls)} - {"path", "inputs"}
        kwargs = {k: v for k, v in data.items() if k in names}
        return cls(path=Path(path), inputs=[InputSpec.from_dict(s) for s in data.get("inputs", [])], **kwargs)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["path"] = self.path.name
        d["inputs"] = [s.to_dict() for s in self.inputs]
        d["schema"] = SCHEMA_VERSION
        return d

    @property
    def file_paths(self) -> list[Path]:
        return [self.path.parent / f for f in (self.files or [self.path.name])]

    # -- writing ---------------------------------------------------------------------------
    def finalize(self) -> Artifact:
        """Measure the files now in place, stamp versions and time, and write the sidecar atomically."""
        if not self.files:
            self.files = [self.path.name]
        paths = self.file_paths
        self.size_bytes = sum(p.stat().st_size for p in paths)
        self.sha256 = sha256_file(self.path) if self.path.is_file() else ""
        self.versions = library_versions()
        self.created = _now()
        self.extra.setdefault("gzip_bytes", gzip_size([p for p in paths if p.is_file()]))
        write_text_atomic(
            sidecar_path(self.path), json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"
        )
        return self


def parent_record(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """``{"path", "sha256", "format"}`` of a parent file, or None when the parent is not a file."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        return {"path": str(path)}
    art = Artifact.maybe_load(p)
    return {"path": str(p), "sha256": sha256_file(p), "format": art.format if art else None}


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it into place only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def staged_dir(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder; on success move each file it holds into ``final_dir``.

    For writers that produce several files (ONNX + external data, a Triton repository): nothing
    appears at the destination until every file was written. Existing files of the same names are
    replaced.
    """
    final_dir = Path(final_dir)
    final_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ptopt-stage-", dir=final_dir))
    try:
        yield tmp
        for item in sorted(tmp.rglob("*")):
            if item.is_file():
                dest = final_dir / item.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(item, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
