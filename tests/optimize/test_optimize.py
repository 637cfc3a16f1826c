"""``ptopt optimize`` / ``ptopt.optimize``: the search on a tiny CNN with tiny data, through the Python
API, the CLI and a recipe step; exit 1 when nothing meets the budget; every bad input refused.

Kept fast: 1×8×8 digits, a few dozen samples, batch sizes 1 and 4, one thread, two rounds of a few
timed iterations with one warm-up call (the timings are never asserted, only that every candidate gets
them), and only the cheap candidates (``candidates=``); the AOTInductor ones compile C++ for ~20 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import assert_refused, tiny_cnn

#: the validate tests' short timing (tests/validate/test_validate_api.QUICK): a few iterations, no warm-up time
QUICK = dict(min_iters=3, min_seconds=0.01, warmup_iters=1, warmup_seconds=0.0, rounds=2)
FAST = dict(batch_sizes=(1, 4), threads=1, latency=QUICK, time_budget=300)
FAST_CLI = (
    "--batch-size", "1,4", "--threads", "1", "--rounds", "2", "--min-seconds", "0.01", "--min-iters", "3",
)  # fmt: skip
FACTORY = "tests.helpers:tiny_cnn"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """calib (64), eval (320 labelled: the search chooses on 160, more than the pre-screen's 128, and
    accepts on the 160 others), eval without labels."""
    from ptopt.core.data import Dataset, load_data

    d = tmp_path_factory.mktemp("optimize-data")
    train, test = load_data("builtin:digits:train"), load_data("builtin:digits:test")
    train.take(64).save(d / "calib.pt")
    test.take(320).save(d / "eval.pt")
    Dataset(test.take(64).x).save(d / "eval-unlabelled.pt")
    train.take(128).save(d / "train.pt")
    return {k: d / f"{k}.pt" for k in ("calib", "eval", "eval-unlabelled", "train")}


def _package_or_skip(artifact: Path, out: Path) -> None:
    from ptopt.core.features import check_torchserve
    from ptopt.serve.package import package

    feature = check_torchserve()
    if not feature.available:
        pytest.skip(f"torch-model-archiver unavailable: {feature.detail}")
    mar = package(artifact, "mar", out)
    assert Path(mar.path).is_file()


def test_python_api_finds_the_fastest_within_budget_and_it_packages(tmp_path, data):
    import torch

    import ptopt

    out = tmp_path / "opt"
    names = ["fp32-torchscript", "int8-fx", "int8-onnx-qdq"]
    res = ptopt.optimize(
        tiny_cnn(),
        calib_data=data["calib"],
        eval_data=data["eval"],
        accuracy_budget=5.0,
        candidates=names,
        output=out,
        **FAST,
    )
    rep = res.report
    assert (
        rep["schema"] == "ptopt.optimize/2" and rep["metric"] == "top1" and rep["reference"] == "fp32-eager"
    )
    # the machine as validate's report describes it (ptopt.core.system.machine_summary), threads beside it
    assert rep["machine"]["cpu"]["model"] and rep["machine"]["versions"]["torch"] == torch.__version__
    assert rep["threads"] == FAST["threads"] and rep["device"] == "cpu"
    assert [c["name"] for c in rep["candidates"]] == ["fp32-eager", *names]
    assert res.exit_code == 0 and rep["best_within_budget"] is True
    kept = [c for c in res.candidates[1:] if c.status == "kept"]
    assert kept, [(c.name, c.status, c.reason) for c in res.candidates]
    # the winner: the fastest kept candidate at the largest batch size, and it is what .model runs
    assert res.best.name == min(kept, key=lambda c: c.latency_ms["4"]["median"]).name
    assert set(res.best.speedup) == {"1", "4"} and res.candidates[0].latency_ms["4"]["median"] > 0
    x = torch.randn(2, 1, 8, 8)
    assert res.model(x).shape == (2, 10)
    # the folder: best.<ext> whose sidecar names the path, every kept candidate, report.json = .report
    best = out / f"best{res.best.suffix}"
    side = json.loads(Path(f"{best}.ptopt.json").read_text())
    # the worst cosine on the held-out half, measured and projected to 1000 samples (ptopt.core.tail)
    worst = side["extra"]["optimize"].pop("worst_cosine")
    assert worst["samples"] == 160 and worst["reference_samples"] == 1000
    assert worst["projected"] <= worst["measured"] == pytest.approx(res.best.cosine_min, abs=1e-6)
    assert side["extra"]["optimize"] == {
        "candidate": res.best.name,
        "label": res.best.label,
        "steps": list(res.best.steps),
        "report": "report.json",
        "split": {"search_samples": 160, "heldout_samples": 160, "seed": 0, "of": str(data["eval"])},
    }
    for c in kept:
        assert (out / c.path).is_file() and c.path == f"candidates/{c.name}{c.suffix}"
    assert json.loads((out / "report.json").read_text())["best"] == res.best.name
    assert rep["best_path"] == best.name and not list(tmp_path.glob(".opt.stage-*"))
    _package_or_skip(best, tmp_path / "best.mar")


def test_cli_writes_the_folder_and_the_best_loads(cli, tmp_path, data):
    import ptopt

    code, out, err = cli(
        "optimize", FACTORY, "--calib-data", data["calib"], "--eval-data", data["eval-unlabelled"],
        "--min-cosine", "0.99", "--candidates", "fp32-onnx,int8-dynamic", *FAST_CLI, "-o", "opt",
    )  # fmt: skip
    assert code == 0, err
    assert "created folder" not in err  # the staging folder the candidates are written into is not news
    report = json.loads((tmp_path / "opt" / "report.json").read_text())
    assert report["metric"] == "cosine" and report["best"] in ("fp32-onnx", "int8-dynamic")
    for name in ("fp32-onnx", "int8-dynamic"):  # a progress line per candidate, a row per candidate
        assert f"{name}: " in err and name in out
    assert "ptopt package" in out and f"opt/{report['best_path']}" in out
    best = tmp_path / "opt" / report["best_path"]
    loaded = ptopt.load_model(best)
    assert loaded.format in ("onnx", "torchscript")


def test_exit_1_when_nothing_meets_the_budget_best_found_still_written(cli, tmp_path, data):
    code, out, err = cli(
        "optimize", FACTORY, "--calib-data", data["calib"], "--eval-data", data["eval"],
        "--min-cosine", "1.0", "--candidates", "int8-dynamic,int8-fx", *FAST_CLI, "-o", "opt",
        "--save-recipe", "r.yaml",
    )  # fmt: skip
    assert code == 1, err
    assert (
        "min_cosine: 1.0" in (tmp_path / "r.yaml").read_text()
    )  # to rerun with another budget, as validate's
    report = json.loads((tmp_path / "opt" / "report.json").read_text())
    assert report["exit_code"] == 1 and report["best_within_budget"] is False
    assert (
        report["best"] in ("int8-dynamic", "int8-fx") and (tmp_path / "opt" / report["best_path"]).is_file()
    )
    rows = {c["name"]: c for c in report["candidates"]}
    assert all(rows[n]["status"] == "rejected" for n in ("int8-dynamic", "int8-fx"))
    # 160 samples to choose on > the pre-screen's 128: rejected there, not after a full evaluation
    assert all(rows[n]["reason"].startswith("pre-screen on 128 samples") for n in ("int8-dynamic", "int8-fx"))
    assert "no candidate meets the accuracy budget" in err


def test_recipe_step_optimize_then_package(tmp_path, data):
    from ptopt.core.features import check_torchserve
    from ptopt.pipeline import run_recipe

    steps = [
        {
            "optimize": {
                "id": "opt", "model": FACTORY, "calib_data": str(data["calib"]), "eval_data": str(data["eval"]),
                "accuracy_budget": 5.0, "candidates": ["int8-dynamic"], "output": str(tmp_path / "opt"),
                "batch_sizes": [1, 4], "threads": 1, "rounds": 2, "min_seconds": 0.01, "min_iters": 3,
            }
        }
    ]  # fmt: skip
    if check_torchserve().available:
        steps.append({"package": {"artifact": "${opt}", "format": "mar", "output": str(tmp_path / "m.mar")}})
    results = run_recipe({"version": 1, "steps": steps})
    assert results[0].outputs["output"] == str(tmp_path / "opt" / "best.pt")
    assert results[0].value.best.name == "int8-dynamic"
    if len(results) > 1:
        assert (tmp_path / "m.mar").is_file()


def test_budget_skips_what_does_not_fit_and_keeps_the_reference(tmp_path, data):
    """A budget that fits the reference but not the AOTInductor compile: skipped, with the estimate."""
    import ptopt

    res = ptopt.optimize(
        tiny_cnn(),
        calib_data=data["calib"],
        eval_data=data["eval"],
        accuracy_budget=5.0,
        candidates=["fp32-aoti", "int8-pt2e"],
        **(FAST | {"time_budget": 8}),
    )
    rows = {c.name: c for c in res.candidates}
    assert rows["fp32-eager"].latency_ms["4"]["median"] > 0
    for name in ("fp32-aoti", "int8-pt2e"):
        assert rows[name].status == "skipped", (rows[name].status, rows[name].reason)
    assert res.exit_code == 1 and res.best is None and res.report["elapsed_s"] < 30


# -- bad input: exit 2, one line, nothing written ---------------------------------------------------

BAD_CLI = [
    ("no-eval-data", ["--accuracy-budget", "1"], "--eval-data is required"),
    ("unlabelled-with-drop", ["--eval-data", "{eval-unlabelled}", "--accuracy-budget", "1"], "--min-cosine"),
    ("both-budgets", ["--eval-data", "{eval}", "--accuracy-budget", "1", "--min-cosine", "0.9"], "exactly one"),
    ("no-budget", ["--eval-data", "{eval}"], "exactly one"),
    ("negative-drop", ["--eval-data", "{eval}", "--accuracy-budget", "-1"], "below zero"),
    ("negative-time", ["--eval-data", "{eval}", "--min-cosine", "0.9", "--time-budget", "-5"], "below zero"),
    ("too-short", ["--eval-data", "{eval}", "--min-cosine", "0.9", "--time-budget", "0.01"], ("too short", "takes about")),
    ("unknown-candidate", ["--eval-data", "{eval}", "--min-cosine", "0.9", "--candidates", "int4"], "unknown candidate"),
    ("bad-device", ["--eval-data", "{eval}", "--min-cosine", "0.9", "--device", "tpu"], "--device"),
]  # fmt: skip


@pytest.mark.parametrize("args, match", [(a, m) for _, a, m in BAD_CLI], ids=[i for i, _, _ in BAD_CLI])
def test_bad_input_cli(cli, tmp_path, data, args, match):
    args = [a.format(**{k: str(v) for k, v in data.items()}) for a in args]
    assert_refused(
        cli,
        "optimize",
        FACTORY,
        "--calib-data",
        data["calib"],
        *args,
        "-o",
        "opt",
        match=match,
        where=tmp_path,
    )
    assert not (tmp_path / "opt").exists()


def test_bad_input_output_is_an_input_or_not_empty(cli, tmp_path, data):
    base = [
        "optimize",
        FACTORY,
        "--calib-data",
        data["calib"],
        "--eval-data",
        data["eval"],
        "--min-cosine",
        "0.9",
    ]
    assert_refused(cli, *base, "-o", data["eval"], match="-o", where=data["eval"].parent)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    assert_refused(cli, *base, "-o", "full", match="not empty", where=tmp_path)


def test_bad_input_cuda_without_cuda(cli, tmp_path, data):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    args = ["--eval-data", data["eval"], "--min-cosine", "0.9", "--device", "cuda", "-o", "opt"]
    assert_refused(
        cli,
        "optimize",
        FACTORY,
        "--calib-data",
        data["calib"],
        *args,
        match="CUDA is not available here",
        where=tmp_path,
    )


def test_bad_input_onnxruntime_missing(cli, tmp_path, data, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a)
    )
    args = ["--eval-data", data["eval"], "--min-cosine", "0.9", "--runtime", "onnxruntime", "-o", "opt"]
    assert_refused(
        cli,
        "optimize",
        FACTORY,
        "--calib-data",
        data["calib"],
        *args,
        match="onnxruntime is not installed",
        where=tmp_path,
    )


BAD_API = [
    ("no-eval-data", dict(eval_data=None, accuracy_budget=1.0), "--eval-data is required"),
    ("no-budget", dict(), "exactly one"),
    ("negative-time", dict(min_cosine=0.9, time_budget=-1), "below zero"),
    ("bad-runtime", dict(min_cosine=0.9, runtime="tensorrt"), "--runtime"),
    ("skip-reference", dict(min_cosine=0.9, skip=["fp32-eager"]), "always measured"),
]


@pytest.mark.parametrize("options, match", [(o, m) for _, o, m in BAD_API], ids=[i for i, _, _ in BAD_API])
def test_bad_input_python_api(tmp_path, data, options, match):
    import ptopt

    options = {"calib_data": data["calib"], "eval_data": data["eval"], **options}
    assert_refused(
        ptopt.optimize, tiny_cnn(), **options, output=tmp_path / "opt", match=match, where=tmp_path
    )


def test_train_data_adds_pruned_candidates_built_by_prune_then_quantize(tmp_path, data):
    """With ``train_data``: structured pruning 30% + a one-epoch fine-tune, and that model in int8."""
    import ptopt
    from tests.compress.prune_models import lenet

    res = ptopt.optimize(
        lenet(),
        calib_data=data["calib"],
        eval_data=data["eval-unlabelled"],
        train_data=data["train"],
        min_cosine=0.5,
        candidates=["pruned30-ft", "pruned30-ft-int8"],
        **FAST,
    )
    rows = {c.name: c for c in res.candidates}
    assert [rows[n].status for n in ("pruned30-ft", "pruned30-ft-int8")] == ["kept", "kept"], [
        (c.name, c.reason) for c in res.candidates
    ]
    pruned = rows["pruned30-ft"].model
    assert pruned.conv2.out_channels < 16  # channels really removed
    assert rows["pruned30-ft-int8"].steps[0].startswith("prune --method structured")
    assert res.exit_code == 0 and res.best.name in rows


def test_unlabelled_train_data_fine_tunes_the_pruned_candidate_by_distillation(tmp_path, data):
    """A sentence encoder's training text has no labels: the pruned candidate is distilled from the
    unpruned model (it was refused: "has no labels, which the fine-tune needs")."""
    import ptopt
    from ptopt.core.data import Dataset, load_data
    from tests.compress.prune_models import lenet

    Dataset(load_data(data["train"]).x).save(tmp_path / "train-unlabelled.pt")
    res = ptopt.optimize(lenet(), calib_data=data["calib"], eval_data=data["eval-unlabelled"],
                         train_data=tmp_path / "train-unlabelled.pt", min_cosine=0.5, candidates=["pruned30-ft"],
                         **FAST)  # fmt: skip
    row = next(c for c in res.candidates if c.name == "pruned30-ft")
    assert row.status == "kept", row.reason
    assert (
        row.model.conv2.out_channels < 16 and "--teacher self when --train-data has no labels" in row.steps[0]
    )


def test_int8_with_float_layers_when_plain_int8_is_rejected(data):
    """Plain static int8 misses a tight cosine goal (its worst cosine projected to 1000 samples does); autoquant
    keeps the layers that must stay float, held to the same projection (its search fits on a quarter of the
    eval data and holds on the quarter it never saw; optimize accepts it on the other half)."""
    import ptopt
    from ptopt.core.data import load_data

    res = ptopt.optimize(
        tiny_cnn(),
        calib_data=data["calib"],
        eval_data=load_data(data["eval"]).take(128),
        min_cosine=0.999,
        candidates=["int8-fx", "int8-fx-float-layers"],
        **FAST,
    )
    rows = {c.name: c for c in res.candidates}
    assert rows["int8-fx"].status == "rejected" and "worst cosine" in rows["int8-fx"].reason
    assert rows["int8-fx-float-layers"].status == "kept", rows["int8-fx-float-layers"].reason
    assert rows["int8-fx-float-layers"].cosine_min >= rows["int8-fx-float-layers"].cosine_projected >= 0.999
    assert res.best.name == "int8-fx-float-layers" and res.exit_code == 0


def test_dynamic_int8_search_when_plain_dynamic_is_rejected(data):
    """An activation outlier breaks plain dynamic int8; the accuracy-aware dynamic search (SmoothQuant,
    float layers) is a candidate then, fitted inside the search's half and accepted on the other."""
    import ptopt
    from ptopt.core.data import load_data
    from tests.compress.autoquant_models import fragile_mlp

    res = ptopt.optimize(
        fragile_mlp(),
        calib_data=data["calib"],
        eval_data=load_data(data["eval"]).take(256),
        min_cosine=0.99,
        candidates=["int8-dynamic", "int8-dynamic-search"],
        **FAST,
    )
    rows = {c.name: c for c in res.candidates}
    assert rows["int8-dynamic"].status == "rejected" and "cosine" in rows["int8-dynamic"].reason
    # the plain build is refused without quantize's own float-layer search (int8-dynamic-search is that,
    # under the time budget): all-MiniLM-L6-v2's took 352 s inside int8-dynamic, past a 6-minute budget
    assert "rerun with" not in rows["int8-dynamic"].reason and "No set of" not in rows["int8-dynamic"].reason
    assert rows["int8-dynamic-search"].status == "kept", rows["int8-dynamic-search"].reason
    assert rows["int8-dynamic-search"].cosine_min >= 0.99
    assert res.best.name == "int8-dynamic-search" and res.exit_code == 0


@pytest.mark.parametrize("dominance", [0.01, 1e6], ids=["cannot-win", "may-win"])
def test_a_search_that_cannot_win_is_skipped(data, monkeypatch, dominance):
    """int8-dynamic-search keeps layers of int8-dynamic float: no faster than it. Its plain build (refused by
    the int8 rule, probed all the same) is timed head to head with the kept candidates; when one is
    DOMINANCE times faster at every batch size the search is skipped, saying so with the milliseconds
    (DOMINANCE is set to always / never hold here: the timing itself is the machine's)."""
    import ptopt
    from ptopt.core.data import load_data
    from ptopt.optimize import search
    from tests.compress.autoquant_models import fragile_mlp

    monkeypatch.setattr(search, "DOMINANCE", dominance)
    res = ptopt.optimize(
        fragile_mlp(), calib_data=data["calib"], eval_data=load_data(data["eval"]).take(256), min_cosine=0.99,
        candidates=["fp32-onnx", "int8-dynamic", "int8-dynamic-search"], **FAST,
    )  # fmt: skip
    plain, found = res.candidate("int8-dynamic"), res.candidate("int8-dynamic-search")
    assert plain.status == "rejected" and set(plain.probe_ms) == {"1", "4"}, (plain.reason, plain.probe_ms)
    if dominance < 1:
        assert found.status == "skipped" and found.reason.startswith("cannot win"), found.reason
        assert "batch 1: fp32-onnx" in found.reason and "batch 4: fp32-onnx" in found.reason
    else:
        assert found.status == "kept", found.reason


def mlp():
    """A Linear-heavy classifier of 8x8 digits (what dynamic int8 of the matrix products speeds up)."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )


def _openvino_bf16(ctx):
    from ptopt.optimize.candidates import _openvino_bf16 as why_not

    return why_not(ctx)


def test_runtimes_users_pick_instead_are_candidates(cli, tmp_path, data):
    """OpenVINO fp32, OpenVINO + NNCF int8 and ONNX Runtime's dynamic int8 are built, judged by the
    user's budget (not the fixed int8 rule) and timed beside the others; --runtime openvino keeps
    only the OpenVINO ones."""
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    names = "fp32-openvino,int8-openvino,int8-onnx-dynamic"
    code, out, err = cli(
        "optimize", "tests.optimize.test_optimize:mlp", "--calib-data", data["calib"], "--eval-data",
        data["eval-unlabelled"], "--min-cosine", "0.9", "--candidates", names, *FAST_CLI, "-o", "opt",
    )  # fmt: skip
    assert code == 0, err
    rows = {c["name"]: c for c in json.loads((tmp_path / "opt" / "report.json").read_text())["candidates"]}
    assert all(rows[n]["status"] == "kept" for n in names.split(",")), rows
    assert (
        rows["int8-openvino"]["runtime"] == "openvino"
        and rows["int8-onnx-dynamic"]["runtime"] == "onnxruntime"
    )
    assert rows["int8-onnx-dynamic"]["precision"] == "int8" and rows["int8-openvino"]["size_bytes"] > 0
    code, out, err = cli(
        "optimize", "tests.optimize.test_optimize:mlp", "--calib-data", data["calib"], "--eval-data",
        data["eval-unlabelled"], "--min-cosine", "0.9", "--runtime", "openvino", *FAST_CLI, "-o", "opt2",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads((tmp_path / "opt2" / "report.json").read_text())
    built = [c["name"] for c in report["candidates"] if c["status"] != "skipped"]
    expected = {"fp32-eager", "fp32-openvino", "int8-openvino"}
    if _openvino_bf16(None) is None:  # this CPU's OpenVINO plugin has bf16 kernels
        expected.add("bf16-openvino")
    assert set(built) == expected, built


def test_bf16_openvino_is_a_candidate_where_the_cpu_has_bf16_kernels(tmp_path, data, monkeypatch):
    """OpenVINO's own bf16 kernels (what its plugin runs by default on such a CPU) are a candidate judged
    by the user's budget; on a CPU without them it is skipped, saying why."""
    pytest.importorskip("openvino")
    import ptopt
    from ptopt.core.errors import UsageError
    from ptopt.formats import openvino

    def search():
        res = ptopt.optimize(
            "tests.optimize.test_optimize:mlp", calib_data=data["calib"], eval_data=data["eval-unlabelled"],
            min_cosine=0.9, candidates=["bf16-openvino"], **FAST,
        )  # fmt: skip
        return res.candidate("bf16-openvino")

    if _openvino_bf16(None) is None:
        row = search()
        assert row.status == "kept" and row.precision == "bf16" and row.runtime == "openvino", row.reason
        assert row.cosine_min >= 0.9
    monkeypatch.setattr(openvino, "check_bf16", lambda: (_ for _ in ()).throw(UsageError("no bf16 kernels")))
    row = search()
    assert row.status == "skipped" and "no bf16 kernels" in row.reason


def test_onnx_dynamic_int8_is_skipped_for_a_conv_heavy_cnn(tmp_path, data):
    import torch

    import ptopt

    torch.manual_seed(0)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10),
    )  # fmt: skip
    res = ptopt.optimize(
        conv, calib_data=data["calib"], eval_data=data["eval"], accuracy_budget=100.0,
        candidates=["int8-onnx-dynamic", "int8-dynamic"], **FAST,
    )  # fmt: skip
    rows = {c.name: c for c in res.candidates}
    # one rule for dynamic int8 in every runtime: both skipped for the same reason
    assert rows["int8-onnx-dynamic"].status == rows["int8-dynamic"].status == "skipped"
    assert "Linear/LSTM/GRU" in rows["int8-dynamic"].reason
    assert rows["int8-onnx-dynamic"].reason == rows["int8-dynamic"].reason


def test_onnx_dynamic_int8_applies_to_an_encoder_with_a_large_embedding_table():
    """A sentence encoder keeps most parameters in its token table (a lookup: no matrix product), yet
    spends its time in Linear layers: ONNX Runtime's dynamic int8 is a candidate for it (all-MiniLM-L6-v2
    was skipped as '47% Linear' before, and lost to a one-call ``quantize_dynamic``)."""

    import ptopt
    from ptopt.core.data import Dataset
    from ptopt.models.minilm import minilm_tiny
    from tests.compress.autoquant_models import tokens

    model = minilm_tiny()
    table = model.tok.weight.numel()
    assert table > sum(p.numel() for p in model.parameters()) / 2  # the case this test is about
    res = ptopt.optimize(
        model, calib_data=Dataset(tokens(16)), eval_data=Dataset(tokens(48)), min_cosine=-1.0,
        candidates=["int8-onnx-dynamic"], **FAST,
    )  # fmt: skip
    row = next(c for c in res.candidates if c.name == "int8-onnx-dynamic")
    assert row.status == "kept", row.reason
    assert res.best is row and res.exit_code == 0  # the reference is never chosen


def test_progress_true_prints_the_search_on_stderr(data, capsys):
    import ptopt

    ptopt.optimize(
        tiny_cnn(), calib_data=data["calib"], eval_data=data["eval"], accuracy_budget=5.0,
        candidates=["fp32-torchscript"], progress=True, **FAST,
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "evaluating the fp32 reference" in err and "fp32-torchscript" in err


def test_plain_int8_refused_by_the_default_rule_is_kept_within_the_users_budget(data):
    """Dynamic int8 of the outlier MLP breaks the default int8 rule (worst cosine 0.99) but holds a
    0.8 budget (its worst, 0.93, projects to 0.86): the user's budget is the rule, and the sidecar says the
    default rule refused it."""
    import ptopt
    from ptopt.core.data import load_data
    from tests.compress.autoquant_models import fragile_mlp

    res = ptopt.optimize(
        fragile_mlp(), calib_data=data["calib"], eval_data=load_data(data["eval"]).take(256),
        min_cosine=0.8, candidates=["int8-dynamic"], **FAST,
    )  # fmt: skip
    (row,) = [c for c in res.candidates if c.name == "int8-dynamic"]
    assert row.status == "kept" and 0.8 <= row.cosine_projected <= row.cosine_min < 0.99, (
        row.status,
        row.reason,
    )
    assert "the default int8 rule refused it" in row.result.template.extra["accepted_by"]


def test_openvino_accuracy_control_runs_when_plain_nncf_int8_is_rejected(cli, tmp_path, data):
    """int8-openvino-search: NNCF's accuracy control fitted on the search's half of --eval-data (its
    validation set) when plain int8-openvino breaks the budget, then accepted on the held-out half like
    every candidate; through the CLI and the API. One input feature far larger than the others makes
    plain int8 miss a tight budget (and reverting ops to float win it back)."""
    pytest.importorskip("nncf")
    from ptopt.core.data import Dataset, load_data

    def outlier(ds):
        x = ds.x.clone()
        x[:, 0, 0, 0] = 400.0
        return Dataset(x)

    outlier(load_data(data["calib"])).save(tmp_path / "calib.pt")
    outlier(load_data("builtin:digits:test").take(64)).save(tmp_path / "eval.pt")
    code, out, err = cli(
        "optimize", "tests.optimize.test_optimize:mlp", "--calib-data", "calib.pt", "--eval-data", "eval.pt",
        "--min-cosine", "0.9999", "--candidates", "int8-openvino,int8-openvino-search", *FAST_CLI, "-o", "opt",
    )  # fmt: skip
    report = json.loads((tmp_path / "opt" / "report.json").read_text())
    rows = {c["name"]: c for c in report["candidates"]}
    assert rows["int8-openvino"]["status"] == "rejected", rows["int8-openvino"]
    row = rows["int8-openvino-search"]
    assert row["status"] == "kept" and row["runtime"] == "openvino" and row["engine"] == "nncf", row
    assert code == 0 and report["best"] == "int8-openvino-search" and row["cosine_min"] >= 0.9999, err
    side = json.loads((tmp_path / "opt" / (report["best_path"] + ".ptopt.json")).read_text())
    control = side["extra"]["nncf"]["accuracy_control"]
    # fitted on the search's half of the 64 samples, aiming one standard error of its projected worst
    # cosine inside the budget; the other half is what accepted it against the budget itself
    assert control["min_cosine"] == pytest.approx(1 - 0.0001 / (1 + 1 / 32**0.5))
    assert control["validation_samples"] == report["split"]["search_samples"]
    assert "int8-openvino-search" in out

    import ptopt

    res = ptopt.optimize(
        "tests.optimize.test_optimize:mlp", calib_data=data["calib"], eval_data=data["eval-unlabelled"],
        min_cosine=0.5, candidates=["int8-openvino", "int8-openvino-search"], **FAST,
    )  # fmt: skip
    assert res.candidate("int8-openvino").status == "kept"
    skipped = res.candidate("int8-openvino-search")
    assert skipped.status == "skipped" and "was kept, not rejected" in skipped.reason


def test_openvino_accuracy_control_skipped_with_its_estimate_when_it_does_not_fit():
    from ptopt.optimize.candidates import Context, _after_openvino_rejected

    ctx = Context(mlp(), None, None, None, None, None, 0.99, lambda: 5.0)
    ctx.status["int8-openvino"], ctx.build_seconds["int8-openvino"] = "rejected", 8.0
    why = _after_openvino_rejected(ctx)
    assert why == "time budget: NNCF's accuracy control (2 layers to rank) needs about 24 s, 5 s left"
    ctx.seconds_left = lambda: 60.0
    assert _after_openvino_rejected(ctx) is None
    ctx.status["int8-openvino-float-layers"] = "kept"  # the ranked float-layer search held the budget
    assert "holds the budget already" in _after_openvino_rejected(ctx)


def test_openvino_float_layers_when_plain_nncf_int8_is_rejected(tmp_path, data):
    """int8-openvino-float-layers: the MLP's layers ranked by their int8 error in PyTorch, NNCF int8 with the
    fewest most harmful float that holds on the search's half (export --exclude), accepted on the held-out
    half; the sidecar names the float layers and the trials."""
    pytest.importorskip("nncf")
    import ptopt
    from ptopt.core.data import Dataset, load_data

    def outlier(ds):
        x = ds.x.clone()
        x[:, 0, 0, 0] = 400.0
        return Dataset(x)

    res = ptopt.optimize(
        "tests.optimize.test_optimize:mlp", calib_data=outlier(load_data(data["calib"])),
        eval_data=outlier(load_data("builtin:digits:test").take(64)), min_cosine=0.9999,
        candidates=["int8-openvino", "int8-openvino-float-layers"], output=tmp_path / "opt", **FAST,
    )  # fmt: skip
    plain, found = res.candidate("int8-openvino"), res.candidate("int8-openvino-float-layers")
    assert plain.status == "rejected" and found.status == "kept", (plain.reason, found.reason)
    assert found.cosine_projected >= 0.9999 and res.best is found and res.exit_code == 0
    side = json.loads((tmp_path / "opt" / f"best{found.suffix}.ptopt.json").read_text())
    floats = side["extra"]["nncf"]["float_modules"]
    assert floats and set(floats) <= {"1", "3"}, floats  # the MLP's two Linear layers
    search = side["extra"]["float_layers_search"]
    assert search["trials"] and search["goal"] == pytest.approx(1 - 0.0001 / (1 + 1 / 32**0.5))


def test_the_fastest_per_batch_size_is_reported_and_printed(cli, tmp_path, data):
    """One winner cannot be the fastest at every batch size: report.json names each batch size's fastest
    within the budget (the winner is the largest's) with its file, and a single --batch-size picks for it."""
    import ptopt

    names = ["fp32-torchscript", "fp32-onnx"]
    res = ptopt.optimize(
        tiny_cnn(), calib_data=data["calib"], eval_data=data["eval"], accuracy_budget=5.0, candidates=names,
        output=tmp_path / "opt", **FAST,
    )  # fmt: skip
    by = res.report["best_by_batch"]
    assert set(by) == {"1", "4"} and by["4"]["name"] == res.best.name
    for bs, entry in by.items():
        fastest = min(
            (c for c in res.candidates if c.name in names), key=lambda c: c.latency_ms[bs]["median"]
        )
        assert entry["name"] == fastest.name and entry["speedup"] == fastest.speedup[bs]
        assert (tmp_path / "opt" / entry["path"]).is_file()
    saved = json.loads((tmp_path / "opt" / "report.json").read_text())
    assert saved["best_by_batch"] == by
    code, out, err = cli(
        "optimize", FACTORY, "--calib-data", data["calib"], "--eval-data", data["eval"], "--accuracy-budget",
        "5", "--candidates", ",".join(names), *FAST_CLI[2:], "--batch-size", "1", "-o", "opt1",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads((tmp_path / "opt1" / "report.json").read_text())
    assert report["ranking_batch_size"] == 1 and report["best_by_batch"]["1"]["name"] == report["best"]


def test_a_busy_final_timing_is_timed_again_and_recorded(tmp_path, data, monkeypatch):
    """Most cells noisy in the final timing: the machine was busy, not one candidate. It is timed again
    (validate's rule, ``validate.noise.retime_while_busy``) and the report records it."""
    import ptopt
    from ptopt.validate import latency

    real, calls = latency.measure_runners, []

    def first_busy(*args, **kw):
        got = real(*args, **kw)
        calls.append(1)
        if len(calls) == 1:  # every cell of the first final timing spread 300%
            for per_bs in got:
                for st in per_bs.values():
                    st["round_spread_pct"] = 300.0
        return got

    monkeypatch.setattr(latency, "measure_runners", first_busy)
    said = []
    res = ptopt.optimize(
        FACTORY, calib_data=data["calib"], eval_data=data["eval"], accuracy_budget=5.0,
        candidates=["fp32-torchscript"], progress=said.append, **FAST,
    )  # fmt: skip
    t = res.report["timing_noise"]
    assert t["retimed"] == 1 and not t["busy"] and t["cells"] == 4  # 2 candidates x 2 batch sizes
    assert any("the machine is busy: 4 of 4 timings are noisy" in s for s in said)


def test_a_stage_check_on_the_calibration_data_does_not_say_no_eval_data_was_given(
    tmp_path, data, monkeypatch
):
    """optimize hands its int8 builds the calibration data only (its --eval-data is what it judges by): a build
    their own int8 check refused said ``on 64 samples of calib.pt (the calibration data; no --eval-data
    given)`` although --eval-data was given. It names the calibration data and why (quantize alone keeps
    its hint)."""
    import ptopt
    from ptopt.compress import fidelity
    from ptopt.compress.quantize.measure import check_data

    monkeypatch.setitem(fidelity.INT8_VS_FP32, "min_cosine", 1.5)  # no int8 model passes
    res = ptopt.optimize(  # nor the user's budget (it keeps a build the default rule refused when it holds)
        tiny_cnn(), calib_data=data["calib"], eval_data=data["eval"], min_cosine=0.99999,
        candidates=["int8-fx"], **FAST,
    )  # fmt: skip
    cand = res.candidate("int8-fx")
    assert cand.status == "rejected" and "samples of" in cand.reason, (cand.status, cand.reason)
    assert "no --eval-data given" not in cand.reason
    assert "(the calibration data; the int8 stage's own check: optimize judges" in cand.reason
    import types

    from ptopt.core.data import load_data

    prep = types.SimpleNamespace(evald=None, calib=load_data(str(data["calib"])), train=None)
    assert check_data(prep).name.endswith("(the calibration data; no --eval-data given)")
