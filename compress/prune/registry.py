"""The pruners as they are registered: config class -> pruner class, filled by the files of
``ptopt.compress.prune.techniques`` (``@register_pruner``). It loads nothing; ``table`` is the reader
that loads every file first, so no import loop runs through the folder the table walks."""

from __future__ import annotations

from collections.abc import Callable

#: config class -> pruner class
PRUNERS: dict[type, type] = {}


def register_pruner(config_cls: type) -> Callable[[type], type]:
    """Class decorator: the pruner for ``config_cls`` (whose ``method`` names the row)."""

    def deco(cls: type) -> type:
        old = PRUNERS.get(config_cls)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise RuntimeError(f"pruning method {config_cls.method!r} registered twice")
        PRUNERS[config_cls] = cls
        return cls

    return deco
