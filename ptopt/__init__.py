"""ptopt: compress, export, validate and package PyTorch models, with numbers for every artifact.

Every CLI command has a Python twin, imported lazily (``import ptopt`` does not import torch)::

    ptopt.quantize(...)   ptopt.prune(...)    ptopt.distill(...)   ptopt.export(...)
    ptopt.validate(...)   ptopt.package(...)  ptopt.inspect(...)   ptopt.doctor()
    ptopt.load_model(...) ptopt.load_data(...) ptopt.Artifact      ptopt.InputSpec    ptopt.Result

``ptopt.export`` and ``ptopt.validate`` are the stage packages and are callable themselves. The names
come from the one command table, ``ptopt.commands``.
"""

from __future__ import annotations

import importlib
from typing import Any

from ptopt import _schemes as _schemes  # registers SCHEME:NAME loaders (zoo:) with core; imports no stage
from ptopt import formats as formats  # registers every artifact format's row with core's table
from ptopt.commands import lazy_api

__version__ = "0.1.0"

#: name -> "module:attribute" (a bare module name means the module itself), from the command table
_LAZY = lazy_api()

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'ptopt' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
