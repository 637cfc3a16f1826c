"""Artifacts: every file ptopt writes, with a ``<file>.ptopt.json`` sidecar describing it.

The sidecar is enough to use an artifact: its format, input specs, the config that produced it,
its parent (path + sha256), sizes and sha256 of all its files, library versions and creation time.

**The file and its sidecar never disagree.** The sidecar records the sha256 of every file of the
artifact (``hashes``; ``sha256`` is the main file's). A sidecar whose hashes do not match the files
next to it is *stale* and counts as absent: :meth:`Artifact.sidecar_status` says ``ok``, ``missing``,
``stale`` (with why) or ``unreadable``; :meth:`Artifact.maybe_load` returns None for a missing or
stale one and :meth:`Artifact.load` refuses it. Writes go through ``ptopt.core.atomic``: files are
written under temporary names and renamed into place, under an exclusive lock on the output, model
file(s) first and the sidecar last, so at every instant the pair on disk is the old consistent pair,
or new files whose old sidecar is stale, or the new consistent pair.

**Hash cost.** A file is read once per write (sha256 and gzip size in one pass, from the staged
copy). :func:`sha256_file` remembers a hash for the rest of the process only for a file whose
inode, size, mtime and ctime are unchanged and were already two seconds old when it was read (so a
later change cannot hide inside one timestamp tick); a fresh file is hashed again. A gzip size is
remembered by the sha256 of the bytes it was measured on (the same bytes always compress to the same
size), so a file written and then validated in one process is compressed once, not twice.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import time
import zlib
from pathlib import Path
from typing import Any

from ptopt.core.atomic import (
    atomic_path,
    output_lock,
    placed_by_us,
    remove_stale_temps,
    staged_dir,
    write_text_atomic,
)
from ptopt.core.errors import ModelLoadError
from ptopt.core.inputspec import InputSpec
from ptopt.core.isa import cpu_record
from ptopt.core.system import library_versions

__all__ = [
    "SIDECAR_SUFFIX",
    "Artifact",
    "SidecarStatus",
    "atomic_path",
    "gzip_bytes",
    "gzip_size",
    "parent_record",
    "sha256_file",
    "sidecar_path",
    "staged_dir",
    "write_text_atomic",
]

SIDECAR_SUFFIX = ".ptopt.json"
SCHEMA_VERSION = 1
_CHUNK = 1 << 20
#: a hash is remembered only for files whose timestamps were at least this old when read
_MEMO_MIN_AGE_NS = 2_000_000_000
_sha_memo: dict[tuple, str] = {}
#: sha256 -> gzip bytes (level 6) of files read with ``scan_file``: exact for any file of those bytes
_gzip_memo: dict[str, int] = {}


def sidecar_path(path: str | os.PathLike) -> Path:
    return Path(str(path) + SIDECAR_SUFFIX)


@dataclasses.dataclass(frozen=True)
class FileFacts:
    """One read of a file: its sha256, size, gzip size (level 6) and the stat of what was read."""

    sha256: str
    size: int
    gzip_bytes: int | None
    stat: os.stat_result


def _stat_key(path: str | os.PathLike, st: os.stat_result) -> tuple:
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def scan_file(path: str | os.PathLike, gzip: bool = True) -> FileFacts:
    """Read ``path`` once (one open file, so one inode even if the name is replaced meanwhile):
    sha256, and the gzip size when asked. Remembers the hash when that is safe (module doc)."""
    started = time.time_ns()
    h = hashlib.sha256()
    z = zlib.compressobj(6, zlib.DEFLATED, 31) if gzip else None  # what gzip.compress(mtime=0) makes
    zbytes = 0
    with open(path, "rb") as fh:
        before = os.fstat(fh.fileno())
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
            if z is not None:
                zbytes += len(z.compress(block))
        after = os.fstat(fh.fileno())
    if z is not None:
        zbytes += len(z.flush())
    digest = h.hexdigest()
    if z is not None:
        _gzip_memo[digest] = zbytes
    key = _stat_key(path, before)
    if (
        key == _stat_key(path, after)
        and max(before.st_mtime_ns, before.st_ctime_ns) < started - _MEMO_MIN_AGE_NS
    ):
        _sha_memo[key] = digest
    return FileFacts(digest, after.st_size, zbytes if z is not None else None, after)


def sha256_file(path: str | os.PathLike, chunk: int = _CHUNK) -> str:
    """The sha256 of a file (remembered for unchanged, settled files: see the module doc)."""
    memo = _sha_memo.get(_stat_key(path, os.stat(path)))
    return memo if memo is not None else scan_file(path, gzip=False).sha256


def gzip_size(paths: list[Path]) -> int:
    """Bytes after gzip (level 6): what the artifact costs to ship; zeros from pruning compress. A file
    whose bytes (by sha256, ~100x cheaper than deflate) were compressed before in this process is not
    compressed again."""
    total = 0
    for p in paths:
        known = _gzip_memo.get(sha256_file(p))
        total += known if known is not None else scan_file(p).gzip_bytes or 0
    return total


def gzip_bytes(raw: bytes) -> int:
    """Bytes of ``raw`` after gzip (level 6, as ``gzip.compress(raw, 6, mtime=0)``), remembered by its
    sha256 like a file's (:func:`gzip_size`): the same weights measured again (a model pruned twice, then
    validated) are deflated once."""
    digest = hashlib.sha256(raw).hexdigest()
    known = _gzip_memo.get(digest)
    if known is None:
        z = zlib.compressobj(6, zlib.DEFLATED, 31)
        known = _gzip_memo[digest] = len(z.compress(raw)) + len(z.flush())
    return known


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclasses.dataclass(frozen=True)
class SidecarStatus:
    """What the sidecar of a file is worth: ``state`` is ``ok`` (``artifact`` is the loaded
    Artifact), ``missing``, ``stale`` (it describes other bytes than the files next to it: an
    interrupted or concurrent write, or the file was replaced) or ``unreadable``; ``reason`` is one
    line saying why it is not ok. Truthy only when ok."""

    state: str
    reason: str = ""
    artifact: Artifact | None = None

    OK = "ok"
    MISSING = "missing"
    STALE = "stale"
    UNREADABLE = "unreadable"

    def __bool__(self) -> bool:
        return self.state == self.OK


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
    #: sha256 of the main file; ``hashes``: of every file in ``files`` (what makes the sidecar trusted)
    sha256: str = ""
    hashes: dict[str, str] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    created: str = ""
    #: the CPU it was written and parity-checked on (``ptopt.core.isa.cpu_record``: model, vendor, its
    #: int8-relevant flags, its level); loading it on a CPU whose flags differ says so (``check_moved``)
    cpu: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -- reading ---------------------------------------------------------------------------
    @classmethod
    def sidecar_status(cls, path: str | os.PathLike) -> SidecarStatus:
        """Whether ``path`` has a sidecar that describes the files next to it (see SidecarStatus)."""
        path = Path(path)
        side = sidecar_path(path)
        if not side.is_file():
            return SidecarStatus(
                SidecarStatus.MISSING, f"{path}: no sidecar {side.name} (not written by ptopt?)"
            )
        try:
            data = json.loads(side.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {type(data).__name__}, not an object")
            art = cls.from_dict(path, data)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            return SidecarStatus(SidecarStatus.UNREADABLE, f"{side}: unreadable sidecar: {e}")
        why = art.check_files()
        if why:
            return SidecarStatus(
                SidecarStatus.STALE,
                f"{side}: stale sidecar, ignored: {why} (an interrupted or concurrent write, or the file "
                "was replaced since)",
            )
        return SidecarStatus(SidecarStatus.OK, "", art)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Artifact:
        """Read an artifact from its sidecar alone; refuses a missing, stale or unreadable one."""
        status = cls.sidecar_status(path)
        if not status:
            raise ModelLoadError(status.reason)
        return status.artifact

    @classmethod
    def maybe_load(cls, path: str | os.PathLike) -> Artifact | None:
        """The artifact, or None when it has no sidecar or a stale one; refuses an unreadable one."""
        status = cls.sidecar_status(path)
        if status.state == SidecarStatus.UNREADABLE:
            raise ModelLoadError(status.reason)
        return status.artifact

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

    def check_files(self) -> str:
        """'' when the files next to the sidecar are the bytes it describes, else why not."""
        expected = dict(self.hashes)
        if self.sha256 and expected.setdefault(self.path.name, self.sha256) != self.sha256:
            return f"it records two different sha256 for {self.path.name}"
        if not expected and self.path.is_file():
            return f"it records no sha256 for {self.path.name}"
        for name, digest in expected.items():
            f = self.path.parent / name
            if Path(name).is_absolute() or ".." in Path(name).parts:
                return f"it names a file outside its folder ({name})"
            if not f.is_file():
                return f"{f.name} is missing"
            if sha256_file(f) != digest:
                return f"the sha256 of {f.name} is not the one it records"
        return ""

    # -- writing ---------------------------------------------------------------------------
    def measure(self, root: str | os.PathLike | None = None) -> dict[str, FileFacts]:
        """Fill sizes, sha256s, gzip bytes, versions and time from the files, reading each once.
        ``root``: the folder they are staged in (else next to ``path``). Returns what was read."""
        if not self.files:
            self.files = [self.path.name]
        read: dict[str, FileFacts] = {}
        size = 0
        for name in self.files:
            f = Path(root) / name if root is not None else self.path.parent / name
            if root is not None and not f.exists():
                f = self.path.parent / name
            if f.is_file():
                read[name] = scan_file(f)
                size += read[name].size
            else:
                size += f.stat().st_size  # a folder artifact's folder (or a missing file: an error)
        self.size_bytes = size
        self.hashes = {name: facts.sha256 for name, facts in read.items()}
        self.sha256 = self.hashes.get(self.path.name, "")
        self.versions = library_versions()
        self.created = _now()
        self.cpu = cpu_record()
        self.extra.setdefault("gzip_bytes", sum(facts.gzip_bytes or 0 for facts in read.values()))
        return read

    def write_sidecar(self) -> None:
        write_text_atomic(
            sidecar_path(self.path), json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"
        )

    def finalize(self) -> Artifact:
        """Measure the files now in place and write the sidecar, under the output's lock.

        When another writer replaced a file this process put in place, the sidecar is left to that
        writer (its files, its sidecar): never this run's facts beside another run's bytes.
        """
        with output_lock(self.path):
            remove_stale_temps(self.path)
            read = self.measure()
            if all(placed_by_us(self.path.parent / name, facts.stat) for name, facts in read.items()):
                self.write_sidecar()
        return self


def parent_record(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """``{"path", "sha256", "format"}`` of a parent file, or None when the parent is not a file."""
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        return {"path": str(path)}
    art = Artifact.maybe_load(p)
    sha = art.sha256 if art is not None and art.sha256 else sha256_file(p)  # checked just now
    return {"path": str(p), "sha256": sha, "format": art.format if art else None}
