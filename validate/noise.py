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
