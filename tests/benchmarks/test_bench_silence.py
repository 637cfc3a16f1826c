"""benchmarks/bench_silence.py: the stretches without output it reports, from time-stamped lines (no
timing here: the lines carry made-up times), and its reader on a real process."""

from __future__ import annotations

import os
import sys

from tests.benchmarks import bench_script


def test_silences_are_the_gaps_over_ten_seconds_with_the_line_before():
    lines = [(2.0, "err", "loading"), (14.5, "err", "  loading: still working (8 s)"), (15.0, "out", "wrote")]
    with bench_script("bench_silence") as bench:
        assert bench.silences(lines, 26.0) == [(2.0, 12.5, "loading"), (15.0, 11.0, "wrote")]
        assert bench.silences(lines, 16.0) == [(2.0, 12.5, "loading")]
        assert bench.silences([], 3.0) == []


def test_both_pipes_are_read():
    script = "import sys; print('a', flush=True); print('b', file=sys.stderr); sys.exit(3)"
    with bench_script("bench_silence") as bench:
        code, lines, total = bench.timed_lines([sys.executable, "-c", script], dict(os.environ))
    assert code == 3 and sorted((name, text) for _, name, text in lines) == [("err", "b"), ("out", "a")]
    assert total >= max(t for t, _, _ in lines)
