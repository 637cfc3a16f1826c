"""AOTInductor packages (``.pt2`` whose sidecar format is ``aoti_package``), loaded with
``torch._inductor.aoti_load_package`` and run as compiled native code on the CPU, the way a
deployment runs them (Python, or the C++ runtime without Python).

A package was compiled for the batch range of its InputSpecs (a ``Dim``'s [min, max]); the generated
code checks every call against it, so the accepted batch sizes are the sidecar's [min, max]. Loading
a package runs its native code: ``ptopt validate`` asks for ``--allow-pickle`` (see
``ptopt.core.modelref``), and a package built by another torch is refused before it loads.
"""

from __future__ import annotations

from typing import Any

from ptopt.validate.runners.base import TorchModuleRunner

FORMATS = ("aoti_package",)


class AotiRunner(TorchModuleRunner):
    @classmethod
    def create(cls, name: str, loaded: Any) -> AotiRunner:
        runner = cls.from_loaded(name, loaded, "AOTInductor", package_batch_range(loaded))
        art = loaded.artifact
        if art is not None:
            runner.info.update(
                {k: art.extra[k] for k in ("cpu_isa", "compile_seconds", "torch_version") if k in art.extra}
            )
        return runner


def package_batch_range(loaded: Any) -> tuple[int, int] | None:
    """(min, max) batch of the first input as compiled (the sidecar's spec); None without a sidecar."""
    art = loaded.artifact
    if art and art.inputs and art.inputs[0].min_shape:
        s = art.inputs[0]
        return (s.min_shape[0], s.max_shape[0])
    return None
