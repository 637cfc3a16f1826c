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
    # what the skips are short of, and that it is given back
    assert "s --time-budget kept for the level checks after the search" in err
    assert "what they do not need goes back to the search" in err
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

    # warm-up, then the timed calls at batch 32; the same at batch 1 (a call's fixed cost: its floor)
    clock, calls = [0.0], iter([0.0, 1.6, 0.1, 0.1, 0.0, 0.02, 0.01, 0.01])

    def predict(x):
        clock[0] += next(calls)

    monkeypatch.setattr(osearch.time, "perf_counter", lambda: clock[0])
    settings = osearch.Settings([1, 32], "any", 480.0, LatencyOptions(), 1, None, 0.98)
    costs = osearch.measure_costs(
        types.SimpleNamespace(predict=predict), Dataset(torch.randn(256, 4)), settings
    )
    assert costs.batch_s[32] == pytest.approx(0.1)
    assert costs.batch_s[1] == pytest.approx(0.01)  # timed, not 1/32 of batch 32 (0.003)
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


def _costs(eval_s: float, batch_ms: float = 50.0):
    from ptopt.optimize.search import Costs

    return Costs({1: batch_ms / 16e3, 16: batch_ms / 1e3}, eval_s=eval_s)


def test_the_reserve_is_a_bounded_share_and_grows_with_what_is_kept_only(monkeypatch):
    """MiniLM, --time-budget 6m --isa avx2: a disturbed first timing (52.8 ms for ~7 ms) set 250 of the 360 s
    aside; every candidate after the first was skipped (``needs about 60 s, 30 s left``) and the checks took
    seconds. The reserve is now at most ``RESERVE_SHARE`` of the budget, counts only the candidates kept
    within the budget so far (and the one being built), and a skip says how much is kept for the checks."""
    from ptopt.optimize import isa as oisa
    from ptopt.optimize import search as osearch
    from ptopt.optimize.candidates import Context, select
    from ptopt.validate.latency import LatencyOptions

    settings = osearch.Settings([1, 16], "any", 360.0, LatencyOptions(), 1, None, 0.98, isa=("avx",))
    costs = _costs(eval_s=45.0)  # what the disturbed first timing made of one evaluation
    assert oisa.reserve_s(["avx"], costs, settings) <= oisa.RESERVE_SHARE * 360 < 250
    assert oisa.reserve_s(["native"], costs, settings) == 0.0  # this CPU's own level runs in this process

    now = [0.0]
    monkeypatch.setattr(osearch.time, "perf_counter", lambda: now[0])
    clock = osearch.Clock(360.0)
    ctx = Context(tiny_cnn(), None, None, None, None, None, 0.98, lambda: 0.0)
    search = osearch.Search(
        ctx, select(["fp32-torchscript", "int8-fx", "fp32-onnx"]), settings, _costs(0.5), clock
    )
    try:
        clock.reserve = search.reserved_s
        search.pending = 1
        first = search.reserved_s()
        assert first == pytest.approx(oisa.per_level_s(search.costs, settings, 2))  # the reference and one
        assert clock.left() == pytest.approx(360.0 - first)
        for c in search.candidates[1:]:
            c.status, c.within_budget = "kept", True
        assert search.reserved_s() > first  # grows with what the checks will judge
        search.candidates[2].within_budget = False  # left the budget: not judged at the levels
        search.candidates[3].status = "rejected"
        # the kept one counts what it measured here: opening it, and its own speed (twice the reference's)
        one = search.candidates[1]
        one.open_seconds, one.probe_ms = 3.0, {"1": 2 * 50.0 / 16, "16": 100.0}
        own = search.own_costs(one)
        assert own.batch_s == pytest.approx({1: 2 * 50.0 / 16e3, 16: 0.1}) and own.eval_s == pytest.approx(
            1.0
        )
        timing = own.timing_s(osearch.minimal(settings.latency))
        measured = 3.0 + osearch.CAPPED_SLOWDOWN * (1.0 / osearch.EVAL_PASSES / 2 + timing)
        assert search.reserved_s() == pytest.approx(oisa.per_level_s(search.costs, settings, 2) + measured)
        now[0] = 355.0
        why = search._why_not(search.candidates[3].spec)
        kept = search.reserved_s()
        assert (
            why.startswith("time budget: needs about")
            and f"({kept:.0f} s more kept for the --isa level checks)" in why
        )
    finally:
        search.close()


def test_a_disturbed_first_timing_does_not_starve_the_search(monkeypatch, tmp_path, data):  # noqa: F811
    """The first estimate of an evaluation 100x too high (a burst of load elsewhere while the reference's
    first calls were timed): before, the --isa reserve took most of the budget and every candidate was skipped
    for time; the reference's whole evaluation now corrects the estimate and the reserve is bounded, so both
    candidates are built and judged at the level."""
    import ptopt
    from ptopt.optimize import api

    real = api.measure_costs

    def disturbed(runner, evald, settings):
        costs = real(runner, evald, settings)
        costs.eval_s = max(costs.eval_s * 100, 8.0)
        return costs

    monkeypatch.setattr(api, "measure_costs", disturbed)
    res = ptopt.optimize(
        tiny_cnn(), calib_data=data["calib"], eval_data=data["eval"], accuracy_budget=5,
        candidates=["fp32-torchscript", "int8-fx"], isa="avx", **(FAST | {"time_budget": 40}),
    )  # fmt: skip
    for name in ("fp32-torchscript", "int8-fx"):
        c = res.candidate(name)
        assert c.status == "kept" and "avx" in c.by_isa, (name, c.status, c.reason)


def test_a_model_whose_module_imports_torchvision_is_judged_in_the_child(tmp_path, data):  # noqa: F811
    """timm's models import torchvision: the child unpickled the reference without
    ``ensure_torchvision_ops`` and failed (``operator torchvision::nms does not exist``); the report had
    ``fp32-eager: {"avx": {"latency_ms": {}}}`` and no speedup at the level, with no reason."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed")
    from ptopt.core.hf import ensure_torchvision_ops

    ensure_torchvision_ops()
    import ptopt
    from tests.optimize.torchvision_model import vision_cnn

    res = ptopt.optimize(
        vision_cnn(), calib_data=data["calib"], eval_data=data["eval"], accuracy_budget=5,
        candidates=["fp32-torchscript"], isa="avx", **FAST,
    )  # fmt: skip
    ref = res.report["candidates"][0]["by_isa"]["avx"]
    assert "error" not in ref and set(ref["latency_ms"]) == {"1", "4"}, ref
    assert set(res.candidate("fp32-torchscript").by_isa["avx"]["speedup"]) == {"1", "4"}


def _judged(monkeypatch, tmp_path, names, level, child, metric_drop=None):
    """``check_levels`` over ``names`` (kept within the budget) with the child's figures faked by ``child``."""
    import types

    import torch

    from ptopt.core.data import Dataset
    from ptopt.optimize import isa as oisa
    from ptopt.optimize.candidates import Candidate, select
    from ptopt.optimize.search import Settings
    from ptopt.validate import isa as visa
    from ptopt.validate.latency import LatencyOptions

    cands = [Candidate(s) for s in select(names)]
    for c in cands[1:]:
        c.status, c.within_budget, c.work_path = "kept", True, tmp_path / f"{c.name}{c.suffix}"
    y = torch.arange(40) % 10
    held = Dataset(torch.randn(40, 1, 8, 8), y if metric_drop is not None else None)
    ref_out = torch.nn.functional.one_hot(y, 10).float()
    settings = Settings([1, 4], "any", 60.0, LatencyOptions(), 1, metric_drop, None if metric_drop else 0.9)
    ev = types.SimpleNamespace(heldout=held, held_ref=ref_out, eval_bs=40, evald=held, ref_out=ref_out)
    ev._top1 = lambda out, ds: float((out.argmax(-1) == ds.y).float().mean())
    search = types.SimpleNamespace(candidates=cands, settings=settings, evaluator=ev,
                                   ctx=types.SimpleNamespace(module=tiny_cnn()))  # fmt: skip
    monkeypatch.setattr(visa, "run_level", lambda job, lv, skip: child([m["name"] for m in job.models]))
    section = oisa.check_levels(search, [level, "native"], lambda msg: None)
    report = {
        "metric": "top1" if metric_drop is not None else "cosine", "batch_sizes": [1, 4], "isa": section,
        "reference": "fp32-eager", "candidates": [c.to_dict() for c in cands],
    }  # fmt: skip
    return {c.name: c for c in cands}, report


def _fig(ms=1.0):
    return {"seconds": 0.1, "cosines": [0.9999] * 40, "metric": 1.0,
            "latency": {"1": {"p50_ms": ms}, "4": {"p50_ms": 2 * ms}}}  # fmt: skip


def test_a_reference_that_fails_in_the_child_is_said_not_left_empty(monkeypatch, tmp_path):
    """The reference failing at a level left ``{"latency_ms": {}}`` and speedups shown as ``—`` with no
    reason: the reason is in its ``by_isa``, each candidate's ``no_speedup`` and the per-level notes."""
    from ptopt.optimize.report import isa_lines

    def child(names):
        models = {n: _fig() for n in names}
        models["fp32-eager"] = {"error": "RuntimeError: operator torchvision::nms does not exist"}
        return {"models": models, "crash": None, "aten_capability": "DEFAULT"}

    by, report = _judged(monkeypatch, tmp_path, ["fp32-torchscript"], "avx", child)
    assert by["fp32-eager"].by_isa["avx"]["error"].endswith("torchvision::nms does not exist")
    ts = by["fp32-torchscript"].by_isa["avx"]
    assert ts["within_budget"] is True and ts["speedup"] == {}  # its accuracy stands: judged vs this process
    assert ts["no_speedup"].startswith("the reference fp32-eager did not run at avx: RuntimeError")
    lines = "\n".join(isa_lines(report))
    assert (
        "level avx: no emulated speedups: the reference fp32-eager failed there: RuntimeError: operator"
        in lines
    )


def test_the_per_level_table_heads_a_drop_as_a_drop_and_names_the_native_level(monkeypatch, tmp_path):
    """With --accuracy-budget the level's column holds top-1 drops (``+0.00 pts``) under ``top-1 accuracy
    %``; and ``--isa avx,native``'s footnote said both levels ran in a child process: native is this CPU's,
    the search's own figures."""
    from ptopt.core import isa as core_isa
    from ptopt.optimize.report import isa_head, isa_lines, isa_rows, search_line

    def child(names):
        return {"models": {n: _fig() for n in names}, "crash": None, "aten_capability": "DEFAULT"}

    by, report = _judged(monkeypatch, tmp_path, ["fp32-torchscript"], "avx", child, metric_drop=1.0)
    head, row = isa_head(report), isa_rows(report)[0]
    column = head.index("top-1 drop vs fp32 native")
    assert "top-1 accuracy %" not in head and row[column] == "+0.00 pts"
    assert report["isa"]["measured_here"] == ["native"]
    lines = isa_lines(report)
    native = core_isa.top_level()
    assert lines[0].startswith(f"--isa native: this CPU's own level ({native}): the search's figures above")
    assert lines[1].startswith("--isa avx: every candidate kept within the budget judged again")
    assert not any("native" in ln and "child process" in ln for ln in lines)
    assert f"figures measured on this CPU, uncapped (level {native})" in search_line(report)


def test_a_bf16_ir_that_holds_at_a_level_without_bf16_says_it_ran_in_f32(monkeypatch, tmp_path):
    """bf16-openvino "held" at avx2 with cosine 1.00000: under the cap OpenVINO runs the bf16 IR in f32, and
    the level's note says so as validate's does (``validate.isa._f32_at``); so does its row."""
    from ptopt.optimize.report import isa_lines, isa_rows

    def child(names):
        return {"models": {n: _fig() for n in names}, "crash": None, "aten_capability": "DEFAULT"}

    by, report = _judged(monkeypatch, tmp_path, ["bf16-openvino"], "avx", child)
    f = by["bf16-openvino"].by_isa["avx"]
    assert f["within_budget"] is True and "bf16-openvino is a bf16 IR: at avx it runs in f32" in f["note"]
    row = next(r for r in isa_rows(report) if r[0] == "bf16-openvino")
    assert row[-1] == "yes (run in f32 at this level)"
    assert any(ln.startswith("bf16-openvino is a bf16 IR: at avx it runs in f32") for ln in isa_lines(report))


def test_the_per_level_table_keeps_candidate_names_whole_at_100_columns(monkeypatch, tmp_path):
    """A long reason (onnxruntime ignores the cap) took the room: the names read ``fp32…``, ``int8…``."""
    from ptopt.optimize.report import render_terminal

    def child(names):
        return {"models": {n: _fig() for n in names}, "crash": None, "aten_capability": "DEFAULT"}

    _, report = _judged(monkeypatch, tmp_path, ["fp32-torchscript", "fp32-onnx"], "avx", child)
    text = render_terminal(report, width=100)
    table = text[text.index("per CPU level (--isa)") :]
    assert "ignores the avx cap" in " ".join(table.split())  # the reason is there, wrapped
    assert all(name in table for name in ("fp32-torchscript", "fp32-onnx"))
    boxed = [line for line in table.splitlines() if line[:1] in "┏┃┡│└"]
    assert "…" not in table and max(len(line) for line in boxed) <= 100
