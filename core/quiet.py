"""Upstream noise stops at ptopt's boundary: the one helper that silences a library's loggers,
warnings and (optionally) its prints while ptopt calls it and reports the outcome itself."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def silenced(loggers: Iterable[str], *, streams: bool = False, level: int = logging.ERROR) -> Iterator[None]:
    """Raise ``loggers`` to ``level``, ignore warnings and, with ``streams``, swallow stdout/stderr
    for the block; every logger gets its own level back afterwards."""
    saved = [(lg, lg.level) for lg in map(logging.getLogger, loggers)]
    sink = io.StringIO()
    try:
        for lg, _ in saved:
            lg.setLevel(level)
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            warnings.simplefilter("ignore")
            if streams:
                stack.enter_context(contextlib.redirect_stdout(sink))
                stack.enter_context(contextlib.redirect_stderr(sink))
            yield
    finally:
        for lg, lv in saved:
            lg.setLevel(lv)
