"""The search of ``ptopt optimize``: build cheap before expensive, reject early on accuracy, time the
survivors together, and finish within the time budget.

1. **Cost model.** One reference batch at the largest batch size is timed first (``Costs``); from
   it come the cost of evaluating any candidate and of timing it, and the budget the fp32
   reference alone needs (less than that is refused up front, saying how long it takes).
2. **Build** each candidate in catalogue order (fp32 formats, int8, the slow builds, training),
   skipping one (status ``skipped``, with the estimate in the reason) when its build, evaluation and
   timing would not fit in what is left after what is already promised (timing the reference and the
   kept ones, writing the kept ones to the output folder), and a search that cannot win: one that keeps
   layers of a plain int8 build float (``Spec.ceiling``) when a kept candidate is ``DOMINANCE``x faster
   than that build at every batch size (``probe`` while screening, ``head_to_head`` to decide).
3. **Pre-screen** on a subset of the eval data (``prescreen_samples``): a candidate clearly outside
   the accuracy budget is rejected there (for ``min_cosine`` exactly: a subset's worst cosine can
   only be higher than the whole set's; for an accuracy drop with a margin of 100/sqrt(n) points,
   the subset's sampling error); survivors are evaluated on all of it, then accepted on the held-out
   samples. ``min_cosine`` judges the worst cosine projected to 1000 samples (``ptopt.core.tail``).
   Every candidate runs in its own runtime through validate's runners (``evaluate_outputs``).
4. **Time** the reference and every kept candidate in shared interleaved rounds at the requested
   batch sizes with validate's ``measure_runners``; the per-candidate seconds shrink to what is
   left of the budget, so the search always ends with an answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core import progress
from ptopt.core.errors import MissingDependencyError, ParityError, PtoptError, UsageError
from ptopt.core.isa import is_native
from ptopt.core.search import catalogue
from ptopt.optimize.candidates import Candidate, Context, Rejected, Spec, runtime_filters
from ptopt.validate.latency import LatencyOptions, warmup_seconds
from ptopt.validate.noise import latency_noisy, speedup_noisy

#: the pre-screen's subset of the eval data (the whole set when it is not larger)
PRESCREEN_SAMPLES = 128
#: the least seconds per (artifact, batch size) the timing is shrunk to when the budget runs short
MIN_TIMING_SECONDS = 0.2
#: the fewest interleaved rounds the timing is cut to when the budget runs short
MIN_ROUNDS = 5
#: measure_costs: the fastest of this many timed calls of the reference's largest batch, within this many seconds
COST_CALLS = 3
COST_SECONDS = 2.0
#: a candidate's evaluation, in passes over the eval data (the pre-screen's subset, the search's half and
#: the held-out half): ``Costs.eval_s`` is this many times the reference's one pass
EVAL_PASSES = 1.5
#: a build's estimate when no build was timed yet (seconds, before the model-size scaling)
UNIT_FLOOR_S = 0.5
#: a search is skipped when a kept candidate runs at least this much faster, at every batch size, than the
#: plain build it starts from (``Spec.ceiling``; float layers only slow that build down)
DOMINANCE = 1.25
#: timed calls per batch size of a quick probe (after one warm-up): the fastest counts
PROBE_CALLS = 2


@dataclasses.dataclass
class Settings:
    """The checked options of one search."""

    batch_sizes: list[int]
    runtime: str
    time_budget: float
    latency: LatencyOptions
    threads: int
    max_accuracy_drop: float | None
    min_cosine: float | None
    prescreen_samples: int = PRESCREEN_SAMPLES
    #: ``cpu`` or ``cuda:N``: where the candidates are built, evaluated and timed
    device: str = "cpu"
    #: ``--isa``: the CPU levels every candidate kept must hold at too (``ptopt.optimize.isa``)
    isa: tuple[str, ...] = ()

    @property
    def metric(self) -> str:
        return "top1" if self.max_accuracy_drop is not None else "cosine"


class Clock:
    """Seconds since the search began, and what is left of the budget: less ``reserve()``, what is kept
    for later (``--isa``'s level checks, ``Search.reserved_s``: re-estimated at every call, so what they
    turn out not to need goes back to the search)."""

    def __init__(self, budget: float):
        self.start = time.perf_counter()
        self.budget = budget
        self.reserve: Callable[[], float] = lambda: 0.0
        #: phase -> {"seconds": taken, "planned": what the budget kept for it} (``phase``): the report's
        #: ``time_phases``, which say which phase ran over when the search did
        self.phases: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def phase(self, name: str, planned: float | None = None) -> Iterator[None]:
        """Record how long the block took (and what was ``planned`` for it) under ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            entry = {"seconds": round(time.perf_counter() - t0, 1)}
            if planned is not None:
                entry["planned"] = round(max(planned, 0.0), 1)
            self.phases[name] = entry

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed() - self.reserve()


@dataclasses.dataclass
class Costs:
    """Seconds of one reference batch per batch size, and what evaluating and timing cost."""

    batch_s: dict[int, float]
    eval_s: float
    #: one fp32 TorchScript-sized build (measured once the first build ran)
    unit_s: float = UNIT_FLOOR_S

    def timing_s(self, lat: LatencyOptions) -> float:
        """Timing one artifact at every batch size with ``lat`` (warm-ups included; no early stop)."""
        per_round_warmup = max(1, lat.warmup_iters // 10)
        return sum(
            max(lat.min_seconds, lat.min_iters * t) * 1.1
            + warmup_seconds(lat) * (1 + (lat.rounds - 1) / 10)
            + (lat.warmup_iters + per_round_warmup * (lat.rounds - 1)) * t
            for t in self.batch_s.values()
        )

    def reference_s(self, settings: Settings) -> float:
        """Evaluating and timing the fp32 reference alone (the least budget that gives an answer)."""
        return self.eval_s + self.timing_s(minimal(settings.latency))

    def build_s(self, spec: Spec) -> float:
        return spec.fixed + spec.cost * self.unit_s

    def observe_eval(self, seconds: float) -> None:
        """The reference's whole first evaluation took ``seconds`` (one pass over the eval data, hundreds of
        calls): the evaluations' estimate is the lower of it and the first one's (a few calls of one batch,
        which one burst of load elsewhere inflated 7x on MiniLM), as a busy host only ever adds time."""
        if seconds > 0:
            self.eval_s = min(self.eval_s, seconds * EVAL_PASSES)


def minimal(lat: LatencyOptions) -> LatencyOptions:
    """The least timing the search settles for when the budget is short: few, short rounds."""
    return dataclasses.replace(
        lat,
        min_seconds=min(lat.min_seconds, MIN_TIMING_SECONDS),
        min_iters=min(lat.min_iters, 5),
        rounds=min(lat.rounds, MIN_ROUNDS),
        warmup_iters=min(lat.warmup_iters, 2),
        warmup_seconds=min(lat.warmup_seconds, 0.05),
    )


def measure_costs(runner: Any, evald: Any, settings: Settings) -> Costs:
    """Time one reference batch at the largest batch size (after one warm-up call) and scale: the fastest
    of up to ``COST_CALLS`` calls (within ``COST_SECONDS``), as a busy host only ever adds time, and one
    slow call scaled up by the samples set aside most of the budget (--isa's checks, the skips)."""
    from ptopt.validate.latency import batch_inputs

    largest = settings.batch_sizes[-1]
    per_sample = _fastest_call(runner, batch_inputs(evald, largest)) / largest
    # a call's fixed cost: the smallest batch is timed too (mobilenet_v3_small: 27 ms at batch 1, where
    # 1/16 of batch 16 said 11 ms), and no batch is priced below it
    smallest = settings.batch_sizes[0]
    floor = _fastest_call(runner, batch_inputs(evald, smallest)) if smallest != largest else 0.0
    batch_s = {bs: max(per_sample * bs, floor) for bs in settings.batch_sizes}
    return Costs(batch_s, eval_s=per_sample * len(evald) * EVAL_PASSES)


def _fastest_call(runner: Any, x: Any) -> float:
    """The fastest of up to ``COST_CALLS`` timed calls (after one warm-up), within ``COST_SECONDS``."""
    runner.predict(x)
    calls, start = [], time.perf_counter()
    while len(calls) < COST_CALLS and (not calls or time.perf_counter() - start < COST_SECONDS):
        t0 = time.perf_counter()
        runner.predict(x)
        calls.append(time.perf_counter() - t0)
    return min(calls)


def check_budget(costs: Costs, settings: Settings) -> None:
    """Refuse a time budget too short to evaluate and time the fp32 reference (exit 2)."""
    need = costs.reference_s(settings)
    if settings.time_budget < need:
        largest = settings.batch_sizes[-1]
        raise UsageError(
            f"--time-budget {settings.time_budget:g}s is too short: evaluating and timing the fp32 reference "
            f"alone takes about {need:.1f} s here (one batch of {largest}: "
            f"{costs.batch_s[largest] * 1e3:.1f} ms); give at least {math.ceil(need) + 1}s"
        )


@dataclasses.dataclass
class Figures:
    """A candidate's figures on one set of samples: top-1 and its drop (labelled data), and the worst
    sample's cosine with the reference's outputs, measured and projected (``ptopt.core.tail``)."""

    accuracy: float | None
    accuracy_drop: float | None
    cosine: Any = None  # WorstCosine | None (None: the outputs' shape differs from the reference's)

    def apply(self, cand: Candidate) -> None:
        c = self.cosine
        cand.accuracy, cand.accuracy_drop = self.accuracy, self.accuracy_drop
        cand.cosine_min = None if c is None else c.measured
        cand.cosine_projected = None if c is None else c.projected
        cand.tail = None if c is None else c.to_dict()


class Evaluator:
    """The reference's outputs on the eval data, and how a candidate's compare (validate's runners):
    chosen on ``evald`` (the search's part of the eval data), accepted on ``heldout`` (the rest).
    ``--min-cosine`` is judged on the worst cosine projected to ``REFERENCE_SAMPLES`` samples
    (``ptopt.core.tail``): the worst of a few dozen samples flatters a heavy-tailed candidate."""

    def __init__(self, ref_runner: Any, evald: Any, settings: Settings, heldout: Any = None):
        from ptopt.validate.api import evaluate_outputs

        self.evald, self.settings, self.heldout = evald, settings, heldout
        self.eval_bs = min(max(64, settings.batch_sizes[-1]), len(evald))
        self.subset = evald.take(min(settings.prescreen_samples, len(evald)))
        self.ref_out = evaluate_outputs(ref_runner, evald, self.eval_bs)
        self.ref_acc = self._top1(self.ref_out, evald)
        self.held_ref = None if heldout is None else evaluate_outputs(ref_runner, heldout, self.eval_bs)

    def _top1(self, out: Any, ds: Any) -> float | None:
        from ptopt.validate.metrics import compute_metric, resolve_metric

        return None if ds.y is None else compute_metric(resolve_metric("top1"), out, ds.y)

    def _judge(self, out: Any, ds: Any, ref: Any = None) -> Figures:
        from ptopt.core.tail import project_worst_cosine
        from ptopt.validate.gates import accuracy_drop
        from ptopt.validate.metrics import at_real_tokens, attention_mask_of, per_sample_cosine

        acc = self._top1(out, ds)
        ref = self.ref_out[: len(ds)] if ref is None else ref
        ref_acc = self.ref_acc if ref is self.ref_out and len(ds) == len(self.evald) else self._top1(ref, ds)
        drop = None if acc is None else accuracy_drop(ref_acc, acc)
        same = tuple(ref.shape) == tuple(out.shape) and len(out) > 0
        if not same:
            return Figures(acc, drop, None)
        # per-token outputs at the real tokens only, as validate judges them: all-MiniLM-L6-v2's NNCF
        # int8 scored a worst cosine of 0.59 on its padded positions' last_hidden_state, which nothing reads
        mask = attention_mask_of(ds.x)
        ref, out = at_real_tokens(ref, out, None if mask is None else mask[: len(out)])
        return Figures(acc, drop, project_worst_cosine(per_sample_cosine(ref, out)))

    def outputs(self, runner: Any, ds: Any) -> Any:
        from ptopt.validate.api import _eval_batch_size, evaluate_outputs

        return evaluate_outputs(runner, ds, _eval_batch_size(runner, self.eval_bs, len(ds)))

    def prescreen(self, cand: Candidate, runner: Any) -> str | None:
        """Why the candidate is rejected on the subset already (its figures are then the subset's),
        or None. For ``min_cosine`` the subset's *measured* worst decides (exact: the whole set's worst,
        and any projection of it, can only be lower)."""
        if len(self.subset) == len(self.evald):
            return None
        fig = self._judge(self.outputs(runner, self.subset), self.subset)
        fig.apply(cand)
        cand.within_budget = False
        n, s, cos = len(self.subset), self.settings, cand.cosine_min
        if s.metric == "cosine" and cos is not None and cos < s.min_cosine:
            return f"pre-screen on {n} samples: worst cosine {cos:.4f} < {s.min_cosine:g}"
        margin, drop = 100.0 / math.sqrt(n), fig.accuracy_drop
        if s.metric == "top1" and drop is not None and drop > s.max_accuracy_drop + margin:
            return (
                f"pre-screen on {n} samples: accuracy drop {drop:.1f} pts > {s.max_accuracy_drop:g} "
                f"(+{margin:.1f} sampling margin)"
            )
        return None

    def evaluate(self, cand: Candidate, runner: Any) -> None:
        """The full evaluation on the search's samples, then, for a candidate that meets the goal there,
        on the held-out ones: those figures are its headline, and they decide whether it is accepted."""
        fig = self._judge(self.outputs(runner, self.evald), self.evald)
        fig.apply(cand)
        cand.within_budget, why = self._meets(fig)
        if self.heldout is not None and not cand.within_budget:
            why = f"on the {len(self.evald)} samples the search chooses on: {why}"
        if cand.within_budget and self.heldout is not None:
            cand.search = {
                "accuracy": cand.accuracy,
                "accuracy_drop": cand.accuracy_drop,
                "cosine_min": cand.cosine_min,
                "cosine_projected": cand.cosine_projected,
            }
            fig = self._judge(self.outputs(runner, self.heldout), self.heldout, self.held_ref)
            fig.apply(cand)
            cand.within_budget, why = self._meets(fig)
            why = f"on the {len(self.heldout)} held-out samples: {why}"
        if not cand.within_budget:
            cand.status, cand.reason = "rejected", why

    def _meets(self, fig: Figures) -> tuple[bool, str]:
        s, drop, c = self.settings, fig.accuracy_drop, fig.cosine
        if s.metric == "top1":
            return (
                drop is not None and drop <= s.max_accuracy_drop,
                "no accuracy" if drop is None else f"accuracy drop {drop:.2f} pts > {s.max_accuracy_drop:g}",
            )
        if c is None:
            return False, "its outputs' shape differs from the reference's: no cosine"
        return c.projected >= s.min_cosine, (
            f"worst cosine projected to {c.reference} samples {c.projected:.4f} < {s.min_cosine:g} "
            f"(measured worst {c.measured:.4f} on {c.samples}, mean {c.mean:.4f})"
        )


def open_candidate(cand: Candidate, threads: int, device: str = "cpu") -> Any:
    """Validate's runner for the candidate's written artifact on ``device``, ready to run (through
    ``torch.compile`` when the candidate runs that way: compiled at the first call, in ``prepare``)."""
    from ptopt.validate.runners import open_runner
    from ptopt.validate.runners.compiled import CompiledRef

    # allow_pickle: an AOTInductor package loads native code; this one was compiled by this very run,
    # into its own temporary folder, so it is trusted (a user's files never go through here)
    ref = str(cand.work_path)
    if cand.spec.compile_mode:
        ref = CompiledRef(ref, mode=cand.spec.compile_mode)
    runner = open_runner(ref, cand.name, allow_pickle=True)
    try:
        if device != "cpu":
            runner.place(device)  # before prepare: a compiled one compiles there
        runner.prepare(threads)
    except BaseException:
        runner.close()
        raise
    return runner


def _first_line(e: BaseException) -> str:
    """The reason a candidate records: the error's first line (cut at a word, with "…", past 1000 characters;
    it was cut mid-word at 300: "a lower worst-sample cosine is wit")."""
    from ptopt.core.errors import clip

    return clip((str(e).strip().splitlines() or [type(e).__name__])[0], 1000)


class Search:
    """Steps 2-4 of the module docstring over ``specs``; ``candidates`` holds every one's record."""

    def __init__(self, ctx: Context, specs: list[Spec], settings: Settings, costs: Costs, clock: Clock):
        self.ctx, self.settings, self.costs, self.clock = ctx, settings, costs, clock
        self.candidates = [Candidate(s) for s in specs]
        ctx.seconds_left = self.seconds_left  # what a build may spend: the budget less what is promised
        ctx.eval_pass_s = lambda: self.costs.eval_s / EVAL_PASSES
        self.by_name = {c.name: c for c in self.candidates}
        #: the candidates whose speed bounds a later search's (probed even when rejected)
        self.ceilings = {s.ceiling for s in specs if s.ceiling}
        self.work = Path(tempfile.mkdtemp(prefix="ptopt-optimize-"))
        #: seconds per unit of cost of each build so far (``_calibrate_costs``)
        self.unit_samples: list[float] = []
        #: how the eval data was split (``split_eval``): recorded in the report and the best's sidecar
        self.split: dict[str, Any] = {}
        #: the final timing's noise (``validate.noise.retime_while_busy``): the report's ``timing_noise``
        self.timing: dict[str, Any] = {}
        #: candidates still to be built whose --isa checks the reserve counts (1 while the builds run)
        self.pending = 0

    def close(self) -> None:
        """Remove the working copies; the Results forget them (``OptimizeResult.save`` writes anew)."""
        shutil.rmtree(self.work, ignore_errors=True)
        for c in self.candidates:
            if c.result is not None:
                c.result.artifact = None

    def promised_s(self) -> float:
        """Time already promised: timing the reference and every kept candidate (each opened again: loaded,
        compiled), and writing them."""
        return self.timings_s(minimal(self.settings.latency)) + self.after_s()

    def timings_s(self, lat: LatencyOptions, cands: Sequence[Candidate] | None = None) -> float:
        """Timing the reference and ``cands`` (default: every kept one) with ``lat``, each at its own speed
        (``own_costs``: mobilenet_v3_small's 7 artifacts priced as 7 references took 44 s where 8 s were
        planned)."""
        cands = [c for c in self.candidates[1:] if c.status == "kept"] if cands is None else cands
        return self.costs.timing_s(lat) + sum(self.own_costs(c).timing_s(lat) for c in cands)

    def own_costs(self, cand: Candidate) -> Costs:
        """The reference's costs with ``cand``'s own fastest call at each batch size it was probed at (a kept
        candidate is probed when screened): a candidate's whole evaluation is no measure of its speed (a
        TorchScript model's first calls at each shape compile; MiniLM's took 44 s here and 10 s in a child)."""
        probed = {b: cand.probe_ms[str(b)] / 1e3 for b in self.costs.batch_s if str(b) in cand.probe_ms}
        if not probed:
            return self.costs
        batch_s = {b: probed.get(b, t) for b, t in self.costs.batch_s.items()}
        largest = max(probed)
        eval_s = self.costs.eval_s * (probed[largest] / self.costs.batch_s[largest])
        return dataclasses.replace(self.costs, batch_s=batch_s, eval_s=eval_s)

    def after_s(self) -> float:
        """What the end costs besides the timing rounds: opening the kept candidates again, and writing them."""
        return sum(c.open_seconds for c in self.candidates if c.status == "kept") + self.writing_s()

    def writing_s(self) -> float:
        """Writing the output folder at the end: every kept candidate once, the winner twice (each as long
        as its working copy took to write)."""
        kept = [c.save_seconds or 0.0 for c in self.candidates if c.status == "kept"]
        return sum(kept) + max(kept, default=0.0)

    def seconds_left(self) -> float:
        """What the builds still have: the budget less the time already promised."""
        return self.clock.left() - self.promised_s()

    def reserved_s(self) -> float:
        """What ``--isa``'s level checks after the search need (``ptopt.optimize.isa.reserve_s``) for the
        candidates kept within the budget so far, and the one being built while the builds run: it grows with
        what they will judge, never past its share of the budget, and is 0 without levels."""
        if not self.settings.isa:
            return 0.0
        judged = [c for c in self.candidates[1:] if c.status == "kept" and c.within_budget]
        guessed = reserve_s(self.settings.isa, self.costs, self.settings, survivors=self.pending)
        return guessed + measured_reserve_s(self.settings.isa, judged, self.own_costs, self.settings)

    def _why_not(self, spec: Spec) -> str | None:
        allowed = runtime_filters()[self.settings.runtime]
        if allowed is not None and spec.runtime not in allowed:
            return f"--runtime {self.settings.runtime}: runs on {spec.runtime}"
        why = spec.not_applicable(self.ctx) or self._dominated(spec)
        if why:
            return why
        need = (
            self.costs.build_s(spec) + self.costs.eval_s + self.costs.timing_s(minimal(self.settings.latency))
        )
        left = self.seconds_left()
        self.by_name[spec.name].estimate_s = need
        if need > left:
            kept = self.clock.reserve()
            aside = f" ({kept:.0f} s more kept for the --isa level checks)" if kept >= 0.5 else ""
            return f"time budget: needs about {need:.0f} s, {max(left, 0):.0f} s left{aside}"
        return None

    def run(self, say: Callable[[str], None]) -> None:
        """Steps 2-3 over the catalogue (``ptopt.core.search.catalogue``), the reference excepted."""

        def skipped(cand: Candidate, why: str) -> None:
            cand.status, cand.reason = "skipped", why

        def after(cand: Candidate) -> None:
            self.ctx.status[cand.name] = cand.status
            if cand.build_seconds is not None:
                self.ctx.build_seconds[cand.name] = cand.build_seconds
            say(_progress_line(cand))

        self.pending = 1
        try:
            catalogue(self.candidates[1:], lambda c: self._why_not(c.spec), lambda c: self._try(c, say),
                      skipped, after)  # fmt: skip
        finally:
            self.pending = 0

    def _try(self, cand: Candidate, say: Callable[[str], None]) -> None:
        say(f"building {cand.name}: {cand.label}")
        t0 = time.perf_counter()
        try:
            with _quiet(), progress.step(f"building {cand.name}", announce=False), _stage_checks():
                cand.result = cand.spec.build(self.ctx)
            cand.build_seconds = round(time.perf_counter() - t0, 2)
            self._calibrate_costs(cand)
            self.ctx.built[cand.name] = cand.result
            cand.work_path = self.work / f"{cand.name}{cand.suffix}"
            t1 = time.perf_counter()
            art = cand.result.save(cand.work_path)
            cand.save_seconds = time.perf_counter() - t1
            cand.size_bytes = art.size_bytes
            self._screen(cand)
        except (Rejected, ParityError) as e:
            cand.status, cand.reason = "rejected", _first_line(e)
            self._probe_refused(cand, getattr(e, "result", None))
        except MissingDependencyError as e:
            cand.status, cand.reason = "skipped", _first_line(e)
        except PtoptError as e:
            cand.status, cand.reason = "failed", _first_line(e)
        except Exception as e:  # noqa: BLE001 - a stage or a runtime can fail in any way on a user's model
            cand.status, cand.reason = "failed", f"{type(e).__name__}: {_first_line(e)}"
        if cand.build_seconds is None:
            cand.build_seconds = round(time.perf_counter() - t0, 2)
        cand.spent_s = time.perf_counter() - t0

    def _calibrate_costs(self, cand: Candidate) -> None:
        """Every timed build refines the unit the other estimates scale: the median over the builds so
        far of seconds per unit of cost. One build alone misleads: all-MiniLM-L6-v2's fp32 TorchScript
        (freeze + check of 90 MB) took 17 s, 17x its ResNet-calibrated share, and that first unit priced
        NNCF int8 at ~300 s (it builds in ~25 s) and skipped it."""
        if cand.spec.cost > 0:
            self.unit_samples.append(
                max(UNIT_FLOOR_S / 5, (cand.build_seconds - cand.spec.fixed) / cand.spec.cost)
            )
            self.costs.unit_s = statistics.median(self.unit_samples)

    def _screen(self, cand: Candidate) -> None:
        with progress.step(f"judging {cand.name}", announce=False):  # a heartbeat names it
            t0 = time.perf_counter()
            runner = open_candidate(cand, self.settings.threads, self.settings.device)
            # paid again by the final timing and --isa's children
            cand.open_seconds = time.perf_counter() - t0
            try:
                why = self.evaluator.prescreen(cand, runner)
                if why:
                    cand.status, cand.reason = "rejected", why
                else:
                    t1 = time.perf_counter()
                    self.evaluator.evaluate(cand, runner)
                    cand.eval_seconds = time.perf_counter() - t1
                if self._probing(cand) or (cand.status == "pending" and cand.within_budget):
                    # a kept one's own speed prices its final timing and its --isa checks (``own_costs``)
                    cand.probe_ms = probe(runner, self.evaluator.evald, self.settings.batch_sizes)
            finally:
                runner.close()
        if cand.status == "pending":
            cand.status = "kept"

    def _probe_refused(self, cand: Candidate, result: Any) -> None:
        """A build its stage's fidelity check refused (the Result rides on the error) still bounds the speed
        of the search that starts from it: written and probed when it is a search's ceiling."""
        if cand.name not in self.ceilings or result is None or cand.work_path is not None:
            return
        try:
            cand.work_path = self.work / f"{cand.name}{cand.suffix}"
            result.save(cand.work_path)
            runner = open_candidate(cand, self.settings.threads, self.settings.device)
            try:
                cand.probe_ms = probe(runner, self.evaluator.evald, self.settings.batch_sizes)
            finally:
                runner.close()
        except Exception:  # noqa: BLE001 - without a probe the search simply runs
            cand.probe_ms = {}

    def _probing(self, cand: Candidate) -> bool:
        """Probe its speed: it bounds a later search, or it may be the kept one that makes a search
        pointless (``_dominated``) while such a search is still to come."""
        if cand.name in self.ceilings:
            return True
        later = any(c.status == "pending" and c.spec.ceiling for c in self.candidates if c is not cand)
        return later and cand.status == "pending" and bool(cand.within_budget) and cand.packageable

    def _dominated(self, spec: Spec) -> str | None:
        """Why a search is pointless: a kept candidate already runs ``DOMINANCE``x faster, at every batch
        size, than the plain build the search can at best match (timed head to head), or None."""
        parent = self.by_name.get(spec.ceiling or "")
        sizes = [str(b) for b in self.settings.batch_sizes]
        if parent is None or not parent.probe_ms or any(bs not in parent.probe_ms for bs in sizes):
            return None
        kept = [c for c in self.candidates[1:] if c.status == "kept" and c.within_budget and c.probe_ms]
        fastest = {bs: min(kept, key=lambda c: c.probe_ms.get(bs, math.inf), default=None) for bs in sizes}
        if any(
            f is None or parent.probe_ms[bs] < DOMINANCE * f.probe_ms.get(bs, math.inf)
            for bs, f in fastest.items()
        ):
            return None
        rivals = list({f.name: f for f in fastest.values()}.values())
        ms = head_to_head([parent, *rivals], self.evaluator.evald, self.settings)
        ratios = {bs: ms[parent.name][bs] / ms[f.name][bs] for bs, f in fastest.items()}
        if min(ratios.values()) < DOMINANCE:
            return None
        figures = "; ".join(
            f"batch {bs}: {f.name} {ms[f.name][bs]:.3g} ms vs {ms[parent.name][bs]:.3g} ms ({ratios[bs]:.2f}x)"
            for bs, f in fastest.items()
        )
        return (
            f"cannot win: it keeps layers of {parent.name} float, so it runs no faster than {parent.name}, and a "
            f"kept candidate is already >= {DOMINANCE:g}x faster than that at every batch size ({figures})"
        )

    def time_kept(self, ref_runner: Any, say: Callable[[str], None]) -> None:
        """Step 4: the reference and every kept candidate in shared interleaved rounds."""
        from ptopt.validate.latency import measure_runners

        kept = [c for c in self.candidates[1:] if c.status == "kept"]
        lat = self._latency()
        sizes = self.settings.batch_sizes
        say(
            f"timing {len(kept) + 1} artifacts at batch sizes {', '.join(map(str, sizes))} "
            f"({lat.rounds} interleaved rounds, {lat.min_seconds:.1f} s each per batch size)"
        )
        runners = [ref_runner]
        planned = self.timings_s(lat, kept) + self.after_s() - self.writing_s()
        try:
            with (
                self.clock.phase("timing", planned),
                progress.step(f"timing {len(kept) + 1} artifacts", announce=False),
            ):
                for c in kept:
                    runners.append(open_candidate(c, self.settings.threads, self.settings.device))
                stats = self._timed_while_busy(
                    lambda: measure_runners(runners, self.ctx.evald, sizes, lat), lat, say
                )
        finally:
            for r in runners[1:]:
                r.close()
        for cand, lat_bs in zip([self.candidates[0], *kept], stats, strict=True):
            cand.latency_ms = {str(bs): _latency_entry(st) for bs, st in lat_bs.items()}
        self._speedups(kept)

    def _timed_while_busy(
        self, measure: Callable[[], Any], lat: LatencyOptions, say: Callable[[str], None]
    ) -> Any:
        """``measure()``, timed again while the machine is busy (most cells noisy; validate's rule) when
        the budget has room for another timing; ``self.timing`` records the noise."""
        from ptopt.validate.noise import busy, retime_while_busy

        stats = measure()
        room = self.timings_s(lat) <= self.clock.left() - self.writing_s()
        if room:
            stats, self.timing = retime_while_busy(measure, speedup_cells, say, first=stats)
        else:
            noisy, cells = speedup_cells(stats)
            self.timing = {"noisy_cells": noisy, "cells": cells, "retimed": 0, "busy": busy(noisy, cells)}
        self.timing["reference_noisy"] = [
            bs for bs, st in stats[0].items() if "p50_ms" in st and latency_noisy(st.get("round_spread_pct"))
        ]
        return stats

    def _latency(self) -> LatencyOptions:
        """The settings' latency options when timing the reference and the kept candidates (``timings_s``)
        fits in what is left of the budget (after opening them and writing the output folder); else the
        minimal ones with their seconds stretched to fill it."""
        lat, left = self.settings.latency, self.clock.left() - self.after_s()
        if self.timings_s(lat) <= left:
            return lat
        low = minimal(lat)
        spare = left - self.timings_s(low)
        if spare <= 0:
            return low
        per_second = self.timings_s(dataclasses.replace(low, min_seconds=low.min_seconds + 1)) - (
            self.timings_s(low)
        )
        seconds = min(lat.min_seconds, low.min_seconds + spare / max(per_second, 1e-9))
        return dataclasses.replace(low, min_seconds=seconds)

    def _speedups(self, kept: list[Candidate]) -> None:
        ref = self.candidates[0].latency_ms
        for c in kept:
            for bs, st in c.latency_ms.items():
                base = ref.get(bs, {})
                if "median" in st and "median" in base:
                    c.speedup[bs] = round(base["median"] / st["median"], 3)
                    if speedup_noisy(c.speedup[bs], st.get("spread_pct"), base.get("spread_pct")):
                        c.noisy = True  # the report places it on the batch sizes where it holds


def speedup_cells(stats: list[dict]) -> tuple[int, int]:
    """(noisy, timed) cells over ``[reference, candidate, ...]`` (``{batch size: stats}`` each), a cell noisy
    when its own rounds or the reference's at that batch size spread too much (``validate.noise``, rule 1):
    every speedup divides by the reference's median, so a noisy reference makes its batch size's speedups
    noisy, and a run whose reference was disturbed is timed again like a busy one."""
    ref = stats[0] if stats else {}
    cells = [(bs, st) for lat in stats for bs, st in lat.items() if "p50_ms" in st]
    noisy = sum(
        1
        for bs, st in cells
        if latency_noisy(st.get("round_spread_pct"))
        or latency_noisy((ref.get(bs) or {}).get("round_spread_pct"))
    )
    return noisy, len(cells)


def probe(runner: Any, data: Any, batch_sizes: list[int]) -> dict[str, float]:
    """Quick milliseconds per call at each batch size the runner takes: the fastest of ``PROBE_CALLS``
    calls after one warm-up (a rough figure; ``head_to_head`` and the final timing are the fair ones)."""
    from ptopt.validate.latency import batch_inputs

    out = {}
    for bs in batch_sizes:
        if not runner.accepts_batch(bs):
            continue
        call = _synced(runner, runner.timed_call(batch_inputs(data, bs)))
        call()
        seconds = []
        for _ in range(PROBE_CALLS):
            t0 = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - t0)
        out[str(bs)] = min(seconds) * 1e3
    return out


def head_to_head(cands: list[Candidate], data: Any, settings: Settings, rounds: int = 3) -> dict[str, dict]:
    """Milliseconds per call of each candidate at each batch size, timed in alternation (a burst of load
    hits all alike): the fastest of ``rounds`` calls each, after a warm-up."""
    from ptopt.validate.latency import batch_inputs

    runners = []
    try:
        for c in cands:
            runners.append(open_candidate(c, settings.threads, settings.device))
        out: dict[str, dict[str, float]] = {c.name: {} for c in cands}
        for bs in settings.batch_sizes:
            calls = [_synced(r, r.timed_call(batch_inputs(data, bs))) for r in runners]
            best = [math.inf] * len(calls)
            for r in range(rounds + 1):  # round 0 warms up
                for i, call in enumerate(calls):
                    t0 = time.perf_counter()
                    call()
                    if r:
                        best[i] = min(best[i], time.perf_counter() - t0)
            for c, b in zip(cands, best, strict=True):
                out[c.name][str(bs)] = b * 1e3
        return out
    finally:
        for r in runners:
            r.close()


def _synced(runner: Any, call: Callable[[], Any]) -> Callable[[], Any]:
    """``call``, returning once its work is done: a GPU runner's calls only queue kernels, so a host clock
    around them waits for the device (the final timing uses CUDA events: ``ptopt.core.timing``)."""
    if not str(runner.timer_device).startswith("cuda"):
        return call
    import torch

    def run() -> Any:
        out = call()
        torch.cuda.synchronize(runner.timer_device)
        return out

    return run


def _latency_entry(st: dict[str, Any]) -> dict[str, Any]:
    if "p50_ms" not in st:
        return {"skipped": st.get("skipped")}
    return {
        "median": round(st["p50_ms"], 4),
        "spread_pct": round(st.get("round_spread_pct", 0.0), 2),
        "rounds": st.get("rounds"),
    }


def _progress_line(cand: Candidate) -> str:
    if cand.status == "kept":
        figures = [f"{cand.size_bytes or 0:,} bytes"]
        if cand.accuracy_drop is not None:
            figures.append(f"drop {cand.accuracy_drop:.2f} pts")
        if cand.cosine_min is not None:
            figures.append(f"cos min {cand.cosine_min:.5f}")
        if cand.tail is not None and cand.cosine_projected is not None:
            figures.append(
                f"projected to {cand.tail['reference_samples']} samples {cand.cosine_projected:.5f}"
            )
        return f"  {cand.name}: kept ({', '.join(figures)}; built in {cand.build_seconds:.1f} s)"
    return f"  {cand.name}: {cand.status}: {cand.reason}"


def _stage_checks() -> Any:
    """The stages' own int8 checks run on the calibration data here (the eval data is the search's, to judge
    by): their figures say so, not "no --eval-data given"."""
    from ptopt.compress.quantize.measure import no_eval_data_because

    return no_eval_data_because(
        "the int8 stage's own check: optimize judges a candidate on --eval-data only after it"
    )


def _quiet() -> Any:
    from ptopt.core.quiet import silenced

    # the stages report what matters; upstream loggers and warnings of a build are not the user's business
    return silenced(("torch", "onnxscript", "onnxruntime", "torchao"))


# -- --isa: the time the level checks keep (``ptopt.optimize.isa`` runs them after the search) ---------------

#: what a level check takes: a child's start-up (torch and ptopt import, the models load), then one
#: evaluation and a short timing per model (``per_level_s``); before any candidate is kept the search keeps
#: room for the reference and one candidate, and the reserve grows with the candidates kept
#: (``Search.reserved_s``), so what the checks turn out not to need goes back to the search
CHILD_START_S = 15.0
#: the candidates the reserve is sized for when no count is given (``reserve_s``' default)
EXPECTED_SURVIVORS = 4
#: the level checks never keep more than this share of ``--time-budget`` (all levels together): the estimate
#: rests on timings of the reference, and one disturbed by load elsewhere (MiniLM: 52.8 ms for ~7 ms) set
#: 250 of 360 s aside and starved the search for checks that took seconds
RESERVE_SHARE = 0.25


#: a capped level runs a model this much slower than this CPU's own (avx2 kernels on an avx512 machine)
CAPPED_SLOWDOWN = 1.5


def measured_reserve_s(
    levels: Sequence[str], cands: Sequence[Any], costs_of: Callable[[Any], Any], settings: Any
) -> float:
    """The level checks' time for candidates already kept, from what each measured here: opening it
    (loading, compiling: a child does it again), then at its own speed (``costs_of(c)``: ``Search.own_costs``)
    a pass over the held-out samples (half the eval data) and a short timing, at a capped level's speed. Not
    capped by ``RESERVE_SHARE``: these are measured, and a child cannot be stopped half way without losing its
    figures (all-MiniLM-L6-v2: 5 candidates, ~70 s where 32 s were kept)."""
    emulated = [lv for lv in levels if not is_native(lv)]
    if not emulated or not cands:
        return 0.0
    lat = minimal(settings.latency)

    def one(c: Any) -> float:
        own = costs_of(c)
        return c.open_seconds + CAPPED_SLOWDOWN * (own.eval_s / EVAL_PASSES / 2 + own.timing_s(lat))

    return len(emulated) * sum(one(c) for c in cands)


def per_level_s(costs: Any, settings: Any, models: int) -> float:
    """One child process judging ``models`` models (the reference included): its start, then each model's
    pass over the held-out samples (at most one pass over the eval data, at a capped level) and short timing."""
    return CHILD_START_S + models * (costs.eval_s / EVAL_PASSES + costs.timing_s(minimal(settings.latency)))


def reserve_s(levels: Sequence[str], costs: Any, settings: Any, survivors: int = EXPECTED_SURVIVORS) -> float:
    """Seconds to keep for the level checks out of the search's budget, with ``survivors`` candidates to
    judge: every emulated level's ``per_level_s``, at most ``RESERVE_SHARE`` of the budget, and never so much
    that the fp32 reference alone no longer fits."""
    emulated = [lv for lv in levels if not is_native(lv)]
    if not emulated:
        return 0.0
    need = len(emulated) * per_level_s(costs, settings, survivors + 1)
    room = max(0.0, settings.time_budget - costs.reference_s(settings))
    return min(need, RESERVE_SHARE * settings.time_budget, room)
