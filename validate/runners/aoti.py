"""AOTInductor packages (``.pt2`` whose sidecar format is ``aoti_package``), loaded with
``torch._inductor.aoti_load_package`` and run as compiled native code, the way a deployment runs
them (Python, or the C++ runtime without Python). A package runs only on the device kind it was
compiled for (``--device`` must match it); a CUDA package exported with ``--cuda-graphs`` is replayed
through CUDA graphs (``ptopt.core.cudagraph``), one capture per batch size.

A package was compiled for the batch range of its InputSpecs (a ``Dim``'s [min, max]); the generated
code checks every call against it, so the accepted batch sizes are the sidecar's [min, max]. Loading
a package runs its native code: ``ptopt validate`` asks for ``--allow-pickle`` (see
``ptopt.core.modelref``), and a package built by another torch is refused before it loads.
"""

from __future__ import annotations

from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.validate.runners.base import TorchModuleRunner

FORMATS = ("aoti_package",)


class AotiRunner(TorchModuleRunner):
    @classmethod
    def create(cls, name: str, loaded: Any) -> AotiRunner:
        runner = cls.from_loaded(name, loaded, "AOTInductor", package_batch_range(loaded))
        art = loaded.artifact
        if art is not None:
            keys = ("cpu_isa", "compile_seconds", "torch_version", "cuda_graphs")
            runner.info.update({k: art.extra[k] for k in keys if k in art.extra})
        return runner

    def place(self, device: str) -> None:
        """Reload the package onto ``device`` (a CPU package on the CPU stays as loaded)."""
        from ptopt.core.aoti import package_device

        if device == "cpu" and (self.path is None or package_device(self.path) == "cpu"):
            return
        self.module = self._move(device)
        self.device = device

    def _move(self, device: str) -> Any:
        from ptopt.core.aoti import load_package

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
