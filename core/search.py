"""The one search of ptopt: the loops every search runs, with what a candidate is plugged in.

Five searches used to keep a loop each: accuracy-aware quantization (``compress/quantize/autoquant_
search``: schemes × the most sensitive layers kept float), the float layers a refused int8 model is
advised to keep (``autoquant_tuner.float_layers_that_hold``), optimize's catalogue
(``optimize/search``), NNCF's float layers for optimize (``optimize/float_layers``) and optimize's
language-model catalogue (``optimize/lm``). Each now only says what a candidate is and how it is
measured; the loops are here, once:

- :func:`rank`: the one sensitivity ranker. Each item measured alone (a layer quantized alone, or
  left float), most harmful first.
- :func:`ladder`: the fewest of a ranking to keep float (or any smallest ``k`` that holds): ``k``
  doubles until one holds, then the gap to the last that did not is halved.
- :func:`drop_unneeded`: then as few as hold: each item dropped in turn (the last first) while the
  rest still holds.
- :func:`catalogue`: candidates tried in order, each skipped (with its reason) or run.
- :func:`accept`: held-out acceptance that feeds back: the chosen candidate is judged on samples the
  search never saw; one that fails there is rejected and the search extended (the next rung), and
  the choice is made again, until one holds there or nothing is left to choose.

The choice itself is ``ptopt.core.choice`` (the fastest within the budget; the closest to it when none
is), the same rule for every search.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def rank(items: Iterable[T], measure: Callable[[T], Any], harm: Callable[[Any], Any]) -> list[tuple[T, Any]]:
    """``(item, measure(item))`` for every item, most harmful first (``harm(measured)``, larger is
    worse; ties keep the items' order). The one sensitivity ranker of ptopt: ``measure`` quantizes one
    layer alone (or leaves it float) and measures what that does."""
    measured = [(item, measure(item)) for item in items]
    order = sorted(range(len(measured)), key=lambda i: harm(measured[i][1]), reverse=True)
    return [measured[i] for i in order]


def ladder(
    holds: Callable[[int], bool | None],
    n_max: int,
    start: int = 1,
    floor: int | None = None,
    room: Callable[[], bool] = lambda: True,
) -> int | None:
    """The smallest ``k`` in ``[start, n_max]`` for which ``holds(k)`` (monotone: more float layers hold
    at least as well): ``k`` doubles from ``start`` until one holds, then the gap to the largest that
    did not (``floor``, default ``start - 1``: known not to hold) is halved. ``holds`` returns None when
    it can try no more (a budget spent), and ``room()`` says whether another try fits; either ends the
    search with the best ``k`` found so far (None: none held)."""
    lo, hi, k = (start - 1 if floor is None else floor), None, start
    while k <= n_max and hi is None and room():
        ok = holds(k)
        if ok is None:
            return None
        if ok:
            hi = k
        elif k == n_max:
            return None
        else:
            lo, k = k, min(2 * k, n_max)
    while hi is not None and hi - lo > 1 and room():
        mid = (lo + hi) // 2
        ok = holds(mid)
        if ok is None:
            break
        lo, hi = (lo, mid) if ok else (mid, hi)
    return hi


def drop_unneeded(items: Sequence[T], holds: Callable[[list[T], T], bool | None]) -> list[T]:
    """``items`` (which hold) with each one dropped in turn, the last first, while the rest still holds
    (``holds(the rest, the one dropped)``; None when it can try no more)."""
    kept = list(items)
    for item in reversed(list(items)):
        trial = [x for x in kept if x != item]
        ok = holds(trial, item)
        if ok is None:
            break
        if ok:
            kept = trial
    return kept


def catalogue(
    candidates: Iterable[T],
    skip: Callable[[T], str | None],
    run: Callable[[T], None],
    skipped: Callable[[T, str], None],
    after: Callable[[T], None] = lambda c: None,
) -> None:
    """Every candidate in order: ``skip(c)`` says why it is not tried (then ``skipped(c, why)``), else
    ``run(c)``; ``after(c)`` either way (progress, bookkeeping)."""
    for cand in candidates:
        why = skip(cand)
        if why:
            skipped(cand, why)
        else:
            run(cand)
        after(cand)


def accept(
    choose: Callable[[], T | None], holds_unseen: Callable[[T], bool], reject: Callable[[T], Any]
) -> tuple[T | None, list[T]]:
    """Held-out acceptance that feeds back into the search: ``choose()`` (None: nothing to choose),
    judged by ``holds_unseen`` on samples the search never saw. A candidate that fails there is
    rejected: ``reject(c)`` makes ``choose`` pass it over from now on and may extend the search (the
    next rung); then the choice is made again, until one is accepted or nothing is left. Returns (the
    accepted candidate or None, the rejected ones in order)."""
    rejected: list[T] = []
    while True:
        chosen = choose()
        if chosen is None or chosen in rejected:  # the second: a ``reject`` that did not take
            return None, rejected
        if holds_unseen(chosen):
            return chosen, rejected
        rejected.append(chosen)
        reject(chosen)
