"""``ptopt validate --compile``: an eager or ExportedProgram model also run through ``torch.compile``
(Inductor, on the CPU), as one more row a user can compare, e.g. ``fp32 eager (torch.compile)``.

The compiled row is the same model in another runtime: the accuracy pass and the latency benchmark
treat it as an artifact. Compiling happens on the first call (and once more at a new batch size:
dynamo specializes sizes 0/1 and marks the batch dynamic at the second size it sees), so
:meth:`CompiledRunner.prepare` makes that first call at the opt batch and records its seconds as
``compile_seconds``; the timed iterations come after the latency benchmark's warm-up, never
including compilation. Inductor's CPU backend compiles C++: without a working compiler,
:func:`check_compiler` refuses ``--compile`` in one line before anything runs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ptopt.core.formats import formats
from ptopt.formats.runner import TorchModuleRunner

#: formats whose model is a Python-callable graph torch.compile can take
COMPILABLE_FORMATS = tuple(f.name for f in formats() if f.compilable)
SUFFIX = " (torch.compile)"


@dataclasses.dataclass(frozen=True)
class CompiledRef:
    """A model reference to run through ``torch.compile`` (``base``: what ``open_runner`` opens; ``mode``:
    torch.compile's, e.g. ``reduce-overhead`` for CUDA graphs; None: its default)."""

    base: Any
    mode: str | None = None

    def __str__(self) -> str:
        return f"{getattr(self.base, 'ref', self.base)}{SUFFIX}"


def check_compiler() -> str:
    """The C++ compiler Inductor's CPU backend uses, or MissingDependencyError naming what to install."""
    from ptopt.formats.aoti_compile import check_compiler as compiler

    return compiler("--compile: torch.compile (Inductor)")


class CompiledRunner(TorchModuleRunner):
    """The base runner's module behind ``torch.compile``; ``info["compile_seconds"]`` after prepare."""

    #: torch.compile's mode (None: its default)
    mode = None

    @classmethod
    def wrap(cls, base: TorchModuleRunner, name: str, mode: str | None = None) -> CompiledRunner:
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        fields.update(
            name=name, runtime=f"{base.runtime} + torch.compile (inductor{f', {mode}' if mode else ''})"
        )
        fields["info"] = dict(
            base.info, compiled_from=base.format, **({"compile_mode": mode} if mode else {})
        )
        runner = cls(**fields)
        runner.mode = mode
        return runner

    def prepare(self, threads: int) -> None:
        import torch

        from ptopt.core.inputspec import make_inputs

        super().prepare(threads)
        self.module = torch.compile(self.module, mode=self.mode)
        started = time.perf_counter()
        if self.input_specs:  # compile now, at the opt batch, so the seconds are compile time
            self.call(make_inputs(self.input_specs, self.input_style, which="opt"))
        self.info["compile_seconds"] = round(time.perf_counter() - started, 2)
