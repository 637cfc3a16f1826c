"""The technique rows as they are registered: ``(mode, engine) -> Technique``, filled by the handler
files of ``ptopt.compress.quantize.techniques`` (``@register_technique``). This module loads nothing:
the handler files and what they import read the rows here (they are loaded by then: a handler runs
only after ``ptopt.compress.quantize.table`` loaded every row), and ``table`` is the one reader that
loads them, so no import loop runs through the folder the table walks.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from ptopt.compress.quantize.config import DEFAULT_ENGINE
from ptopt.core.errors import UsageError

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


def engines_loaded(mode: str) -> list[str]:
    """The engines of the rows of ``mode`` registered so far: the default first, the chooser last."""
    have = {e for m, e in TECHNIQUES if m == mode}
    return sorted(have, key=lambda e: (e != DEFAULT_ENGINE, e == CHOOSER, e))


def check_row(config: Any) -> None:
    """The row of ``config``'s mode and engine (registered) takes its options; UsageError otherwise."""
    row = TECHNIQUES.get((config.mode, config.engine))
    if row is None:
        raise UsageError(f"--engine {config.engine} does not run --mode {config.mode}")
    if row.check is not None:
        row.check(config)


#: off while a chooser (``--engine auto``) tries the engines itself (:func:`choosing`)
_SUGGEST = contextvars.ContextVar("ptopt_suggest_other_engine", default=True)


@contextlib.contextmanager
def choosing() -> Iterator[None]:
    """Within it an engine's refusal names no other engine: the chooser tries them itself (and
    probing whether torch.export captures the model would capture it twice)."""
    token = _SUGGEST.set(False)
    try:
        yield
    finally:
        _SUGGEST.reset(token)


def suggest_other_engine(config: Any, prep: Any, err: Exception) -> Exception:
    """``err`` (the model cannot be traced by ``config.engine``), naming another engine of the same
    mode that captures the model (tried, so the suggestion is one that runs); else ``err``."""
    if not _SUGGEST.get():
        return err
    for row in TECHNIQUES.values():
        if row.mode != config.mode or row.engine == config.engine or row.captures is None:
            continue
        try:
            check_row(config.replace(engine=row.engine))
        except UsageError:  # the config's options do not run there
            continue
        if row.captures(config, prep):
            return type(err)(f"{str(err).rstrip('.')}. {row.captures_hint}")
    return err
