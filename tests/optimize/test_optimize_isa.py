"""``optimize --isa``: a candidate is within the budget only if it holds at every CPU level (each judged in
a child process with the kernel libraries capped); the report says per level. ``avx`` is below every CPU
the project runs on, so these hold on each."""

from __future__ import annotations

import json

import pytest

from ptopt.core.errors import UsageError
from tests.helpers import assert_refused, tiny_cnn
from tests.optimize.test_optimize import FACTORY, FAST, FAST_CLI, data  # noqa: F401 - the data fixture


def test_every_kept_candidate_judged_at_the_level(cli, tmp_path, data):  # noqa: F811
    """End to end through the CLI, one candidate (a runtime that ignores the caps: the next test)."""
    code, out, err = cli(
        "optimize", FACTORY, "--calib-data", data["calib"], "--eval-data", data["eval"], "--accuracy-budget",
        "5", "--candidates", "fp32-torchscript", "--isa", "avx", *FAST_CLI, "-o", "opt",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads((tmp_path / "opt" / "report.json").read_text())
    assert report["isa"]["levels"] == ["avx"] and report["isa"]["samples"] == 160
    by = {c["name"]: c for c in report["candidates"]}
    ts = by["fp32-torchscript"]["by_isa"]["avx"]
    assert ts["within_budget"] is True and ts["accuracy_drop"] == pytest.approx(0, abs=0.7)
    assert set(ts["speedup"]) == {"1", "4"} and ts["coverage"] in ("partly", "follows")
    assert "--isa avx: judging 1 candidate(s) in a child process" in err
    assert (
        "s --time-budget set aside for the level checks after the search" in err
    )  # what the skips are short of
    assert "per CPU level (--isa)" in out
    assert "Per CPU level" in (tmp_path / "opt" / "summary.md").read_text()


def test_the_reserve_rests_on_the_fastest_reference_call_not_one_slow_one(monkeypatch):
    """One reference call slowed by a busy host, scaled by the samples and the survivors, set aside most of
    the budget for the level checks (MiniLM, 480 s: 390 s reserved, 5 of 6 candidates skipped, the checks
    took 6 s): the costs rest on the fastest of a few calls (a fake clock: 1.6 s, then 0.1 s)."""
    import types

    import torch

    from ptopt.core.data import Dataset
    from ptopt.optimize import search as osearch
    from ptopt.optimize.isa import reserve_s
    from ptopt.validate.latency import LatencyOptions

    clock, calls = [0.0], iter([0.0, 1.6, 0.1, 0.1, 0.1])  # warm-up, then the timed calls

    def predict(x):
        clock[0] += next(calls)

    monkeypatch.setattr(osearch.time, "perf_counter", lambda: clock[0])
    settings = osearch.Settings([1, 32], "any", 480.0, LatencyOptions(), 1, None, 0.98)
    costs = osearch.measure_costs(
        types.SimpleNamespace(predict=predict), Dataset(torch.randn(256, 4)), settings
    )
    assert costs.batch_s[32] == pytest.approx(0.1)
    assert reserve_s(["avx2", "avx512_vnni"], costs, settings) < 120


def test_a_candidate_that_misses_at_a_level_leaves_the_budget(monkeypatch, tmp_path):
    """The rule applied to a level's figures (a child's, faked here: one candidate far off at avx), on the
    samples that accepted the candidates: that one leaves the budget, its reason naming the level; the other
    holds; a runtime that ignores the cap is not judged there."""
    import types

    import torch

    from ptopt.core.data import Dataset
    from ptopt.optimize import isa as oisa
    from ptopt.optimize.candidates import Candidate, select
    from ptopt.optimize.report import isa_rows
    from ptopt.optimize.search import Settings
    from ptopt.validate import isa as visa
    from ptopt.validate.latency import LatencyOptions

    cands = [Candidate(s) for s in select(["fp32-torchscript", "int8-fx", "int8-onnx-qdq"])]
    for c in cands[1:]:
        c.status, c.within_budget, c.work_path = "kept", True, tmp_path / f"{c.name}{c.suffix}"
    held = Dataset(torch.randn(40, 1, 8, 8))
    settings = Settings([1, 4], "any", 60.0, LatencyOptions(), 1, None, 0.9)
    ev = types.SimpleNamespace(heldout=held, held_ref=torch.randn(40, 10), eval_bs=40)
    search = types.SimpleNamespace(candidates=cands, settings=settings, evaluator=ev,
                                   ctx=types.SimpleNamespace(module=tiny_cnn()))  # fmt: skip

    def fake_run_level(job, level, skip):
        assert set(skip) == {"int8-onnx-qdq"}  # ONNX Runtime ignores the caps: not run there
        fig = {
            "seconds": 0.1,
            "cosines": [0.999] * 40,
            "latency": {"1": {"p50_ms": 1.0}, "4": {"p50_ms": 2.0}},
        }
        models = {m["name"]: dict(fig) for m in job.models}
        models["int8-fx"]["cosines"] = [0.5] * 40
        return {"models": models, "crash": None, "aten_capability": "DEFAULT"}

    monkeypatch.setattr(visa, "run_level", fake_run_level)
    section = oisa.check_levels(search, ["avx"], lambda msg: None)
    by = {c.name: c for c in cands}
    assert section["levels"] == ["avx"] and section["samples"] == 40
    assert by["int8-fx"].within_budget is False and by["int8-fx"].reason.startswith(
        "at avx: worst cosine projected"
    )
    assert by["fp32-torchscript"].within_budget is True and by["fp32-torchscript"].by_isa["avx"]["speedup"] == {
        "1": 1.0, "4": 1.0}  # fmt: skip
    onnx = by["int8-onnx-qdq"]
    # not judged there, and not refused for it
    assert onnx.within_budget is True and onnx.by_isa["avx"]["within_budget"] is None
    report = {"metric": "cosine", "batch_sizes": [1, 4], "candidates": [c.to_dict() for c in cands]}
    rows = {(row[0], row[1]): row[-1] for row in isa_rows(report)}
    assert "ignores the avx cap" in rows["int8-onnx-qdq", "avx"]
    assert rows["int8-fx", "avx"].startswith("NO: worst cosine")


@pytest.mark.parametrize("isa, match", [("avx9", "unknown CPU level"), ("amx,avx", "this CPU cannot run AMX")],
                         ids=["unknown", "above-this-cpu"])  # fmt: skip
def test_bad_levels_refused_before_anything_is_built(cli, tmp_path, data, monkeypatch, isa, match):  # noqa: F811
    import ptopt
    from ptopt.core import isa as core_isa

    monkeypatch.setattr(core_isa, "cpu_flags", lambda: {"sse4_1", "avx", "avx2", "fma"})
    args = ("--calib-data", data["calib"], "--eval-data", data["eval"], "--accuracy-budget", "5")
    assert_refused(
        cli, "optimize", FACTORY, *args, "--isa", isa, *FAST_CLI, "-o", "opt", match=match, where=tmp_path
    )
    assert_refused(ptopt.optimize, tiny_cnn(), calib_data=data["calib"], eval_data=data["eval"],
                   accuracy_budget=5, isa=isa, match=match, error=UsageError, **FAST)  # fmt: skip
