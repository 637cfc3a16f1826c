"""Latency per batch size: the same inputs and thread count for every runtime, warm-up, then
enough iterations for a stable median (``ptopt.core.timing.measure_latency``): p50/p90/p99 in
milliseconds per batch and throughput in samples per second at the median.

Inputs for batch size B are the data's first B samples (repeated when the data has fewer), so
every artifact is timed on identical tensors. Python's garbage collector is paused while timing.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

from ptopt.core.data import Dataset
from ptopt.core.timing import MIN_ITERS, MIN_SECONDS, WARMUP_ITERS, WARMUP_SECONDS, measure_latency


@dataclasses.dataclass(frozen=True)
class LatencyOptions:
    """How long to time each (artifact, batch size). Shorter settings are for tests and quick looks."""

    min_iters: int = MIN_ITERS
    min_seconds: float = MIN_SECONDS
    warmup_iters: int = WARMUP_ITERS
    warmup_seconds: float = WARMUP_SECONDS


def batch_inputs(data: Dataset, batch_size: int) -> Any:
    """The first ``batch_size`` samples of ``data`` (cycled when it holds fewer)."""
    import torch

    if len(data) >= batch_size:
        return data.take(batch_size).x
    return data.select(torch.arange(batch_size) % len(data)).x


def measure_runner(runner: Any, data: Dataset, batch_sizes: list[int], options: LatencyOptions) -> dict[int, dict]:
    """{batch_size: stats} for one runner; a batch size the artifact cannot take gets {"skipped": why}."""
    out: dict[int, dict] = {}
    for bs in batch_sizes:
        if not runner.accepts_batch(bs):
            lo, hi = runner.batch_range
            out[bs] = {"skipped": f"the artifact takes batch sizes {lo}..{hi}" if lo != hi
                       else f"the artifact has a fixed batch size of {lo}"}
            continue
        fn = runner.timed_call(batch_inputs(data, bs))
        enabled = gc.isenabled()
        gc.disable()
        try:
            out[bs] = measure_latency(fn, bs, min_iters=options.min_iters, min_seconds=options.min_seconds,
                                      warmup_iters=options.warmup_iters, warmup_seconds=options.warmup_seconds)
        finally:
            if enabled:
                gc.enable()
    return out
