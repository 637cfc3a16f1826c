"""ptopt.serve: packaging (``ptopt.package``) and the servers behind ``ptopt serve``.

Its modules load on first use, so ``import ptopt`` then ``ptopt.serve.ray_server.RayServer(...)`` or
``ptopt.serve.server.TorchServeServer(...)`` works as docs/serve.md writes it (without importing Ray,
TorchServe's client or torch up front)."""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = (
    "engines", "handler", "oip", "package", "prepare", "ray_app", "ray_config", "ray_package",
    "ray_server", "runtime", "server", "triton",
)  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
