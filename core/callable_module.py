"""Make a stage package callable, so ``ptopt.export(...)`` and ``ptopt.validate(...)`` work while
``ptopt.export`` stays the package that holds the targets."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


def make_callable(module_name: str, target: str) -> None:
    """Calling module ``module_name`` calls ``target`` ("pkg.mod:function"), imported on first call."""

    class _CallableModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            mod, _, fn = target.partition(":")
            return getattr(importlib.import_module(mod), fn)(*args, **kwargs)

    sys.modules[module_name].__class__ = _CallableModule
