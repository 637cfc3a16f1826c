"""AOTInductor packages as files: telling one from an ExportedProgram ``.pt2``, reading its metadata
without loading it, refusing one built by another torch, and loading it.

A ``.pt2`` is either a ``torch.export`` ExportedProgram or an AOTInductor package (compiled native
code, ``data/aotinductor/`` in the archive). A ptopt sidecar says which (``format``:
``exported_program`` / ``aoti_package``); without one the archive's contents decide.

A package runs only on the torch that compiled it (the generated code calls torch's C++ ABI).
ptopt writes the torch version into the package's own metadata (:data:`VERSION_KEY`, see
``ptopt.formats.aoti_compile``) and into the sidecar; :func:`check_version` compares it with this torch
before any of the package's code is loaded. Loading a package runs its native code, so model
loaders ask for ``allow_pickle`` (trust in the file) first, as for a pickled module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError
from ptopt.formats.base import zip_names

#: the package metadata key holding the torch version that built it
VERSION_KEY = "ptopt_torch_version"
#: the model ``aoti_load_package(path)`` loads: the dynamic-batch one
DEFAULT_MODEL = "model"


def static_model_name(batch: int) -> str:
    """The name of a package's fixed-batch model for ``batch`` (``--static-batch``)."""
    return f"batch_{int(batch)}"


def static_model_batch(name: str) -> int | None:
    """The batch of a fixed-batch model's name (:func:`static_model_name`), None for any other name."""
    m = re.fullmatch(r"batch_(\d+)", name)
    return int(m.group(1)) if m else None


def package_models(path: str | os.PathLike) -> list[str]:
    """The model names inside a package (``model``, and ``batch_B`` for each fixed batch)."""
    try:
        with zipfile.ZipFile(path) as z:
            parts = (n.split("/") for n in z.namelist())
            return sorted({p[p.index("aotinductor") + 1] for p in parts if "aotinductor" in p[:-2]})
    except (OSError, zipfile.BadZipFile):
        return []


class FixedBatchDispatch:
    """A package loaded with its fixed-batch models: a call whose batch (dimension 0 of its first
    tensor) is one of theirs runs on that model, any other on the dynamic one. Everything else
    (``loader``, ``get_metadata``...) is the dynamic model's."""

    def __init__(self, default: Any, fixed: dict[int, Any]):
        self.default, self.fixed = default, fixed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.utils._pytree import tree_leaves

        first = next(
            (t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim()), None
        )
        model = self.fixed.get(int(first.shape[0]), self.default) if first is not None else self.default
        return model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "default" not in self.__dict__:  # copy/pickle probe before __init__
            raise AttributeError(name)
        return getattr(self.default, name)


def is_aoti_package(path: str | os.PathLike) -> bool:
    """Whether the zip at ``path`` is an AOTInductor package (holds ``data/aotinductor/``)."""
    return any("/data/aotinductor/" in "/" + n for n in zip_names(Path(path)))


def package_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The package's metadata (``AOTI_CPU_ISA``, ``AOTI_DEVICE_KEY``, ``ptopt_torch_version``...),
    read from the archive without loading its library; empty when it has none."""
    try:
        with zipfile.ZipFile(path) as z:
            for n in z.namelist():
                if n.endswith("wrapper_metadata.json"):
                    return {str(k): str(v) for k, v in json.loads(z.read(n)).items()}
    except (OSError, zipfile.BadZipFile, ValueError, AttributeError):
        pass
    return {}


def check_version(path: str | os.PathLike, recorded: str | None = None) -> None:
    """Refuse a package built by another torch: ModelLoadError naming both versions.

    ``recorded``: the sidecar's torch version, used when the package's metadata has none."""
    import torch

    built = package_metadata(path).get(VERSION_KEY) or recorded
    if built and built != torch.__version__:
        raise ModelLoadError(
            f"{Path(path).name}: AOTInductor package built by torch {built}, but this is torch "
            f"{torch.__version__}; a package runs only on the torch that compiled it: export it again "
            f"with this torch (ptopt export MODEL --target aoti)"
        )


#: the torch releases ptopt's AOTInductor loading is tested on. Under any other, each package is first
#: loaded in a child process (once per file), since a package can crash the whole process inside the loader:
#: on the GPU machine's torch 2.11.0+cu130 image (2026-11-27) every package whose library the image's
#: CXX=/opt/gcc/bin/g++ compiled died with SIGSEGV in ``aoti_load_package`` (and in the model-container
#: runner), CPU or CUDA; with the system g++ 13.3 they load (``benchmarks/probe_aoti_load.py``).
TESTED_TORCH = "2.13."
#: ``PTOPT_AOTI_LOAD_CHECK=1`` forces the child-process check, ``0`` turns it off
LOAD_CHECK_ENV = "PTOPT_AOTI_LOAD_CHECK"
#: what the child runs: the default model, then each fixed-batch model named after the device index
CHILD_LOAD = (
    "import sys, torch; from torch._inductor.package import load_package; p, i = sys.argv[1], int(sys.argv[2]); "
    "torch._inductor.aoti_load_package(p, device_index=i); [load_package(p, n, device_index=i) for n in sys.argv[3:]]"
)
#: the same with the model-container runner (``ptopt.formats.aoti_container``), tried when the first crashes
CHILD_LOAD_CONTAINER = (
    "import sys; from ptopt.formats.aoti_container import ContainerModel; p, d = sys.argv[1], sys.argv[2]; "
    "[ContainerModel(p, n, d) for n in sys.argv[3:]]"
)
CHILD_TIMEOUT_S = 300
#: ``PTOPT_AOTI_LOADER=package|container`` picks the loader (no child check); unset: torch's package loader,
#: or the container runner where the package loader crashed in the child check and the runner did not
LOADER_ENV = "PTOPT_AOTI_LOADER"
LOADERS = ("package", "container")
#: (path, size, mtime_ns, device index) -> the loader that loaded it cleanly in a child
_LOADS_SAFELY: dict[tuple[str, int, int, int], str] = {}


def _wants_child_check() -> bool:
    import torch

    flag = os.environ.get(LOAD_CHECK_ENV, "")
    return flag == "1" if flag in ("0", "1") else not torch.__version__.startswith(TESTED_TORCH)


#: the signals of a crash inside the loader (others, e.g. SIGKILL from the out-of-memory killer, are said as such)
CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGABRT", "SIGFPE")


def _signal_name(returncode: int) -> str | None:
    """The signal that ended a child (a negative exit code, or 128 + N from a shell wrapper); None: none."""
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if not number:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


def check_loads_in_child(path: str | os.PathLike, index: int) -> str:
    """The loader to open the package with (:data:`LOADERS`). Under an untested torch, the package is loaded
    in a child process first: a loader that crashes (a signal) or hangs becomes one ModelLoadError here
    instead of killing this process, unless the model-container runner loads it cleanly in a child (then
    ``container``). A child that merely raises is left to the real load, which raises the same error with
    its message. A clean load is remembered per file (path, size, modification time) and device index."""
    forced = os.environ.get(LOADER_ENV, "")
    if forced in LOADERS:
        return forced
    if not _wants_child_check():
        return "package"
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, index)
    if key in _LOADS_SAFELY:
        return _LOADS_SAFELY[key]
    fixed = [n for n in package_models(path) if static_model_batch(n) is not None]
    run = _child(CHILD_LOAD, path, [str(index), *fixed])
    sig = None if run is None else _signal_name(run.returncode)
    if run is not None and sig is None:
        if run.returncode == 0:
            _LOADS_SAFELY[key] = "package"
        return "package"
    device = "cpu" if index < 0 else f"cuda:{index}"
    second = (
        _child(CHILD_LOAD_CONTAINER, path, [device, DEFAULT_MODEL, *fixed]) if sig in CRASH_SIGNALS else None
    )
    if second is not None and second.returncode == 0:
        _LOADS_SAFELY[key] = "container"
        return "container"
    raise _load_failure(path, run, sig, second)


def _child(code: str, path: str | os.PathLike, args: list[str]) -> subprocess.CompletedProcess | None:
    """``code`` run on the package in a child process; None when it did not finish in time."""
    try:
        cmd = [sys.executable, "-c", code, str(path), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


def _last_line(run: subprocess.CompletedProcess) -> str:
    return (run.stderr.strip().splitlines() or [""])[-1][:200]


def _load_failure(
    path: str | os.PathLike, run: subprocess.CompletedProcess | None, sig: str | None, second: Any
) -> ModelLoadError:
    """One line for a package neither loader opens: what the package loader did (hang, crash, signal), and
    what the model-container runner did when it was tried."""
    import torch

    name, way_out = (
        Path(path).name,
        "use torch 2.13 (the release ptopt is tested on), or --target exported_program",
    )
    if run is None:
        return ModelLoadError(
            f"{name}: torch {torch.__version__}'s AOTInductor loader did not finish loading this package in "
            f"{CHILD_TIMEOUT_S} s (tried in a child process); {way_out}"
        )
    last = _last_line(run)
    why = (
        f"crashes with {sig} on this package (tried in a child process, so this one goes on): its library was "
        f"compiled with CXX={os.environ.get('CXX') or 'g++'}; on the GPU machine's torch 2.11 image, libraries "
        "built by its CXX=/opt/gcc/bin/g++ crashed this way on every package and the system g++ (13.3) made "
        "ones that load: export again with CXX=g++"
        if sig in CRASH_SIGNALS
        else f"was ended by {sig} while loading this package in a child process (out of memory?)"
    )
    also = ""
    if sig in CRASH_SIGNALS:
        other = "did not finish" if second is None else _signal_name(second.returncode) or _last_line(second)
        also = f"; its model-container runner, tried next, failed too ({other})"
    return ModelLoadError(
        f"{name}: torch {torch.__version__}'s AOTInductor loader (torch._inductor.aoti_load_package) {why}"
        f"{f' ({last})' if last else ''}{also}; {way_out}"
    )


def load_package(
    path: str | os.PathLike,
    recorded_version: str | None = None,
    device: str | None = None,
    single_threaded: bool = False,
) -> Any:
    """The package loaded with ``torch._inductor.aoti_load_package`` (callable like its source),
    after :func:`check_version`; with fixed-batch models in it (``--static-batch``), a
    :class:`FixedBatchDispatch` over all of them. A package runs on the device kind it was compiled for
    (``AOTI_DEVICE_KEY``): ``device`` (None: that kind) must match it (ModelLoadError otherwise);
    ``cuda:N`` loads it onto GPU N. ``single_threaded``: torch's ``run_single_threaded`` (no thread
    synchronization around each call: what a CUDA-graph capture needs; with it, torch 2.11's container
    calls fail inside a capture, ``operation not permitted when stream is capturing``)."""
    import torch

    check_version(path, recorded_version)
    check_container_types(path)
    built = package_device(path)
    device = built if device is None else str(device)
    wanted = device.split(":")[0]
    if built != wanted:
        raise ModelLoadError(
            f"{Path(path).name}: AOTInductor package compiled for {built}, asked to run on {device}: a "
            f"package runs only on the device kind it was compiled for; export it again with "
            f"--device {device} (ptopt export MODEL --target aoti --device {device})"
        )
    index = -1
    if wanted == "cuda":
        index = int(str(device).partition(":")[2] or torch.cuda.current_device())
    if check_loads_in_child(path, index) == "container":
        from ptopt.formats.aoti_container import ContainerModel

        where = "cpu" if index < 0 else f"cuda:{index}"
        load_model = lambda p, n, **_: ContainerModel(p, n, where, single_threaded)  # noqa: E731
    else:
        from torch._inductor.package import load_package as load_model
    how = dict(device_index=index, run_single_threaded=single_threaded)
    default = load_model(str(path), DEFAULT_MODEL, **how)
    batches = {n: static_model_batch(n) for n in package_models(path)}
    fixed_names = {n: b for n, b in batches.items() if b is not None}
    if not fixed_names:
        return default
    fixed = {b: load_model(str(path), n, **how) for n, b in fixed_names.items()}
    return FixedBatchDispatch(default, fixed)


def check_container_types(path: str | os.PathLike) -> None:
    """A package whose inputs or outputs are a library's container class (a Hugging Face model's
    ``SequenceClassifierOutput``) rebuilds them with torch's pytree at every call, which fails unless
    the class is registered (its module imported): transformers' classes are registered here, before
    loading, from the call spec the generated wrapper code holds; any other class is one line now
    rather than a failure inside every call."""
    from ptopt.formats.exported_program import ensure_container_types, unregistered_note

    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
            texts = [z.read(n).decode("utf-8", "replace") for n in names]
    except (OSError, zipfile.BadZipFile):
        return
    missing = ensure_container_types(Path(path), texts)
    if missing:
        raise ModelLoadError(f"{Path(path).name}: its calls cannot run{unregistered_note(missing)}")


def package_device(path: str | os.PathLike) -> str:
    """The device kind a package was compiled for (``cpu`` or ``cuda``; ``cpu`` when unrecorded)."""
    return package_metadata(path).get("AOTI_DEVICE_KEY", "cpu") or "cpu"
