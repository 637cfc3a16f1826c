"""AOTInductor packages (``.pt2`` holding ``data/aotinductor/``): the format's row, its loader and
its validate runner. The package's file facts (metadata, torch version, fixed-batch models) are
``ptopt.formats.aoti_files``; compiling one is ``ptopt.formats.aoti_compile``.

A package runs only on the torch that compiled it and on the device kind it was compiled for;
loading one runs its native code, so model loaders ask for ``allow_pickle`` (trust in the file)
first, as for a pickled module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, UnsafePickleError, UsageError
from ptopt.formats.aoti_files import check_version, is_aoti_package, load_package, package_device
from ptopt.formats.base import Format, loaded_model
from ptopt.formats.runner import TorchModuleRunner


class AotiPackage(Format):
    name = "aoti_package"
    label = "AOTInductor package"
    suffixes = (".pt2",)
    target = "aoti"
    runtime_label = "aoti"
    converts = ("fp16", "bf16")
    servers = ("torchserve", "triton", "ray")
    triton_platform = "torch_aoti"
    reexportable = False
    trusted_load = True
    write_options = frozenset({"inductor_configs", "cuda_graphs", "static_batches"})
    #: the library calls inside the package follow the caps; the kernels Inductor generated were compiled
    #: for one vector ISA when the package was built (``extra["vec_isa"]``) and never change
    isa_libraries = ("onednn", "mkl", "fbgemm", "inductor")
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
        graphs = bool(kw.get("cuda_graphs")) and device.startswith("cuda")
        model = load_aoti(path, device=device, graphs=graphs)
        if graphs:
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


def load_aoti(
    path: str | os.PathLike, recorded_version: str | None = None, device: str = "cpu", graphs: bool = False
) -> Any:
    """The package at ``path`` loaded with ``torch._inductor.aoti_load_package`` (callable like its
    source; on ``cuda:N`` onto that GPU), after the torch version check (:func:`check_version`)."""
    from ptopt.formats.capture import quiet_export

    with quiet_export():
        return load_package(path, recorded_version, device=device, single_threaded=graphs)


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
        graphs = bool(self.info.get("cuda_graphs")) and device.startswith("cuda")
        version = art.extra.get("torch_version") if art else None
        module = load_package(self.path, version, device=device, single_threaded=graphs)
        if graphs:
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
