"""The technique table: ``(mode, engine) -> handler``, one row per way of making an int8 model.

torchao's ``register_quantize_module_handler`` idea: a handler file under
``ptopt.compress.quantize.techniques`` registers its row with ``registry.register_technique``, and every
reader outside those files takes the table from here (loading every row first): the configs' validation
(is there a row for this mode and engine?), the flow (``flow.quantize_prepared`` calls the row's handler,
``flow.judged`` applies its gates), and ``ptopt quantize --mode/--engine`` (its choices are :func:`modes`
and :func:`engines`). A new technique is its config (``config.py``), its handler file, and the row its
decorator adds.

The handler files are imported here the first time the table is read; they import their engine (torch.ao,
torchao) only when a handler runs, so reading the table imports no torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ptopt.compress.quantize.config import DEFAULT_ENGINE
from ptopt.compress.quantize.registry import CHOOSER, TECHNIQUES, Technique
from ptopt.core.errors import UsageError

_loaded = False


def table() -> dict[tuple[str, str], Technique]:
    """Every row (the handler files imported on first use)."""
    global _loaded
    if not _loaded:
        _loaded = True  # before importing: a handler file's own imports may read the table
        from ptopt.compress.quantize import techniques

        for info in sorted(pkgutil.iter_modules(techniques.__path__), key=lambda i: i.name):
            importlib.import_module(f"{techniques.__name__}.{info.name}")
    return TECHNIQUES


def modes() -> list[str]:
    """The modes of the table, in the order their configs ask for (``order``)."""
    order = {row.mode: getattr(row.config, "order", 0) for row in table().values()}
    return sorted(order, key=lambda m: (order[m], m))


def engines() -> list[str]:
    """The engines of the table: the default first, the chooser (``auto``) last."""
    have = {e for _, e in table()}
    return sorted(have, key=lambda e: (e != DEFAULT_ENGINE, e == CHOOSER, e))


def modes_of(engine: str) -> list[str]:
    return [m for m in modes() if (m, engine) in table()]


def engines_of(mode: str) -> list[str]:
    return [e for e in engines() if (mode, e) in table()]


def technique(mode: str, engine: str) -> Technique:
    """The row of ``(mode, engine)``; UsageError naming what exists otherwise."""
    rows = table()
    if engine not in engines():
        raise UsageError(f"unknown engine {engine!r} (choose from {', '.join(engines())})")
    if mode not in modes():
        raise UsageError(f"unknown mode {mode!r} (known: {', '.join(modes())})")
    row = rows.get((mode, engine))
    if row is None:
        others = engines_of(mode)
        default = " (the default)" if others == [DEFAULT_ENGINE] else ""
        raise UsageError(
            f"--engine {engine} does {' and '.join(modes_of(engine))} int8; --mode {mode} runs on "
            f"--engine {' or '.join(others)}{default}"
        )
    return row


def check_config(config: Any) -> None:
    """A config's engine check (its ``__post_init__`` calls this): a row for its mode and engine
    exists, and the row takes the config's options."""
    row = technique(config.mode, config.engine)
    if row.check is not None:
        row.check(config)
