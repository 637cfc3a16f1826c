"""Latency measurement shared by validation and benchmarks: warm-up, then enough iterations for a
stable median; p50/p90/p99 and throughput. One thread count for every runtime (``threads``).

Two ways to time:

- ``measure_latency(fn)``: one callable, one contiguous window.
- ``measure_interleaved({key: fn})``: several callables compared with each other. Their time is cut
  into ``rounds`` slices, visited in turn (the order rotates every round and reverses every other
  one), and each key's samples are pooled. A shared CPU drifts over seconds (other tenants, memory-bandwidth contention,
  frequency): a contiguous window catches one state of the machine, so two runs can disagree by
  more than the difference being measured. Interleaving spreads every candidate over the whole
  measurement, so each sees the same mix of states, and a second run sees nearly the same mix.

What one sample is depends on where the work runs (``timer_for(device)``): on the CPU, host time
around the call (``time.perf_counter``); on a CUDA device, the time between two CUDA events recorded
on the current stream before and after the call (``torch.cuda.Event(enable_timing=True)``), read
after the end event has completed. A host timer around asynchronous kernel launches measures the
launches, not the work; the events measure the work on the GPU, and the synchronization on the end
event keeps launches from queuing up across samples. Warm-up ends with ``torch.cuda.synchronize``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

from ptopt.core import progress

#: defaults: at least this many timed iterations and this much timed wall time
MIN_ITERS = 20
MIN_SECONDS = 1.0
MAX_ITERS = 10_000
WARMUP_ITERS = 5
WARMUP_SECONDS = 0.2
ROUNDS = 5


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    k = (len(sorted_values) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summarize(times_ms: list[float], batch_size: int = 1) -> dict[str, float]:
    """Milliseconds per batch (p50, p90, p99, mean, min, stdev), iterations, and samples/s at p50."""
    s = sorted(times_ms)
    p50 = percentile(s, 50)
    return {
        "p50_ms": p50,
        "p90_ms": percentile(s, 90),
        "p99_ms": percentile(s, 99),
        "mean_ms": statistics.fmean(s),
        "min_ms": s[0],
        "stdev_ms": statistics.pstdev(s),
        "iterations": len(s),
        "batch_size": batch_size,
        "throughput_per_s": batch_size * 1e3 / p50,
    }


class HostTimer:
    """Host wall time around one call (``time.perf_counter``): for work that is done when it returns."""

    kind = "host"

    def time_ms(self, fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def sync(self) -> None:
        """Wait for outstanding work (none on the host)."""


class CudaEventTimer:
    """GPU time of one call on ``device``: CUDA events recorded on the current stream before and after
    it, read once the end event completed (so no launch queue builds up between samples)."""

    kind = "cuda_events"

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        with torch.cuda.device(device):
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def time_ms(self, fn: Callable[[], Any]) -> float:
        import torch

        with torch.cuda.device(self.device):
            self._start.record()
            fn()
            self._end.record()
            self._end.synchronize()
        return float(self._start.elapsed_time(self._end))

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)


def timer_for(device: Any = None) -> HostTimer | CudaEventTimer:
    """The timer for work on ``device`` (a ``torch.device`` or its name; None: the host)."""
    kind = getattr(device, "type", str(device).split(":")[0]) if device is not None else "cpu"
    return CudaEventTimer(device) if kind == "cuda" else HostTimer()


def _warm_up(fn: Callable[[], Any], iters: int, seconds: float, timer: Any = None) -> None:
    t_end = time.perf_counter() + seconds
    i = 0
    while i < iters or time.perf_counter() < t_end:
        fn()
        i += 1
    if timer is not None:
        timer.sync()  # the warm-up's queued GPU work must not land in the first timed sample


def _timed(
    fn: Callable[[], Any], min_iters: int, min_seconds: float, max_iters: int, timer: Any = None
) -> list[float]:
    timer = timer or HostTimer()
    times: list[float] = []
    start = time.perf_counter()  # how long to go on: wall time, whatever each sample measures
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() - start < min_seconds):
        times.append(timer.time_ms(fn))
    return times


def measure_latency(
    fn: Callable[[], Any],
    batch_size: int = 1,
    min_iters: int = MIN_ITERS,
    min_seconds: float = MIN_SECONDS,
    max_iters: int = MAX_ITERS,
    warmup_iters: int = WARMUP_ITERS,
    warmup_seconds: float = WARMUP_SECONDS,
    device: Any = None,
) -> dict[str, float]:
    """Time ``fn()`` (one batch): warm up, then run until both ``min_iters`` and ``min_seconds`` are met.
    ``device``: where ``fn`` runs its work (see :func:`timer_for`; None: the host).

    Returns ``summarize``'s statistics of the timed iterations.
    """
    timer = timer_for(device)
    _warm_up(fn, warmup_iters, warmup_seconds, timer)
    return summarize(_timed(fn, min_iters, min_seconds, max_iters, timer), batch_size)


def measure_interleaved(
    fns: Mapping[Hashable, Callable[[], Any]],
    batch_sizes: Mapping[Hashable, int] | None = None,
    *,
    rounds: int = ROUNDS,
    min_iters: int = MIN_ITERS,
    min_seconds: float = MIN_SECONDS,
    max_iters: int = MAX_ITERS,
    warmup_iters: int = WARMUP_ITERS,
    warmup_seconds: float = WARMUP_SECONDS,
    guard: Callable[[Hashable], contextlib.AbstractContextManager] | None = None,
    stop: Callable[[Hashable, list[list[float]]], bool] | None = None,
    devices: Mapping[Hashable, Any] | None = None,
) -> dict[Hashable, dict[str, Any]]:
    """Time several callables in ``rounds`` interleaved slices; {key: statistics of the pooled samples}.

    ``min_iters``/``min_seconds``/``max_iters`` are totals per key, split evenly over the rounds.
    Each key is warmed up fully before its first slice and briefly (a tenth, at least one call)
    before every later one, since the other keys' slices evict its caches. Statistics are
    ``summarize``'s, plus ``rounds``, ``round_p50_ms`` (each slice's median) and
    ``round_spread_pct`` (``round_spread``: how much the machine drifted during the measurement).
    ``guard(key)`` wraps each slice (e.g. to name a failure). ``stop(key, slices)`` (the samples of
    each slice so far) is asked after each of the key's slices: True ends that key's rounds early
    (its ``rounds`` says how many it got); the other keys go on interleaved among themselves.
    Python's garbage collector is paused during each slice; its young generations are collected
    between slices, so garbage cannot pile up over a long measurement. ``devices[key]``: where that
    key's work runs (:func:`timer_for`: CUDA events on a GPU; default the host).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    keys = list(fns)
    sizes = dict(batch_sizes or {})
    per_iters = max(1, math.ceil(min_iters / rounds))
    per_seconds = min_seconds / rounds
    per_max = max(1, max_iters // rounds)
    samples: dict[Hashable, list[float]] = {k: [] for k in keys}
    round_p50: dict[Hashable, list[float]] = {k: [] for k in keys}
    slices: dict[Hashable, list[list[float]]] = {k: [] for k in keys}
    done: set[Hashable] = set()
    timers = {k: timer_for((devices or {}).get(k)) for k in keys}
    enabled = gc.isenabled()
    what = f"timing {len(keys)} (model, batch size) pairs in {rounds} rounds"
    try:
        with progress.step(what, rounds, "rounds", announce=False) as shown:
            for r in range(rounds):
                # rotate the start every round and reverse every other one, so no key always follows the same one
                order = keys[r % len(keys) :] + keys[: r % len(keys)] if keys else []
                if r % 2:
                    order.reverse()
                for k in (k for k in order if k not in done):
                    if enabled:
                        gc.collect(1)  # young generations only (a full pass costs ~0.15 s with torch loaded)
                    gc.disable()
                    try:
                        with guard(k) if guard is not None else contextlib.nullcontext():
                            warm = (warmup_iters, warmup_seconds) if r == 0 else None
                            t = _slice(fns[k], warm or (max(1, warmup_iters // 10), warmup_seconds / 10),
                                       (per_iters, per_seconds, per_max), timers[k])  # fmt: skip
                    finally:
                        if enabled:
                            gc.enable()
                    samples[k] += t
                    round_p50[k].append(statistics.median(t))
                    slices[k].append(t)
                    if stop is not None and stop(k, slices[k]):
                        done.add(k)
                shown.advance()
    finally:
        if enabled:
            gc.enable()
    return {
        k: summarize(samples[k], sizes.get(k, 1))
        | {
            "rounds": len(round_p50[k]),
            "round_p50_ms": round_p50[k],
            "round_spread_pct": round_spread(round_p50[k]),
            "timer": timers[k].kind,
        }
        for k in keys
    }


def _slice(
    fn: Callable[[], Any], warmup: tuple[int, float], per: tuple[int, float, int], timer: Any
) -> list[float]:
    """One key's slice of a round: a warm-up of ``warmup`` (iterations, seconds), then the timed calls
    (``per``: at least iterations, at least seconds, at most iterations)."""
    _warm_up(fn, *warmup, timer)
    return _timed(fn, *per, timer)


def round_spread(round_medians: list[float]) -> float:
    """The interquartile range of per-round medians, in percent of their median (0 for one round).

    How much one callable's speed changed from round to round while it was timed: the machine's
    drift during the measurement, not a bound on how far the next run's median will be.
    """
    s = sorted(round_medians)
    mid = percentile(s, 50)
    return 100.0 * (percentile(s, 75) - percentile(s, 25)) / mid if mid > 0 else 0.0


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[int]:
    """Run with ``n`` intra-op torch threads (None: leave as is); restores the previous count."""
    import torch

    prev = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(prev)
