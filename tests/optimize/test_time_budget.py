"""``optimize --time-budget`` as a user runs it: the estimates a skip rests on, the time kept for --isa's level
checks, the end of the run (timing, writing -o) counted, and a plain line naming what ran over."""

from __future__ import annotations

import dataclasses
import types

import pytest

from tests.helpers import tiny_cnn
from tests.optimize.test_optimize import FAST, data  # noqa: F401 - the data fixture


def _costs(eval_s: float, batch_ms: float = 7.0):
    from ptopt.optimize.search import Costs

    return Costs({1: batch_ms / 16e3, 16: batch_ms / 1e3}, eval_s=eval_s)


def test_the_level_checks_keep_what_the_kept_candidates_measured_past_the_share(monkeypatch):
    """MiniLM, --time-budget 6m --isa avx2: the child judging 5 candidates took ~70 s where 32 s (growing by
    2.5 s a candidate) were kept: each candidate's own open and speed, measured here, now size it, and a
    measured need is not cut to ``RESERVE_SHARE`` (the child cannot stop half way)."""
    from ptopt.optimize import search as osearch
    from ptopt.optimize.candidates import Context, select
    from ptopt.validate.latency import LatencyOptions

    settings = osearch.Settings([1, 16], "any", 360.0, LatencyOptions(), 1, None, 0.98, isa=("avx",))
    monkeypatch.setattr(osearch.time, "perf_counter", lambda: 0.0)
    ctx = Context(tiny_cnn(), None, None, None, None, None, 0.98, lambda: 0.0)
    names = ["fp32-openvino", "bf16-openvino", "int8-openvino", "fp32-torchscript"]
    search = osearch.Search(ctx, select(names), settings, _costs(1.0), osearch.Clock(360.0))
    try:
        for c in search.candidates[1:]:  # opening as measured on all-MiniLM-L6-v2 on 2 busy cores
            c.status, c.within_budget, c.open_seconds = "kept", True, 25.0
            c.probe_ms = {"1": 10.0, "16": 100.0}
        assert search.reserved_s() > osearch.RESERVE_SHARE * 360.0
        assert search.reserved_s() >= 4 * 25.0
        # the final timing opens them again: promised before any later build
        assert search.after_s() == pytest.approx(4 * 25.0)
    finally:
        search.close()


def _ctx(eval_pass_s: float, left: float, **kw):
    from ptopt.optimize.candidates import Context

    ctx = Context(tiny_cnn(), None, list(range(256)), None, None, None, 0.98, lambda: left, **kw)
    ctx.eval_pass_s = lambda: eval_pass_s
    return ctx


def test_the_float_layer_search_estimate_counts_its_ranking_pass():
    """mobilenet_v3_small (54 layers), --time-budget 3m: int8-openvino-float-layers was priced at four NNCF
    builds (~88 s) and ran 159 s, all of it ranking the layers (one eager pass each), then had no time for a
    single NNCF build. The estimate now counts one pass per layer over the search's half of the eval data."""
    from ptopt.optimize.candidates import _float_layers_fit

    ctx = _ctx(eval_pass_s=40.0, left=100.0)
    ctx.status["int8-openvino"] = "rejected"
    ctx.build_seconds["int8-openvino"] = 20.0  # 4 builds: 80 s, which fit in 100 s
    why = _float_layers_fit(ctx)
    assert why is not None and why.startswith("time budget: the float-layer search (ranking 3 layers")
    ctx.eval_pass_s = lambda: 1.0
    assert _float_layers_fit(ctx) is None  # a cheap ranking fits


def test_the_sensitivity_estimate_is_a_pass_per_layer_not_half_a_plain_build():
    """MiniLM: "int8-dynamic-search: its sensitivity pass (36 layers) needs about 7411 s" priced each layer at
    half the plain int8-dynamic build (411 s, then with quantize's advice search in it). A layer of the
    sensitivity pass is a quantized copy measured on up to 256 samples: an eager pass and a share of a build."""
    from torch import nn

    from ptopt.optimize.candidates import QUANTIZE_SHARE, _search_fits

    ctx = _ctx(eval_pass_s=2.0, left=200.0)
    ctx.module = nn.Sequential(*[nn.Linear(4, 4) for _ in range(36)])
    ctx.build_seconds["int8-dynamic"] = 30.0
    assert _search_fits(ctx, "int8-dynamic", "dynamic") is None  # 36 x (2 + 3) = 180 s fits in 200
    ctx.build_seconds["int8-dynamic"] = 411.0
    why = _search_fits(ctx, "int8-dynamic", "dynamic")
    assert f"needs about {36 * (2.0 + QUANTIZE_SHARE * 411.0):.0f} s" in why


def test_a_run_over_its_budget_says_which_phase_and_by_how_much():
    from ptopt.optimize.report import overrun, search_line

    report = {
        "model": "m", "batch_sizes": [1, 16], "time_budget_s": 360.0, "elapsed_s": 455.0,
        "time_phases": {"loading": {"seconds": 20.0}, "builds": {"seconds": 250.0},
                        "timing": {"seconds": 30.0, "planned": 28.0},
                        "--isa level checks": {"seconds": 92.0, "planned": 17.0},
                        "writing": {"seconds": 3.0, "planned": 2.5}},
        "candidates": [{"name": "int8-dynamic", "estimate_s": 40.0, "spent_s": 61.0},
                       {"name": "fp32-aoti", "estimate_s": 233.0}],
    }  # fmt: skip
    report["over_budget"] = overrun(report)
    assert report["over_budget"]["seconds"] == 95.0
    line = search_line(report)
    assert (
        "search took 455.0 s of a 360 s time budget (over by 95 s: --isa level checks took 92 s, 17 s planned; "
        in line
    )
    assert "int8-dynamic took 61 s, estimated 40 s; timing took 30 s, 28 s planned)" in line
    within = dict(report, elapsed_s=300.0)
    assert overrun(within) is None and "over by" not in search_line(dict(within, over_budget=None))


def test_the_elapsed_time_counts_writing_the_folder(tmp_path, data):  # noqa: F811
    """The reports' ``elapsed_s`` was taken before -o was written; now the writing is in it (and a phase)."""
    import json

    import ptopt

    res = ptopt.optimize(tiny_cnn(), calib_data=data["calib"], eval_data=data["eval"], min_cosine=0.5,
                         candidates="fp32-torchscript", output=tmp_path / "opt", **FAST)  # fmt: skip
    saved = json.loads((tmp_path / "opt" / "report.json").read_text())
    phases = saved["time_phases"]
    assert {"loading", "builds", "timing", "writing"} <= set(phases)
    assert (
        phases["writing"]["planned"] >= 0
        and saved["elapsed_s"] >= sum(p["seconds"] for p in phases.values()) - 0.5
    )
    assert res.report["elapsed_s"] == saved["elapsed_s"]


def test_the_heartbeat_of_the_level_child_names_the_step(monkeypatch, tmp_path):
    """The --isa child ran ~90 s saying only "ptopt optimize: still working (595 s)"."""
    import torch

    from ptopt.core import progress
    from ptopt.core.data import Dataset
    from ptopt.optimize import isa as oisa
    from ptopt.optimize.candidates import Candidate, select
    from ptopt.optimize.search import Settings
    from ptopt.validate import isa as visa
    from ptopt.validate.latency import LatencyOptions

    cands = [Candidate(s) for s in select(["fp32-torchscript", "int8-fx"])]
    for c in cands[1:]:
        c.status, c.within_budget, c.work_path = "kept", True, tmp_path / f"{c.name}{c.suffix}"
    held = Dataset(torch.randn(8, 1, 8, 8))
    settings = Settings([1], "any", 60.0, LatencyOptions(), 1, None, 0.9)
    ev = types.SimpleNamespace(heldout=held, held_ref=torch.randn(8, 10), eval_bs=8)
    search = types.SimpleNamespace(candidates=cands, settings=settings, evaluator=ev,
                                   ctx=types.SimpleNamespace(module=tiny_cnn()))  # fmt: skip
    seen = []

    def fake_run_level(job, level, skip):
        seen.append([s.title for s in progress._current().steps])
        return {"models": {}, "crash": "faked", "aten_capability": None}

    monkeypatch.setattr(visa, "run_level", fake_run_level)
    with progress.reporting(lambda line: None):
        oisa.check_levels(search, ["avx"], lambda msg: None)
    assert seen == [["judging 2 candidate(s) at avx in a child process"]]


def test_the_layer_ranking_stops_when_the_rest_would_not_fit():
    """The float-layer search's ranking (one eager pass per layer) ran 150 s unchecked on mobilenet_v3_small
    and left no time for one NNCF build: it now stops, at the pace so far, when the rest would not fit."""
    import torch

    from ptopt.core.data import Dataset
    from ptopt.optimize.float_layers import OutOfTime, sensitivity

    torch.manual_seed(0)
    calib, samples = Dataset(torch.randn(16, 1, 8, 8)), Dataset(torch.randn(8, 1, 8, 8))
    with pytest.raises(OutOfTime, match=r"ranking 3 layers stopped after 1 .*the other 2 need about"):
        sensitivity(tiny_cnn().eval(), calib, samples, seconds_left=lambda: 0.0)
    assert len(sensitivity(tiny_cnn().eval(), calib, samples, seconds_left=lambda: 1e9)) == 3


def test_the_final_timing_is_planned_at_each_candidates_own_speed(monkeypatch):
    """mobilenet_v3_small, 3m: 7 artifacts priced as 7 references (8 s) took 44 s to time: torch's fp32
    formats ran slower than the reference. Each kept candidate's timing is now priced at its own fastest call
    at each batch size (its probe when screened)."""
    from ptopt.optimize import search as osearch
    from ptopt.optimize.candidates import Context, select
    from ptopt.validate.latency import LatencyOptions

    settings = osearch.Settings([1, 16], "any", 180.0, LatencyOptions(), 1, None, 0.98)
    monkeypatch.setattr(osearch.time, "perf_counter", lambda: 0.0)
    ctx = Context(tiny_cnn(), None, None, None, None, None, 0.98, lambda: 0.0)
    costs = _costs(eval_s=3.0, batch_ms=100.0)  # one reference pass: 2 s
    search = osearch.Search(
        ctx, select(["fp32-torchscript", "fp32-onnx"]), settings, costs, osearch.Clock(180.0)
    )
    try:
        for c in search.candidates[1:]:  # 4x the reference at each batch size
            c.status, c.probe_ms = "kept", {"1": 4 * 100.0 / 16, "16": 400.0}
        low = osearch.minimal(settings.latency)
        assert search.timings_s(low) > 3 * costs.timing_s(low)
        search.candidates[2].probe_ms = {}  # not probed: the reference's speed
        slow = dataclasses.replace(costs, batch_s={b: 4 * t for b, t in costs.batch_s.items()})
        assert search.timings_s(low) == pytest.approx(2 * costs.timing_s(low) + slow.timing_s(low))
    finally:
        search.close()
