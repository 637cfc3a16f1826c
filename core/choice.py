"""The one rule every search of ptopt picks its answer by: the fastest candidate within the budget.

``ptopt optimize`` (its artifacts, timed interleaved at the largest batch size), ``quantize --engine
auto`` (each engine's int8 model) and the accuracy-aware search's engine choice all call
:func:`fastest_within`, so "faster within the budget, ties to the smaller" means one thing. Each
search measures its own candidates (``core.timing.measure_interleaved``) and says why it chose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def fastest_within(
    candidates: Iterable[T],
    latency: Callable[[T], float | None],
    within: Callable[[T], bool],
    tiebreak: Callable[[T], Any] | None = None,
) -> tuple[T | None, bool]:
    """(the fastest candidate within the budget, True); (None, False) when none is within it.
    A candidate without a latency counts as slowest; ``tiebreak`` orders equal latencies (e.g. the
    smaller file)."""

    def key(c: T) -> tuple[float, Any]:
        ms = latency(c)
        return (float("inf") if ms is None else ms, tiebreak(c) if tiebreak is not None else 0)

    ok = [c for c in candidates if within(c)]
    return (min(ok, key=key), True) if ok else (None, False)
