"""Eager PyTorch modules: pickled ``nn.Module`` files (``--allow-pickle``) and MODEL references
(``zoo:resnet``, ``pkg.mod:factory [--weights W]``), run in eager mode on the CPU — how a model is
deployed behind a plain Python server."""

from __future__ import annotations

from typing import Any

from ptopt.validate.runners.base import TorchModuleRunner

FORMATS = ("eager", "pickle")


class EagerRunner(TorchModuleRunner):
    @classmethod
    def create(cls, name: str, loaded: Any) -> EagerRunner:
        runtime = "torch eager" + (" (pickled module)" if loaded.format == "pickle" else "")
        return cls.from_loaded(name, loaded, runtime)
