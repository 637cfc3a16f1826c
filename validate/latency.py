"""Latency per batch size: the same inputs and thread count for every runtime, warm-up, then
enough iterations for a stable median: p50/p90/p99 in milliseconds per batch and throughput in
samples per second at the median.

Every (artifact, batch size) is timed in ``rounds`` interleaved slices
(``ptopt.core.timing.measure_interleaved``) and its samples pooled, so all artifacts see the same
drift of a shared machine, and speedups compare like with like. All artifacts are loaded while
they are timed. An (artifact, batch size) whose median is stable stops its rounds early
(``median_stable``), after at least half of them, so the time goes where the noise is; the others
go on interleaved among themselves.

Inputs for batch size B are the data's first B samples (repeated when the data has fewer), so
every artifact is timed on identical tensors. Python's garbage collector is paused during each
timed slice.

On a GPU (a runner placed on ``cuda:N``), each batch is moved to the device once, before timing,
and every sample is the time between two CUDA events around the call, read after the end event
completed (``ptopt.core.timing.CudaEventTimer``; warm-up ends with ``torch.cuda.synchronize``): a
host timer around asynchronous kernel launches would time the launches, not the work. The stats
say which timer measured them (``"timer": "host" | "cuda_events"``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ptopt.core.data import Dataset
from ptopt.core.errors import UsageError
from ptopt.core.options import option
from ptopt.core.timing import MIN_ITERS, WARMUP_ITERS, WARMUP_SECONDS, measure_interleaved, round_spread
from ptopt.validate.noise import verdict

#: validation defaults: 3 s per (artifact, batch size) in 15 slices of 0.2 s. On the shared 2-core
#: development VM the speed of interpreter-bound work changes every fraction of a second and from
#: minute to minute (a fixed pure-Python loop: 1.1-1.6 ms). Measured in benchmarks/bench_validate.py,
#: spread of the p50 between consecutive runs: one 1 s window per artifact, median 13% and max 42%;
#: these defaults, median 3-4% and max 13-24% (torch at batch 1), batch 32 and ONNX Runtime within 9%.
MIN_SECONDS = 3.0
ROUNDS = 15
#: an (artifact, batch size) stops its rounds early once its median is stable: the median of its last
#: STABLE_WINDOW rounds' samples and that of the rounds before them both within STABLE_PCT % of the
#: pooled median, after at least half the rounds (and at least 5) and min_iters samples, and its rounds
#: so far not noisy by the report's rule (``validate.noise.verdict``)
STABLE_PCT = 2.0
STABLE_WINDOW = 3


@dataclasses.dataclass(frozen=True)
class LatencyOptions:
    """How long to time each (artifact, batch size).

    ``min_iters`` and ``min_seconds`` are totals per (artifact, batch size), spread over ``rounds``.
    Shorter settings are for tests and quick looks; they give less stable medians.
    """

    min_iters: int = option(
        MIN_ITERS, help="Timed iterations per artifact and batch size, at least.", applies=("model",)
    )
    min_seconds: float = option(
        MIN_SECONDS, help="Timed seconds per artifact and batch size, at least.", applies=("model",)
    )
    warmup_iters: int = WARMUP_ITERS
    warmup_seconds: float = WARMUP_SECONDS
    rounds: int = option(
        ROUNDS,
        help="Interleaved timing rounds: each artifact's timing is split into this many slices, taken in turn "
        "with the others', so all see the same machine (language models: generations per model).",
    )
    stable_pct: float = option(
        STABLE_PCT,
        help="Stop an artifact's rounds at a batch size once its median is stable within this %, after at "
        "least half of them (0: always run every round).",
        applies=("model",),
    )

    def __post_init__(self) -> None:
        for opt, value, low in (
            ("--min-iters", self.min_iters, 1),
            ("--min-seconds", self.min_seconds, 0),
            ("--rounds", self.rounds, 1),
            ("--stable-pct", self.stable_pct, 0),
        ):
            if value < low:
                raise UsageError(f"{opt} must be >= {low}, got {value}")


def warmup_seconds(options: LatencyOptions) -> float:
    """The warm-up's seconds per (artifact, batch size): ``warmup_seconds``, but never longer than the timing
    it precedes (``min_seconds``): a quick look (``--min-seconds 0.01``) is not spent warming up. The
    ``warmup_iters`` calls run whatever the seconds; the defaults (0.2 s before 3 s) are unchanged."""
    return min(options.warmup_seconds, options.min_seconds)


def min_stable_rounds(rounds: int) -> int:
    """How many rounds an (artifact, batch size) gets before it may stop early."""
    return max(5, -(-rounds // 2))


def median_stable(slices: list[list[float]], options: LatencyOptions) -> bool:
    """Whether the samples of ``slices`` (one list per round so far) have a stable median: see
    ``STABLE_PCT``. Never before ``min_stable_rounds`` rounds or ``min_iters`` samples."""
    import statistics

    if options.stable_pct <= 0 or len(slices) < min_stable_rounds(options.rounds):
        return False
    pooled = [t for s in slices for t in s]
    if len(pooled) < options.min_iters:
        return False
    mid = statistics.median(pooled)
    last = statistics.median([t for s in slices[-STABLE_WINDOW:] for t in s])
    before = statistics.median([t for s in slices[:-STABLE_WINDOW] for t in s])
    if verdict(round_spread([statistics.median(s) for s in slices])) != "stable":
        return False  # the report's one verdict (validate.noise): a cell it would call noisy runs on
    return mid > 0 and max(abs(last - mid), abs(before - mid)) <= options.stable_pct / 100 * mid


def batch_inputs(data: Dataset, batch_size: int) -> Any:
    """The first ``batch_size`` samples of ``data`` (cycled when it holds fewer)."""
    import torch

    if len(data) >= batch_size:
        return data.take(batch_size).x
    return data.select(torch.arange(batch_size) % len(data)).x


def skipped_reason(runner: Any, batch_size: int) -> str | None:
    """Why ``runner`` can't be timed at ``batch_size`` (its artifact's batch range), or None."""
    if runner.accepts_batch(batch_size):
        return None
    lo, hi = runner.batch_range
    return (
        f"the artifact takes batch sizes {lo}..{hi}"
        if lo != hi
        else f"the artifact has a fixed batch size of {lo}"
    )


def measure_runners(
    runners: Sequence[Any],
    data: Dataset,
    batch_sizes: list[int],
    options: LatencyOptions,
    guard: Callable[[Any, int], Any] | None = None,
) -> list[dict[int, dict]]:
    """[{batch_size: stats}] per runner, timed interleaved; a batch size an artifact cannot take gets
    {"skipped": why}. ``guard(runner, batch_size)`` wraps every timed slice of that runner."""
    inputs = {bs: batch_inputs(data, bs) for bs in batch_sizes}
    fns, sizes = {}, {}
    out: list[dict[int, dict]] = []
    for i, runner in enumerate(runners):
        lat: dict[int, dict] = {}
        for bs in batch_sizes:
            why = skipped_reason(runner, bs)
            if why:
                lat[bs] = {"skipped": why}
            else:
                fns[(i, bs)] = runner.timed_call(inputs[bs])
                sizes[(i, bs)] = bs
        out.append(lat)
    stats = measure_interleaved(
        fns,
        sizes,
        devices={key: runners[key[0]].timer_device for key in fns},
        rounds=options.rounds,
        min_iters=options.min_iters,
        min_seconds=options.min_seconds,
        warmup_iters=options.warmup_iters,
        warmup_seconds=warmup_seconds(options),
        guard=None if guard is None else (lambda key: guard(runners[key[0]], key[1])),
        stop=lambda key, slices: median_stable(slices, options),
    )
    for (i, bs), st in stats.items():
        out[i][bs] = st | {"verdict": verdict(st["round_spread_pct"])}
    return [{bs: lat[bs] for bs in batch_sizes} for lat in out]
