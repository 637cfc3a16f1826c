"""The one rule every search of ptopt picks its answer by: the fastest candidate within the budget,
and when none is, the one closest to it.

``ptopt optimize`` (its artifacts, timed interleaved at the largest batch size, and its language-model
candidates by decode speed), ``quantize --engine auto`` (each engine's int8 model), accuracy-aware
quantization (its candidates, and its engine choice) all call :func:`fastest_within` and
:func:`closest`, so "faster within the budget, ties to the smaller" means one thing. A search whose
timings are short says how close two latencies must be to tie (``tie``); the tie goes to ``tiebreak``
(the smaller file, fewer float multiply-accumulates). Each search measures its own candidates
(``core.timing.measure_interleaved``) and says why it chose.
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
    tie: float = 0.0,
) -> tuple[T | None, bool]:
    """(the fastest candidate within the budget, True); (None, False) when none is within it.
    A candidate without a latency counts as slowest; ``tiebreak`` orders latencies that tie: equal
    ones, or with ``tie`` > 0 those within that fraction of the fastest (a short timing on a shared
    CPU is good to about 10 %), then the faster."""

    def ms(c: T) -> float:
        value = latency(c)
        return float("inf") if value is None else value

    def key(c: T) -> tuple[Any, float]:
        return (tiebreak(c) if tiebreak is not None else 0, ms(c))

    ok = [c for c in candidates if within(c)]
    if not ok:
        return None, False
    fastest = min(ms(c) for c in ok)
    near = [c for c in ok if ms(c) <= fastest * (1 + tie)] if tie > 0 else [c for c in ok if ms(c) == fastest]
    return min(near, key=key), True


def closest(
    candidates: Iterable[T], error: Callable[[T], Any], latency: Callable[[T], float | None]
) -> T | None:
    """When no candidate is within the budget: the one closest to it (smallest ``error``), the faster of
    equals; None without candidates."""

    def key(c: T) -> tuple[Any, float]:
        value = latency(c)
        return error(c), float("inf") if value is None else value

    return min(candidates, key=key, default=None)
