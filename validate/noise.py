"""The timing-noise rule, defined once for validate (its tables and latency gates) and optimize (its
search and its tables).

Every latency is the median of interleaved timing rounds; its *spread* is the interquartile range of
the round medians in % of their median (``round_spread_pct`` in validate's latency entries,
``spread_pct`` in optimize's). Two tests read it:

1. **A noisy latency** (:func:`latency_noisy`): its rounds spread more than :data:`NOISY_SPREAD_PCT`.
   The machine drifted while it was timed; every report marks it (``~``, the reports' ``NOISY_MARK``)
   and says so in a footnote.
2. **A figure within the noise** (:func:`within_noise`): its distance from a threshold, in % of the
   threshold, is no larger than the combined spread (:func:`combined_spread`: the root of the sum of
   squares of the spreads of the latencies it comes from). The measurement cannot say on which side of
   the threshold the truth is. Validate's latency gates call such a result inconclusive (exit 4);
   optimize marks a speedup within the noise of 1.0 (:func:`speedup_noisy`: no faster or slower than
   the reference, as far as the timing can tell), since the ranking there is not to be trusted.
"""

from __future__ import annotations

from typing import Any

#: a latency whose timing rounds spread more than this (% of their median) is noisy (rule 1)
NOISY_SPREAD_PCT = 25.0


def latency_noisy(spread_pct: float | None) -> bool:
    """Rule 1: the timing rounds of one latency spread more than ``NOISY_SPREAD_PCT``."""
    return (spread_pct or 0.0) > NOISY_SPREAD_PCT


def combined_spread(*spreads: float | None) -> float | None:
    """The spread (%) of a figure made of several latencies (a ratio, a comparison): the root of the
    sum of squares of theirs; None when none of them has one."""
    known = [float(s) for s in spreads if s is not None]
    return None if not known else sum(s * s for s in known) ** 0.5


def within_noise(value: float, threshold: float, spread_pct: float | None) -> bool:
    """Rule 2: ``value``'s distance to ``threshold`` (in % of the threshold) is no larger than the
    timing spread: the measurement cannot say on which side of the threshold the truth is."""
    if spread_pct is None or threshold == 0:
        return False
    return 100.0 * abs(value - threshold) / abs(threshold) <= spread_pct


def speedup_noisy(speedup: float, *spreads: float | None) -> bool:
    """Rule 2 for a speedup over the reference: within the combined spread of the latencies it divides
    (the candidate's and the reference's) of 1.0."""
    return within_noise(speedup, 1.0, combined_spread(*spreads))


# -- one verdict per timed cell; a busy machine -------------------------------------------------------

#: a run whose timed (model, batch size) cells are noisy in more than this share is on a busy machine
BUSY_SHARE = 0.5
#: validate times a busy run again, all of it, at most this many more times (each costs as much as the
#: first timing), and keeps the attempt with the fewest noisy cells
BUSY_RETIMES = 1


def verdict(spread_pct: float | None) -> str:
    """The one verdict of a timed cell, from rule 1: ``"noisy"`` or ``"stable"``. The early stop of a
    cell's rounds (``validate.latency.median_stable``) asks the same rule, so a cell that stopped early
    is never reported noisy."""
    return "noisy" if latency_noisy(spread_pct) else "stable"


def noisy_cells(latencies: list[dict]) -> tuple[int, int]:
    """(noisy, timed) cells over ``[{batch size: stats}]`` (skipped batch sizes are not cells)."""
    cells = [st for lat in latencies for st in lat.values() if "p50_ms" in st]
    return sum(1 for st in cells if latency_noisy(st.get("round_spread_pct"))), len(cells)


def busy(noisy: int, cells: int) -> bool:
    """Most cells noisy: the machine was busy, not one model."""
    return cells > 0 and noisy > BUSY_SHARE * cells


def clear_lead(best: dict | None, runner_up: dict | None) -> str | None:
    """Why the fastest cell ``best`` cannot be called faster than ``runner_up`` (latency stats at the
    ranking batch size), or None when it can: noisy itself, or its lead within the combined spread."""
    if not best or "p50_ms" not in best:
        return "it has no timing"
    if latency_noisy(best.get("round_spread_pct")):
        return f"its own timing rounds spread {best['round_spread_pct']:.0f}%"
    if not runner_up or "p50_ms" not in runner_up:
        return None
    spread = combined_spread(best.get("round_spread_pct"), runner_up.get("round_spread_pct"))
    if within_noise(runner_up["p50_ms"], best["p50_ms"], spread):
        lead = 100.0 * (runner_up["p50_ms"] / best["p50_ms"] - 1)
        return f"its lead ({lead:.0f}%) is within the combined spread of the timings ({spread:.0f}%)"
    return None


def retime_while_busy(measure: Any, count: Any, say: Any, first: Any = None) -> tuple[Any, dict[str, Any]]:
    """``(measurement, timing)``: ``measure()`` (or ``first``, a measurement already taken), timed again
    while most of its cells are noisy (``busy``), up to ``BUSY_RETIMES`` more times, keeping the attempt
    with the fewest noisy cells. ``count(measurement) -> (noisy, cells)``; ``say``: one line per retry.
    ``timing``: ``noisy_cells``, ``cells``, ``retimed``, ``busy`` (the reports' ``timing_noise``). One
    rule for validate's models, its language models and optimize's language-model search."""
    got = measure() if first is None else first
    (noisy, cells), retimed = count(got), 0
    while busy(noisy, cells) and retimed < BUSY_RETIMES:
        retimed += 1
        say(
            f"the machine is busy: {noisy} of {cells} timings are noisy (their rounds spread more than "
            f"{NOISY_SPREAD_PCT:g}%); timing again ({retimed}/{BUSY_RETIMES})"
        )
        again = measure()
        fewer = count(again)
        if fewer[0] <= noisy:
            got, (noisy, cells) = again, fewer
    return got, {"noisy_cells": noisy, "cells": cells, "retimed": retimed, "busy": busy(noisy, cells)}
