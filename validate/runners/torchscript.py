"""TorchScript archives, loaded with ``torch.jit.load`` and run by the TorchScript interpreter,
as TorchServe or a C++ libtorch server would run them. The profiling executor optimizes after the
first calls, which the latency warm-up absorbs."""

from __future__ import annotations

from typing import Any

from ptopt.validate.runners.base import TorchModuleRunner, sidecar_batch_range

FORMATS = ("torchscript",)


class TorchScriptRunner(TorchModuleRunner):
    @classmethod
    def create(cls, name: str, loaded: Any) -> TorchScriptRunner:
        return cls.from_loaded(name, loaded, "torch.jit", sidecar_batch_range(loaded))
