"""`ptopt demo`: the whole pipeline end to end, then a second run that reuses every artifact."""

import json
from pathlib import Path

import pytest

from ptopt.core.artifact import Artifact
from tests.helpers import worker_threads

EXPECTED = [
    "resnet.int8.pt",
    "resnet.qat.pt",
    "lstm.int8.pt",
    "resnet.pruned.pt",
    "resnet.sparse.pt",
    "resnet.ts.pt",
    "resnet.onnx",
    "resnet.int8.onnx",
]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # ~1 min alone on 2 cores (the zoo ships trained), minutes in CI
def test_demo_runs_end_to_end_and_reuses_artifacts(cli, tmp_path, monkeypatch, capsys):
    import functools

    from ptopt.demo import demo
    from ptopt.validate import api

    out = tmp_path / "demo"
    threads = worker_threads() or 2  # the cores this test process has (pytest-xdist splits them)
    lines: list[str] = []
    # the first run through the Python API; validate's timing at its least (2 rounds of 2 iterations per
    # artifact and batch size): the pipeline is what is checked here, not the speedups
    first = demo(out, threads=threads, log=lines.append, min_seconds=0, min_iters=2, rounds=2)
    assert first.passed and first.reused == [] and not any("reusing" in line for line in lines)
    # the prune steps' fine-tunes (90 s and 53 s of a 340 s demo) show their progress, not only "still
    # working": each its header line (an epoch's own line shows only once it has run a few seconds)
    err = capsys.readouterr().err
    assert "fine-tune (69 batches)" in err and "fine-tune (23 batches)" in err, err[-3000:]
    assert first.mar == out / "resnet-best.mar"
    assert sorted(p.name for p in first.artifacts.values()) == sorted(EXPECTED)
    for name in EXPECTED:
        art = Artifact.load(out / name)  # every artifact has its sidecar
        assert art.size_bytes > 0
        assert any(f": {out / name} (" in line for line in lines), name  # built, and said so
    assert Artifact.load(out / "resnet.int8.pt").precision == "int8"
    assert Artifact.load(out / "resnet.int8.onnx").precision == "int8"
    assert Artifact.load(out / "resnet.qat.pt").extra["training"]["max_steps"] == 8
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and len(report["artifacts"]) == 7 and report["best"] == first.best
    timing = report["latency_options"]
    assert (timing["min_seconds"], timing["min_iters"], timing["rounds"]) == (0, 2, 2)
    assert (out / "resnet-best.mar").is_file() and (out / "report.html").is_file()
    assert "<img" in (out / "report.html").read_text() and (out / "summary.md").read_text().strip()
    built = {name: (out / name).stat().st_mtime_ns for name in EXPECTED}
    (out / "resnet-best.mar").unlink()

    # the second run, as a user types it: every artifact reused (none rewritten) and handed on to both
    # validations and the package. What is checked is the reuse: the validations, run on these very files
    # above, answer with the first run's results (recording what they were given); the package runs again.
    given: list[tuple[str, list[str]]] = []
    earlier = {"zoo:resnet": first.validation, "zoo:lstm": first.lstm_validation}

    @functools.wraps(api.validate)
    def validated_above(**options):
        given.append((options["reference"], [Path(a).name for a in options["artifacts"]]))
        return earlier[options["reference"]]

    monkeypatch.setattr(api, "validate", validated_above)
    code, stdout, err = cli("demo", "-o", out, "--threads", threads)
    assert code == 0, err[-3000:]
    reusing = [line for line in err.splitlines() if ": reusing " in line]
    assert sorted(line.rsplit("/", 1)[-1] for line in reusing) == sorted(EXPECTED), err[-3000:]
    assert {name: (out / name).stat().st_mtime_ns for name in EXPECTED} == built
    cnn = [name for name in EXPECTED if name != "lstm.int8.pt"]
    assert given == [("zoo:resnet", cnn), ("zoo:lstm", ["lstm.int8.pt"])]
    assert (out / "resnet-best.mar").is_file() and f"ptopt serve {out / 'resnet-best.mar'}" in stdout
    assert "(reused 8 cached artifacts)" in stdout and stdout.count("ptopt validate — PASSED") == 2


@pytest.mark.parametrize("tensorrt", [False, True], ids=["cpu", "tensorrt"])
def test_demo_is_a_built_in_recipe_the_pipeline_checks(tensorrt):
    """The demo's steps pass the same pre-check as a recipe file: twins, options, ${...} references."""
    from ptopt.demo import CNN_STEPS, demo_recipe
    from ptopt.pipeline import plan

    steps, scope = plan(demo_recipe(tensorrt=tensorrt), {"out": "somewhere"}, source="demo")
    assert [s.command for s in steps] == ["quantize"] * 3 + ["prune"] * 2 + ["export"] * 4 + [
        "validate",
        "validate",
        "package",
    ]
    assert scope["out"] == "somewhere" and [s.id for s in steps[: len(CNN_STEPS)]] == [
        c[0] for c in CNN_STEPS
    ]
    cnn = next(s for s in steps if s.id == "cnn")
    assert len(cnn.options["artifacts"]) == 7 + tensorrt and "${lstm8}" not in cnn.options["artifacts"]
    assert cnn.title.startswith(f"validate {7 + tensorrt} artifacts against zoo:resnet")
    assert callable(steps[-1].when) and steps[-1].options["artifact"] == "${cnn.best_path}"


def test_demo_timing_options_reach_both_validations():
    from ptopt.demo import demo_recipe
    from ptopt.pipeline import plan

    steps, _ = plan(demo_recipe(min_seconds=0.1, min_iters=3, rounds=4), {"out": "x"}, source="demo")
    checks = [s.options for s in steps if s.command == "validate"]
    assert [(o["min_seconds"], o["min_iters"], o["rounds"]) for o in checks] == [(0.1, 3, 4), (0.1, 3, 4)]
    defaults = plan(demo_recipe(), {"out": "x"}, source="demo")[0]
    assert all("min_iters" not in s.options and "rounds" not in s.options for s in defaults)


@pytest.mark.parametrize(
    "option, value, match",
    [
        ("--min-iters", "0", "--min-iters must be >= 1"),
        ("--min-seconds", "-1", "--min-seconds must be >= 0"),
        ("--rounds", "0", "--rounds must be >= 1"),
    ],
    ids=["min-iters", "min-seconds", "rounds"],
)
def test_bad_timing_is_refused_before_any_work(cli, tmp_path, option, value, match):
    from ptopt.demo import demo
    from tests.helpers import assert_refused

    assert_refused(cli, "demo", "-o", tmp_path / "d", option, value, match=match, where=tmp_path)
    keyword = {option.lstrip("-").replace("-", "_"): (float if option == "--min-seconds" else int)(value)}
    assert_refused(demo, tmp_path / "d", match=match, where=tmp_path, **keyword)
