"""The accuracy-aware searches' timing, shortened for tests/compress: what these tests check is which
candidates are tried, measured and recorded, never how fast one is (none compares latencies to a
figure; a choice between candidates that both hold accepts either). Every candidate is still timed
(its ``min_iters``, interleaved with fp32). test_autoquant.py: 18.9 of its ~50 s under cProfile were
timing at 1.0 s (fp32) and 0.3 s (each candidate)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _short_search_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    from ptopt.compress.quantize import autoquant_tuner

    monkeypatch.setattr(autoquant_tuner, "FP32_TIMING_SECONDS", 0.2)
    monkeypatch.setattr(autoquant_tuner, "CANDIDATE_TIMING_SECONDS", 0.1)
