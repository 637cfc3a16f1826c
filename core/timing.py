"""Latency measurement shared by validation and benchmarks: warm-up, then enough iterations for a
stable median; p50/p90/p99 and throughput. One thread count for every runtime (``threads``)."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator

#: defaults: at least this many timed iterations and this much timed wall time
MIN_ITERS = 20
MIN_SECONDS = 1.0
MAX_ITERS = 10_000
WARMUP_ITERS = 5
WARMUP_SECONDS = 0.2


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    k = (len(sorted_values) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def measure_latency(fn: Callable[[], Any], batch_size: int = 1, min_iters: int = MIN_ITERS,
                    min_seconds: float = MIN_SECONDS, max_iters: int = MAX_ITERS,
                    warmup_iters: int = WARMUP_ITERS, warmup_seconds: float = WARMUP_SECONDS) -> dict[str, float]:
    """Time ``fn()`` (one batch): warm up, then run until both ``min_iters`` and ``min_seconds`` are met.

    Returns milliseconds per batch (p50, p90, p99, mean, min, stdev), iterations, and samples/s at p50.
    """
    t_end = time.perf_counter() + warmup_seconds
    i = 0
    while i < warmup_iters or time.perf_counter() < t_end:
        fn()
        i += 1
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() - start < min_seconds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    s = sorted(times)
    p50 = percentile(s, 50)
    return {
        "p50_ms": p50, "p90_ms": percentile(s, 90), "p99_ms": percentile(s, 99),
        "mean_ms": statistics.fmean(s), "min_ms": s[0], "stdev_ms": statistics.pstdev(s),
        "iterations": len(s), "batch_size": batch_size, "throughput_per_s": batch_size * 1e3 / p50,
    }


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
