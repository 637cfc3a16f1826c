"""Accuracy-aware quantization: what its search tries (see ``ptopt.compress.quantize.autoquant``).

Candidates are schemes with the ``k`` most sensitive layers left float: all-int8 first, then ``k``
grows (``ptopt.core.search.ladder``: doubling, then bisection) until the goal holds; within the tuning
budget float layers are made int8 again one at a time (``drop_unneeded``) and the other schemes are
tried. ``choose`` is ``ptopt.core.choice``'s rule: the fastest candidate that holds (latencies within
``LATENCY_TIE`` tie, and the tie goes to fewer float multiply-accumulates), else the most accurate.
``next_rung`` extends the search when the chosen candidate fails on held-out samples
(``ptopt.core.search.accept``). The tuner (``autoquant_tuner.Tuner``) quantizes and measures; the
loops are ``ptopt.core.search``'s; this module only decides what to try.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ptopt.compress.quantize.autoquant_result import AccuracyGoal, Candidate
from ptopt.core.choice import closest, fastest_within
from ptopt.core.search import catalogue, drop_unneeded, ladder

if TYPE_CHECKING:
    from ptopt.compress.quantize.autoquant_tuner import Tuner

#: two latencies within this fraction are a tie, broken by fewer float multiply-accumulates: a short
#: timing on a shared CPU is good to ~10% (measured: the same candidate ±15% between searches), and
#: fewer float MACs is the better bet within that
LATENCY_TIE = 0.10


def _layer_err(r: dict[str, Any], by_accuracy: bool) -> float:
    """The error a layer causes (method "alone") or saves ("float"), as one number."""
    if "saves" in r:
        return max(float(r["saves"]), 0.0)
    err = 1.0 - r["min_cosine"]
    if by_accuracy and r.get("accuracy_drop") is not None:
        err = max(r["accuracy_drop"], 0.0) + (1.0 - r["mean_cosine"])
    return err


#: rungs tried past a candidate that failed on the held-out samples, beyond the tuning budget if need be
#: (acceptance is not tuning: a search that stopped at its budget still gets its answer checked and
#: extended a little, rather than ending on a model known to miss the goal)
HELDOUT_RUNGS = 4

#: SmoothQuant strengths tried on dynamic int8 Linears (0.5 is the paper's default for W8A8 per-tensor;
#: per-channel int8 weights absorb more of the activation range, so stronger migration pays off)
SMOOTH_ALPHAS = (0.75, 0.6)


def _schemes(base: Any, smoothable: bool = False) -> list[tuple[bool, str | None, float | None]]:
    """(per_channel, observer, smoothing alpha) triples, the user's own first."""
    # the pt2e engine (X86InductorQuantizer) quantizes weights per channel only
    pcs = [base.per_channel, not base.per_channel] if base.engine == "fx" else [base.per_channel]
    if base.mode != "static":
        alphas = (None,) + (SMOOTH_ALPHAS if smoothable else ())
        return [(pc, None, a) for a in alphas for pc in pcs]
    own = base.observed().observer or "histogram"
    obs = [own] + [o for o in ("histogram", "minmax", "percentile") if o != own]
    return [(pc, o, None) for pc in pcs for o in obs]


class Search:
    def __init__(self, tuner: Tuner, layers: list[str], sens: list[dict[str, Any]], goal: AccuracyGoal):
        self.t, self.layers, self.sens, self.goal = tuner, layers, sens, goal
        self.ranked = [r["layer"] for r in sens]
        self.candidates: list[Candidate] = []
        self.seen: dict[tuple, Candidate] = {}
        self.exhausted = False
        #: rungs tried after held-out failures (``next_rung``)
        self.rungs = 0

    def budget_left(self) -> bool:
        if not self.candidates:
            return True  # always an answer: the first candidate is tried whatever the budget
        if self.goal.trials is not None and len(self.candidates) >= self.goal.trials:
            self.exhausted = True
        if self.goal.seconds is not None and self.t.elapsed() >= self.goal.seconds:
            self.exhausted = True
        return not self.exhausted

    def config(self, scheme: tuple, floats: tuple[str, ...]) -> Any:
        pc, obs, _ = scheme
        changes: dict[str, Any] = {
            "per_channel": pc,
            "float_modules": tuple(self.t.base.float_modules) + floats,
        }
        if obs is not None:
            changes["observer"] = obs
        return self.t.base.replace(**changes)

    def try_(
        self, scheme: tuple, floats: tuple[str, ...] | list[str], step: str, budgeted: bool = True
    ) -> Candidate | None:
        floats = tuple(n for n in self.ranked if n in set(floats))
        key = (scheme, frozenset(floats))
        if key in self.seen:
            return self.seen[key]
        if budgeted and not self.budget_left():
            return None
        t0 = time.perf_counter()
        q = self.t.quantize(self.config(scheme, floats), smooth=scheme[2])
        m = self.t.measure(q, self.t.eval)
        lat = self.t.latency(q)
        c = Candidate(
            len(self.candidates),
            scheme[0],
            scheme[1],
            floats,
            m,
            round(lat, 4),
            m.holds(self.goal),
            step,
            round(time.perf_counter() - t0, 2),
            sum(self.t.params.get(n, 0) for n in floats),
            scheme[2],
            round(self.float_share(floats), 4),
        )
        self.candidates.append(c)
        self.seen[key] = c
        self.t.log(
            f"candidate {c.index + 1} ({step}): {c.scheme}, {len(floats)} float  min cos "
            f"{m.min_cosine:.5f}"
            + (f"  drop {m.accuracy_drop:+.2f}" if m.accuracy_drop is not None else "")
            + f"  {lat:.2f} ms  {'holds' if c.holds else 'fails'}"
        )
        return c

    def float_share(self, floats: tuple[str, ...] | list[str]) -> float:
        total = sum(self.t.cost.get(n, 0.0) for n in self.layers) or 1.0
        return sum(self.t.cost.get(n, 0.0) for n in floats) / total

    def holding(self) -> list[Candidate]:
        return [c for c in self.candidates if c.holds]

    def run(self) -> None:
        schemes = _schemes(self.t.base, bool(self.t.smoothable))
        first = self.try_(schemes[0], (), "all int8")
        if first is None:
            return
        if not first.holds:
            # one change at a time from the user's scheme: the other weight granularity, the other observers
            one_change = [
                s for s in schemes[1:] if sum(a != b for a, b in zip(s, schemes[0], strict=False)) == 1
            ]
            catalogue(one_change, lambda s: None, lambda s: self.try_(s, (), "all int8"), _never)
        tried0 = [c for c in self.candidates if not c.float_layers]
        best_scheme = min(tried0, key=lambda c: c.measurement.error(self.t.by_accuracy))
        scheme = best_scheme.scheme_key
        if not self.holding():
            self.ladder(scheme)
        if not self.holding() and scheme != schemes[0] and not self.exhausted:
            self.ladder(schemes[0])  # the ranking was measured with the user's scheme
        if not self.holding():
            return
        self.refine()

    def ladder(self, scheme: tuple, order: list[str] | None = None, what: str = "", lo: int = 0) -> None:
        """Smallest k (the first k of ``order`` float) that holds (``ptopt.core.search.ladder``)."""
        order = self.ranked if order is None else order

        def holds(k: int) -> bool | None:
            c = self.try_(scheme, order[:k], f"top {k}{what}")
            return None if c is None else c.holds

        ladder(holds, max(len(order) - 1, 0), start=max(1, lo), floor=lo)  # at least one layer stays int8

    def refine(self) -> None:
        """Look for a faster candidate that holds: the sensitivity per float cost as a second ladder,
        fewer float layers (least sensitive dropped first), then the other schemes."""
        best = min(self.holding(), key=lambda c: (c.float_macs, c.latency_ms))
        scheme = best.scheme_key
        if best.float_layers:
            cheap = self.by_efficiency()
            if cheap[: len(best.float_layers)] != list(best.float_layers):
                self.ladder(scheme, cheap, " per MAC")
                if self.exhausted:
                    return
            best = min(self.holding(), key=lambda c: (c.float_macs, c.latency_ms))
        scheme = best.scheme_key

        def holds(trial: list[str], dropped: str) -> bool | None:
            c = self.try_(scheme, trial, f"-{dropped}")
            return None if c is None else c.holds

        floats = drop_unneeded(list(best.float_layers), holds)
        if self.exhausted:
            return
        others = [s for s in _schemes(self.t.base, bool(self.t.smoothable)) if s != scheme]
        catalogue(others, lambda s: None, lambda s: self.try_(s, floats, "scheme"), _never)

    def quantized(self, c: Candidate) -> Any:
        """Candidate ``c``'s int8 model again (the tuner keeps none), e.g. to judge it on held-out samples."""
        return self.t.quantize(self.config(c.scheme_key, c.float_layers), smooth=c.smooth)

    def next_rung(self, rejected: Candidate) -> bool:
        """``rejected`` held on the search's samples but not on held-out ones: it no longer counts as
        holding, and the next rung is tried, one more of the most sensitive layers float in its scheme
        (False: every layer but one is float already, or ``HELDOUT_RUNGS`` were tried)."""
        rejected.holds = False
        rejected.heldout_failed = True
        order = self.ranked
        k = max((order.index(n) + 1 for n in rejected.float_layers if n in order), default=0) + 1
        if k > max(len(order) - 1, 0) or self.rungs >= HELDOUT_RUNGS:
            return False
        self.rungs += 1
        return (
            self.try_(rejected.scheme_key, order[:k], f"top {k}, after held-out", budgeted=False) is not None
        )

    def by_efficiency(self) -> list[str]:
        """Layers by error saved per multiply-accumulate kept float (greedy knapsack order)."""
        err = {r["layer"]: _layer_err(r, self.t.by_accuracy) for r in self.sens}
        return sorted(
            self.ranked, key=lambda n: err.get(n, 0.0) / max(self.t.cost.get(n, 1.0), 1.0), reverse=True
        )

    def choose(self) -> Candidate | None:
        """``ptopt.core.choice``'s rule: the fastest that holds (``LATENCY_TIE``: to fewer float
        multiply-accumulates), else the closest to the goal."""
        found, _ = fastest_within(
            self.candidates, lambda c: c.latency_ms, lambda c: c.holds, lambda c: c.float_macs, LATENCY_TIE
        )
        if found is not None:
            return found
        return closest(
            self.candidates, lambda c: c.measurement.error(self.t.by_accuracy), lambda c: c.latency_ms
        )


def _never(item: Any, why: str) -> None:  # every scheme listed is tried
    raise AssertionError(why)
