"""The report stack's shared vocabulary and noise rule (``ptopt.validate.reports.common``,
``ptopt.validate.noise``): one spelling of every number and one rule for the timing noise, for validate's
reports and optimize's alike. Pure functions: no model is run."""

from __future__ import annotations

import pytest

from ptopt.validate import gates, noise
from ptopt.validate.reports import common


@pytest.mark.parametrize(
    ("value", "unit", "reference", "want"),
    [
        (0.33, "pts", False, "+0.33 pts"),
        (0.61, "%", False, "+0.61%"),
        (-0.0012, "", False, "-0.00"),
        (None, "pts", False, "—"),
        (0.0, "pts", True, "ref"),
    ],
    ids=["points", "relative", "no-unit", "not-measured", "reference"],
)
def test_the_drop_is_spelled_with_its_unit(value, unit, reference, want):
    assert common.fmt_drop(value, unit, reference) == want


@pytest.mark.parametrize(
    ("args", "want"),
    [((2.6418,), "2.64x"), ((1.2, True), "1.20x~"), ((None,), "—"), ((1.0, False, True), "ref")],
    ids=["plain", "noisy", "not-measured", "reference"],
)
def test_speedup_spelling(args, want):
    assert common.fmt_speedup(*args) == want


def test_numbers():
    assert common.fmt_ms(13.8301) == "13.830" and common.fmt_ms(21.21, noisy=True) == "21.210~"
    assert common.fmt_mb(338_601) == "0.339" and common.fmt_cos(0.99781) == "0.997810"
    assert (
        common.fmt_metric(0.9911, percent=True) == "99.11" and common.fmt_metric(0.01234, False) == "0.01234"
    )
    assert common.fmt_frac(0.5) == "50.00%" and common.fmt_ms(None) == common.fmt_mb(None) == "—"


def test_machine_line_names_what_it_knows():
    m = {
        "cpu": {"model": "Xeon", "arch": "x86_64", "logical_cores": 8, "usable_cores": 4,
                "isa": {"avx2": True, "avx512_vnni": True, "amx_int8": False}},
        "os": "Linux 6.1",
        "versions": {"python": "3.11.7", "torch": "2.13.0"},
    }  # fmt: skip
    line = "Xeon (x86_64, 4 usable of 8 cores; ISA: avx2, avx512_vnni); Linux 6.1; threads: 2"
    assert common.machine_line(m, 2) == common.machine_line(m, 2, "cpu") == line
    assert common.machine_line(m, 2, "cuda:0") == line + "; device: cuda:0"
    assert (
        common.machine_line({"cpu": {"model": "?", "isa": {}}}, 1)
        == "? (ISA: none of the tracked); threads: 1"
    )
    assert common.versions_line(m) == "python 3.11.7, torch 2.13.0"


def test_one_noise_rule():
    """Rule 1 (a latency's rounds spread more than 25 %) and rule 2 (a figure within the combined spread
    of its threshold) are the functions validate's gates and optimize's search and reports call."""
    assert not noise.latency_noisy(25.0) and noise.latency_noisy(25.1) and not noise.latency_noisy(None)
    assert noise.combined_spread(3.0, 4.0) == 5.0 and noise.combined_spread(None, None) is None
    assert gates.spread_of({"round_spread_pct": 3.0}, None, {"round_spread_pct": 4.0}) == 5.0
    assert gates.within_noise is noise.within_noise
    assert noise.speedup_noisy(1.2, 24.0, 4.0) and not noise.speedup_noisy(4.35, 20.0, 4.0)
    assert noise.within_noise(1.1, 1.2, 10.0) and not noise.within_noise(1.0, 1.2, 10.0)
    assert common.NOISY_SPREAD_PCT == noise.NOISY_SPREAD_PCT == 25.0
    assert common.spread_note("m.onnx", 32, 31.4) == (
        "~ noisy: m.onnx at batch 32: the timing rounds spread 31% (IQR of the round medians): speedups at "
        "this batch size are not meaningful"
    )
