"""The technique table: ``(mode, engine) -> handler``, one row per way of making an int8 model.

torchao's ``register_quantize_module_handler`` idea: a handler file under
``ptopt.compress.quantize.techniques`` registers its row with :func:`register_technique`, and
every reader takes the table from here: the configs' validation (is there a row for this mode and
engine?), the flow (``flow.quantize_prepared`` calls the row's handler, ``flow.judged`` applies its
gates), and ``ptopt quantize --mode/--engine`` (its choices are :func:`modes` and :func:`engines`).
A new technique is its config (``config.py``), its handler file, and the row its decorator adds.

The handler files are imported here the first time the table is read; they import their engine
(torch.ao, torchao) only when a handler runs, so reading the table imports no torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from ptopt.core.errors import UsageError

#: the engine a config runs on unless it says otherwise (listed first)
DEFAULT_ENGINE = "fx"
#: an engine that runs other engines' rows and keeps one of them (listed last)
CHOOSER = "auto"


@dataclasses.dataclass(frozen=True)
class Technique:
    """One row: ``config`` (the config class, whose ``mode`` the row is for) run by ``engine``.
    ``handler(config, prep, progress) -> base.Quantized`` makes the int8 artifact.

    - ``check(config)``: refuses (UsageError) options this row cannot run; no torch, no engine.
    - ``requires(config)``: what this machine must offer, checked before any data is loaded.
    - ``gated``: post-training (the int8 model must hold the parity rule against fp32, else
      ParityError with ``advise(config, prep)``'s advice); training techniques are recorded only.
    - ``min_int8_share``: refused below this share of int8 parameters (the file would be fp32-sized).
    - ``captures(config, prep)``: whether this row takes a model another engine could not trace
      (tried for real); ``captures_hint`` is what the refusal then adds.
    - ``tracer``: what captures the model's graph (``torch.fx``, ``torch.export``), for messages.
    - ``candidate(config, prep)``: the eager int8 module alone (no artifact, no measuring): what
      accuracy-aware search quantizes its candidates with (None: the search does not run there).
    - ``flow(config, model, output, **options)``: the whole stage, for rows whose models and data are
      not the tensor models of ``flow.py`` (language models: text data, perplexity, a folder
      artifact); ``quantize`` hands such a row everything and returns its Result.
    """

    config: type
    engine: str
    handler: Callable[..., Any]
    help: str = ""
    check: Callable[[Any], None] | None = None
    requires: Callable[[Any], None] | None = None
    gated: bool = True
    min_int8_share: float = 0.0
    advise: Callable[[Any, Any], str] | None = None
    captures: Callable[[Any, Any], bool] | None = None
    captures_hint: str = ""
    tracer: str = ""
    candidate: Callable[[Any, Any], Any] | None = None
    flow: Callable[..., Any] | None = None

    @property
    def mode(self) -> str:
        return self.config.mode


#: (mode, engine) -> Technique, filled by the handler files
TECHNIQUES: dict[tuple[str, str], Technique] = {}
_loaded = False


def register_technique(config: type, engine: str, **fields: Any) -> Callable[[Callable], Callable]:
    """Decorator of a handler: the row of ``config`` (a config class; the row is for its ``mode``)
    run by ``engine`` (``fields``: the other Technique fields)."""

    def deco(handler: Callable) -> Callable:
        key = (config.mode, engine)
        old = TECHNIQUES.get(key)
        if old is not None and old.handler.__qualname__ != handler.__qualname__:
            raise RuntimeError(f"quantization technique {key!r} registered twice")
        TECHNIQUES[key] = Technique(config, engine, handler, **fields)
        return handler

    return deco


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


def suggest_other_engine(config: Any, prep: Any, err: Exception) -> Exception:
    """``err`` (the model cannot be traced by ``config.engine``), naming another engine of the same
    mode that captures the model (tried, so the suggestion is one that runs); else ``err``."""
    for row in table().values():
        if row.mode != config.mode or row.engine == config.engine or row.captures is None:
            continue
        try:
            config.replace(engine=row.engine)
        except UsageError:  # the config's options do not run there
            continue
        if row.captures(config, prep):
            return type(err)(f"{str(err).rstrip('.')}. {row.captures_hint}")
    return err
