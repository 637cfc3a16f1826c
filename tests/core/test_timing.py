"""Latency measurement: percentiles, and interleaved rounds that spread every candidate over the run."""

import contextlib
import gc

import pytest

from ptopt.core.timing import measure_interleaved, measure_latency, percentile, summarize


def test_percentile_and_summary():
    s = [1.0, 2.0, 3.0, 4.0]
    assert percentile(s, 50) == 2.5 and percentile(s, 0) == 1.0 and percentile(s, 100) == 4.0
    st = summarize([4.0, 1.0, 3.0, 2.0], batch_size=8)
    assert st["p50_ms"] == 2.5 and st["min_ms"] == 1.0 and st["iterations"] == 4
    assert st["throughput_per_s"] == pytest.approx(8 * 1e3 / 2.5)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_measure_latency_meets_min_iters():
    calls = []
    st = measure_latency(
        lambda: calls.append(1), min_iters=7, min_seconds=0.0, warmup_iters=2, warmup_seconds=0.0
    )
    assert st["iterations"] == 7 and len(calls) == 9


def test_interleaved_rounds_rotate_and_pool():
    log = []
    fns = {k: (lambda k=k: log.append(k)) for k in "abc"}
    guarded = []

    @contextlib.contextmanager
    def guard(key):
        guarded.append(key)
        yield

    assert gc.isenabled()
    stats = measure_interleaved(
        fns,
        {"a": 1, "b": 4, "c": 32},
        rounds=3,
        min_iters=6,
        min_seconds=0.0,
        warmup_iters=0,
        warmup_seconds=0.0,
        guard=guard,
    )
    assert gc.isenabled()  # paused only while timing
    # each round visits every key, starting one further along, every other round backwards: no key always
    # follows the same one. A slice is 2 calls, plus 1 warm-up call after the first round
    assert guarded == ["a", "b", "c", "a", "c", "b", "c", "a", "b"]
    assert log[:6] == ["a", "a", "b", "b", "c", "c"] and len(log) == 3 * (2 + 3 + 3)
    for _k, st in stats.items():
        assert st["iterations"] == 6 and st["rounds"] == 3 and len(st["round_p50_ms"]) == 3
    assert stats["c"]["batch_size"] == 32


def test_interleaved_failure_goes_through_the_guard():
    class Named(Exception):
        pass

    @contextlib.contextmanager
    def guard(key):
        try:
            yield
        except ZeroDivisionError as e:
            raise Named(key) from e

    with pytest.raises(Named, match="bad"):
        measure_interleaved(
            {"ok": lambda: None, "bad": lambda: 1 / 0}, rounds=2, min_iters=1, min_seconds=0.0, guard=guard
        )
    assert gc.isenabled()
    with pytest.raises(ValueError, match="rounds"):
        measure_interleaved({"a": lambda: None}, rounds=0)


def test_round_spread_is_the_interquartile_range_of_round_medians():
    from ptopt.core.timing import round_spread

    assert round_spread([2.0]) == 0.0 and round_spread([2.0, 2.0, 2.0]) == 0.0
    assert round_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(100 * (4 - 2) / 3)
    assert round_spread([5.0, 1.0, 4.0, 2.0, 3.0]) == pytest.approx(
        100 * (4 - 2) / 3
    )  # order does not matter
