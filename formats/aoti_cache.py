"""ptopt's compile cache for AOTInductor packages: the same program, compiled the same way on the same
machine, is compiled once.

Inductor caches what ``torch.compile`` builds, but not what ``aoti_compile_and_package`` builds: every
export of an unchanged model runs the C++ compiler again (10-60 s on 2 cores). ptopt keys a package
on everything its generated code depends on and reuses it:

- each program's graph (every node's op, target, arguments and traced shape/dtype/stride), its
  signature and symbolic ranges, and the bytes of every weight, buffer and constant;
- the Inductor options of the call and Inductor's whole configuration, torch's version, the C++
  compiler and its version, the CPU ISA Inductor generates code for, torch's thread count, and the
  environment variables that steer Inductor and the CPU kernels (``TORCHINDUCTOR_*``,
  ``AOT_INDUCTOR_*``, ``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``).

The example inputs' values are not part of the key (the generated code depends on their shapes only).
A program that holds anything but tensors (a TorchBind object) is not cached. Entries live in
``$PTOPT_CACHE_DIR/aoti`` (default ``~/.cache/ptopt/aoti``), one ``<key>.pt2`` and ``<key>.json``
(the first build's seconds and date) each, written atomically; a per-key file lock makes a second
process wait for the first one's build instead of compiling the same program. The least recently used
entries go when the folder passes ``PTOPT_AOTI_CACHE_MB`` (default 2048). ``PTOPT_AOTI_CACHE=0``
turns the cache off (benchmarks that time the compile do).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "cache_folder", "cached_compile", "package_key"]

#: "0" turns the cache off
CACHE_ENV = "PTOPT_AOTI_CACHE"
#: the folder's size bound in MiB (least recently used entries go first)
SIZE_ENV = "PTOPT_AOTI_CACHE_MB"
_ENV_PREFIXES = (
    "TORCHINDUCTOR_",
    "AOT_INDUCTOR_",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "OMP_NUM_THREADS",
)


def cache_folder() -> Path | None:
    """Where packages are cached, or None when ``PTOPT_AOTI_CACHE=0``."""
    if os.environ.get(CACHE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    root = os.environ.get("PTOPT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ptopt")
    return Path(root) / "aoti"


def package_key(programs: dict[str, Any], configs: dict[str, Any], compiler: str, device: str) -> str | None:
    """The cache key of compiling ``programs`` (``{model name: ExportedProgram}``) with ``configs``;
    None when a program holds something the key cannot cover."""
    import torch
    import torch._inductor.config as inductor_config

    h = hashlib.sha256()
    for name, ep in sorted(programs.items()):
        digest = _program_digest(ep)
        if digest is None:
            return None
        h.update(f"{name}={digest}\n".encode())
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))
    facts = [
        json.dumps(configs, sort_keys=True, default=str),
        repr(sorted(inductor_config.save_config_portable().items())),
        torch.__version__,
        compiler,
        _compiler_version(compiler),
        _vec_isa(device),
        str(torch.get_num_threads()),
        device,
        repr(env),
    ]
    h.update("\n".join(facts).encode())
    return h.hexdigest()[:40]


def _program_digest(ep: Any) -> str | None:
    import torch

    h = hashlib.sha256()
    for node in ep.graph.nodes:
        h.update(f"{node.op}|{node.name}|{node.target}|{node.args}|{node.kwargs}|{_meta(node)}\n".encode())
    h.update(str(ep.graph_signature).encode())
    h.update(repr(sorted((str(k), str(v)) for k, v in ep.range_constraints.items())).encode())
    for name, value in sorted({**ep.state_dict, **ep.constants}.items()):
        if not isinstance(value, torch.Tensor):
            return None
        _update_tensor(h, name, value)
    return h.hexdigest()


def _meta(node: Any) -> str:
    val = node.meta.get("val")
    if val is None or not hasattr(val, "shape"):
        return repr(val) if isinstance(val, (int, float, bool, str)) else type(val).__name__
    try:
        stride = tuple(val.stride())
    except (AttributeError, RuntimeError, TypeError):  # sparse or opaque layouts have no strides
        stride = ()
    return f"{tuple(val.shape)}|{val.dtype}|{tuple(stride)}|{val.device}"


def _update_tensor(h: Any, name: str, t: Any) -> None:
    t = t.detach().cpu()
    if t.is_quantized:
        h.update(f"{name}|q|{t.qscheme()}|".encode())
        t = t.int_repr()
    h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
    flat = t.contiguous().reshape(-1)
    if flat.numel():
        import torch

        h.update(flat.view(torch.uint8).numpy().tobytes())


@functools.cache
def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return "?"
    return done.stdout.splitlines()[0] if done.stdout else "?"


def _vec_isa(device: str) -> str:
    if device.startswith("cuda"):
        return "cuda"
    from torch._inductor import cpu_vec_isa

    return str(cpu_vec_isa.pick_vec_isa())


@contextlib.contextmanager
def cached_compile(key: str | None, out: Path) -> Iterator[dict[str, Any]]:
    """Around a compile into ``out``: when ``key``'s package is cached it is copied to ``out`` and the
    yielded dict has ``hit`` (the first build's ``seconds`` and ``built``), and the caller skips its
    compile; otherwise the caller compiles into ``out`` (and may set the dict's ``seconds``, the
    compile's own time) and, on leaving, the package is stored.
    Holds the key's file lock throughout, so concurrent builds of one key happen once."""
    folder = cache_folder()
    if key is None or folder is None:
        yield {}
        return
    from filelock import FileLock

    folder.mkdir(parents=True, exist_ok=True)
    entry, facts = folder / f"{key}.pt2", folder / f"{key}.json"
    with FileLock(str(folder / f"{key}.lock")):
        state = _read_hit(entry, facts)
        if state:
            shutil.copyfile(entry, out)
            os.utime(entry)  # recently used
            yield state
            return
        started = time.perf_counter()
        yield state
        if out.is_file():
            _store(out, entry, facts, state.get("seconds", time.perf_counter() - started))
    _trim(folder)


def _read_hit(entry: Path, facts: Path) -> dict[str, Any]:
    if not (entry.is_file() and facts.is_file()):
        return {}
    try:
        info = json.loads(facts.read_text())
    except (OSError, ValueError):
        return {}
    return {"hit": True, "seconds": float(info.get("seconds", 0.0)), "built": info.get("built", "")}


def _store(out: Path, entry: Path, facts: Path, seconds: float) -> None:
    tmp = entry.with_suffix(".pt2.tmp")
    shutil.copyfile(out, tmp)
    os.replace(tmp, entry)
    built = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
    facts.write_text(json.dumps({"seconds": round(seconds, 2), "built": built}))


def _trim(folder: Path) -> None:
    """Least recently used packages out until the folder is within its size bound."""
    try:
        limit = float(os.environ.get(SIZE_ENV, "2048")) * 2**20
    except ValueError:
        limit = 2048 * 2**20
    from filelock import FileLock, Timeout

    entries = sorted(folder.glob("*.pt2"), key=lambda p: p.stat().st_mtime)
    total = sum(p.stat().st_size for p in entries)
    for p in entries[:-1]:  # the newest one stays, whatever its size
        if total <= limit:
            break
        try:  # an entry another process is reading or writing stays
            with FileLock(str(p.with_suffix(".lock")), timeout=0):
                size = p.stat().st_size
                for f in (p, p.with_suffix(".json")):
                    f.unlink(missing_ok=True)
        except (Timeout, OSError):
            continue
        total -= size
