"""One timing verdict per cell (``ptopt.validate.noise``): a cell is stable or noisy by one rule, the early
stop of its rounds asks the same rule, a run whose cells are mostly noisy says the machine is busy and
times again (up to ``BUSY_RETIMES``), and no ★ best is crowned on noise, in every report.

The timings are made noisy on purpose (the measured round spreads are overwritten), so nothing here
depends on how busy the machine running the tests is."""

from __future__ import annotations

import json

import pytest

import ptopt.validate.api as api
from ptopt.validate import noise
from ptopt.validate.latency import LatencyOptions, median_stable
from tests.validate.conftest import FACTORY, FAST

QUICK = LatencyOptions(min_iters=3, min_seconds=0.01, warmup_iters=1, warmup_seconds=0.0, rounds=2)


@pytest.mark.parametrize(
    "spread, verdict",
    [(None, "stable"), (0.0, "stable"), (25.0, "stable"), (25.1, "noisy"), (1107.0, "noisy")],
)
def test_one_verdict_per_cell(spread, verdict):
    assert noise.verdict(spread) == verdict


@pytest.mark.parametrize(
    "noisy, cells, busy", [(0, 0, False), (1, 2, False), (2, 3, True), (13, 16, True), (3, 16, False)]
)
def test_busy_is_most_cells_noisy(noisy, cells, busy):
    assert noise.busy(noisy, cells) is busy


def _cell(p50: float, spread: float) -> dict:
    return {"p50_ms": p50, "round_spread_pct": spread}


@pytest.mark.parametrize(
    "best, runner_up, why",
    [
        (_cell(1.0, 2.0), _cell(2.0, 2.0), None),  # a lead of 100% against spreads of 2%
        (_cell(1.0, 2.0), None, None),  # alone
        (_cell(1.0, 40.0), _cell(9.0, 1.0), "its own timing rounds spread 40%"),
        (_cell(1.0, 8.0), _cell(1.1, 8.0), "its lead (10%) is within the combined spread"),
        ({"skipped": "no batch 1"}, _cell(1.0, 1.0), "it has no timing"),
    ],
    ids=["clear", "alone", "noisy-itself", "within-spread", "untimed"],
)
def test_a_best_is_clear_only_outside_the_noise(best, runner_up, why):
    got = noise.clear_lead(best, runner_up)
    assert got == why if why is None else got.startswith(why)


def test_a_cell_the_report_calls_noisy_never_stops_early():
    options = LatencyOptions(rounds=12, min_iters=1, stable_pct=1000.0)  # any median is "stable"
    steady = [[1.0]] * 6
    jumpy = [[1.0], [1.6], [1.0], [1.6], [1.0], [1.6]]  # medians within 1000%, rounds spread 60%
    assert median_stable(steady, options)
    assert noise.verdict(60.0) == "noisy" and not median_stable(jumpy, options)


@pytest.fixture
def noisy_timing(monkeypatch):
    """Every timing measured as usual, then reported with rounds spread 80% (a busy machine); counts
    how often everything was timed."""
    calls = []
    measure = api.measure_runners

    def noisy(*args, **kwargs):
        calls.append(1)
        return [
            {bs: st | {"round_spread_pct": 80.0} for bs, st in lat.items()}
            for lat in measure(*args, **kwargs)
        ]

    monkeypatch.setattr(api, "measure_runners", noisy)
    return calls


def test_a_busy_machine_is_said_timed_again_and_crowns_no_best(artifacts, noisy_timing):
    said: list[str] = []
    res = api.validate(
        FACTORY, [artifacts["torchscript"]], artifacts["data"], batch_sizes=(1,), threads=1, latency=QUICK,
        progress=said.append,
    )  # fmt: skip
    assert len(noisy_timing) == 1 + noise.BUSY_RETIMES
    assert (
        sum(m.startswith("the machine is busy: 2 of 2 timings are noisy") for m in said) == noise.BUSY_RETIMES
    )
    assert res.data["timing_noise"] == {
        "noisy_cells": 2,
        "cells": 2,
        "retimed": noise.BUSY_RETIMES,
        "busy": True,
    }
    # the fastest by the medians is still named, but not crowned
    assert res.data["best"] == "tiny.ts.pt" and res.data["best_verdict"] == "noisy"
    assert "its own timing rounds spread 80%" in res.data["best_why"]
    assert not any(e["best"] for e in res.entries)


def test_every_report_says_no_clear_best_on_noise(cli, artifacts, noisy_timing, tmp_path):
    code, out, err = cli(
        "validate", FACTORY, artifacts["torchscript"], "--data", artifacts["data"], "--batch-sizes", "1",
        "--threads", "1", *FAST, "--json", tmp_path / "r.json", "--markdown", tmp_path / "r.md",
    )  # fmt: skip
    assert code == 0, err
    assert "the machine is busy" in err and "★" not in out
    assert "no clear best (the timings are noisy; fastest by the medians: tiny.ts.pt)" in out
    assert "busy machine: 2 of 2 timings are noisy, after timing 1 more time(s)" in out
    md = (tmp_path / "r.md").read_text()
    assert "| ★ |" not in md and "no clear best" in md
    assert json.loads((tmp_path / "r.json").read_text())["best_verdict"] == "noisy"
