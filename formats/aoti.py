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
import zipfile
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, UnsafePickleError, UsageError
from ptopt.formats.base import Format, loaded_model, zip_names
from ptopt.formats.runner import TorchModuleRunner

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


def load_package(
    path: str | os.PathLike, recorded_version: str | None = None, device: str | None = None
) -> Any:
    """The package loaded with ``torch._inductor.aoti_load_package`` (callable like its source),
    after :func:`check_version`; with fixed-batch models in it (``--static-batch``), a
    :class:`FixedBatchDispatch` over all of them. A package runs on the device kind it was compiled for
    (``AOTI_DEVICE_KEY``): ``device`` (None: that kind) must match it (ModelLoadError otherwise);
    ``cuda:N`` loads it onto GPU N."""
    import torch

    check_version(path, recorded_version)
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
    default = torch._inductor.aoti_load_package(str(path), device_index=index)
    batches = {n: static_model_batch(n) for n in package_models(path)}
    fixed_names = {n: b for n, b in batches.items() if b is not None}
    if not fixed_names:
        return default
    from torch._inductor.package import load_package as load_model

    fixed = {b: load_model(str(path), n, device_index=index) for n, b in fixed_names.items()}
    return FixedBatchDispatch(default, fixed)


def package_device(path: str | os.PathLike) -> str:
    """The device kind a package was compiled for (``cpu`` or ``cuda``; ``cpu`` when unrecorded)."""
    return package_metadata(path).get("AOTI_DEVICE_KEY", "cpu") or "cpu"


class AotiPackage(Format):
    name = "aoti_package"
    label = "AOTInductor package"
    suffixes = (".pt2",)
    target = "aoti"
    runtime_label = "aoti"
    converts = ("fp16", "bf16")
    servers = ("torchserve", "triton")
    triton_platform = "torch_aoti"
    reexportable = False
    trusted_load = True
    write_options = frozenset({"inductor_configs", "cuda_graphs", "static_batches"})
    sniff_rank = 5
    target_order = 50

    def sniff(self, path: Path) -> bool:
        return is_aoti_package(path)

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        """Its native code runs when it loads: only with ``allow_pickle``."""
        if not allow_pickle:
            raise UnsafePickleError(
                f"{path}: refusing to load: it is an AOTInductor package (compiled native code that runs "
                f"when it is loaded). Pass --allow-pickle (allow_pickle=True) only if you trust where it "
                f"came from"
            )
        try:
            module = load_package(path, art.extra.get("torch_version") if art else None)
        except ModelLoadError:
            raise
        except Exception as e:  # noqa: BLE001 - the package loader raises RuntimeError/OSError/...
            raise ModelLoadError(
                f"{path}: not a loadable AOTInductor package: {str(e).splitlines()[0]}"
            ) from None
        return loaded_model(path, self.name, module, path, art)

    def write(self, module: Any, path: Path, **kw: Any) -> dict[str, Any]:
        from ptopt.formats.aoti_compile import write_aoti

        return write_aoti(module, path, **kw)

    def reload(self, path: Path, *, style: str = "positional", device: str = "cpu", **kw: Any) -> Any:
        check_version(path)  # before any of its native code loads: a clear line naming both versions
        model = load_aoti(path, device=device)
        if kw.get("cuda_graphs") and device.startswith("cuda"):
            from ptopt.core.cudagraph import CudaGraphed

            model = CudaGraphed(model, device)
        return model

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        runner = AotiRunner.from_loaded(name, loaded, "AOTInductor", package_batch_range(loaded))
        art = loaded.artifact
        if art is not None:
            keys = ("cpu_isa", "compile_seconds", "torch_version", "cuda_graphs")
            runner.info.update({k: art.extra[k] for k in keys if k in art.extra})
        return runner

    def check_config(self, config: Any) -> None:
        super().check_config(config)
        if config.cuda_graphs and not config.on_cuda:
            raise UsageError(
                "--cuda-graphs needs --target aoti --device cuda: CUDA graphs replay GPU kernel launches, "
                f"and this export is on {config.device or 'cpu'}"
            )

    def export_options(self, source: Any, config: Any, calib: Any, **kw: Any) -> tuple[dict, None]:
        options = {"static_batches": config.static_batches} if config.static_batches else {}
        return ({"cuda_graphs": True} if config.cuda_graphs else {}) | options, None


FORMAT = AotiPackage()


def load_aoti(path: str | os.PathLike, recorded_version: str | None = None, device: str = "cpu") -> Any:
    """The package at ``path`` loaded with ``torch._inductor.aoti_load_package`` (callable like its
    source; on ``cuda:N`` onto that GPU), after the torch version check (:func:`check_version`)."""
    from ptopt.formats.capture import quiet_export

    with quiet_export():
        return load_package(path, recorded_version, device=device)


class AotiRunner(TorchModuleRunner):
    """A package run as compiled native code, the way a deployment runs it (Python, or the C++
    runtime without Python). It runs only on the device kind it was compiled for (``--device`` must
    match it); a CUDA package exported with ``--cuda-graphs`` is replayed through CUDA graphs
    (``ptopt.core.cudagraph``), one capture per batch size. A package was compiled for the batch range
    of its InputSpecs; the generated code checks every call against it."""

    def place(self, device: str) -> None:
        """Reload the package onto ``device`` (a CPU package on the CPU stays as loaded)."""
        if device == "cpu" and (self.path is None or package_device(self.path) == "cpu"):
            return
        self.module = self._move(device)
        self.device = device

    def _move(self, device: str) -> Any:
        from ptopt.core.artifact import Artifact

        art = Artifact.maybe_load(self.path) if self.path else None
        # a package is compiled for one device kind: load_package refuses another, naming both
        module = load_package(self.path, art.extra.get("torch_version") if art else None, device=device)
        if self.info.get("cuda_graphs") and device.startswith("cuda"):
            from ptopt.core.cudagraph import CudaGraphed

            module = CudaGraphed(module, device)
            self.runtime = "AOTInductor (CUDA graphs)"
        return module


def package_batch_range(loaded: Any) -> tuple[int, int] | None:
    """(min, max) batch of the first input as compiled (the sidecar's spec); None without a sidecar."""
    art = loaded.artifact
    if art and art.inputs and art.inputs[0].min_shape:
        s = art.inputs[0]
        return (s.min_shape[0], s.max_shape[0])
    return None
