"""``ptopt validate`` through the CLI: reports, exit codes, baseline regressions, bad input."""

import json
import xml.etree.ElementTree as ET

import pytest

from ptopt.core.timing import round_spread
from tests.validate.conftest import FACTORY, FAST

REPORTS = ("r.json", "r.xml", "r.md", "r.html")


def _report_args(tmp_path):
    return [
        "--json",
        tmp_path / "r.json",
        "--junit",
        tmp_path / "r.xml",
        "--markdown",
        tmp_path / "r.md",
        "--report",
        tmp_path / "r.html",
    ]


def test_reports(cli, artifacts, tmp_path):
    code, out, err = cli(
        "validate",
        FACTORY,
        artifacts["torchscript"],
        artifacts["onnx"],
        "--data",
        artifacts["data"],
        "--batch-sizes",
        "1,4",
        "--threads",
        "1",
        "--max-accuracy-drop",
        "1",
        *FAST,
        "--rounds",
        "3",  # the last --rounds wins
        *_report_args(tmp_path),
    )
    assert code == 0, err
    assert "timing 3 models at batch sizes 1, 4 (3 interleaved rounds)" in err
    assert "PASSED" in out and "★" in out and "tiny.onnx" in out and "absolute: drop = (base - new)" in out
    assert "machine:" in out and "threads: 1" in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == "ptopt.validate/1" and data["passed"] is True and data["batch_sizes"] == [1, 4]
    assert [e["name"] for e in data["artifacts"]] == ["tiny.ts.pt", "tiny.onnx"]
    assert data["reference"]["role"] == "reference" and data["machine"]["versions"]["torch"]
    assert data["latency_options"]["rounds"] == 3
    for e in [data["reference"]] + data["artifacts"]:
        for bs in ("1", "4"):  # every model timed in 3 interleaved slices per batch size, samples pooled
            lat = e["latency"][bs]
            assert lat["rounds"] == 3 and len(lat["round_p50_ms"]) == 3 and lat["iterations"] >= 3
            assert lat["round_spread_pct"] == pytest.approx(round_spread(lat["round_p50_ms"]))
    for e in data["artifacts"]:
        assert set(e) >= {
            "metric",
            "accuracy_drop",
            "agreement",
            "size",
            "latency",
            "speedup",
            "peak_memory_mb",
            "gates",
            "passed",
            "best",
            "format",
            "runtime",
        }
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 2 and suite.get("failures") == "0"
    assert {c.get("classname") for c in cases} == {"ptopt.validate.tiny.ts.pt", "ptopt.validate.tiny.onnx"}
    md = (tmp_path / "r.md").read_text()
    assert md.startswith("### ✅ ptopt validate: PASSED") and "| ★ |" in md and "absolute: drop" in md
    html = (tmp_path / "r.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "absolute: drop" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html  # opens offline


def test_failed_gate_exits_1_after_writing_every_report(cli, artifacts, tmp_path):
    code, out, err = cli(
        "validate",
        FACTORY,
        artifacts["onnx"],
        "--data",
        artifacts["data"],
        "--batch-sizes",
        "1",
        "--threads",
        "1",
        "--max-size-mb",
        "0.000001",
        "--min-agreement",
        "0.9",
        *FAST,
        *_report_args(tmp_path),
    )
    assert code == 1
    assert "max-size-mb" in err and "gate(s) failed" in err and "FAIL" in out
    assert all((tmp_path / r).is_file() for r in REPORTS)
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    failed = [c for c in suite.findall("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["max-size-mb"] and suite.get("tests") == "2"
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is False
    assert "❌" in (tmp_path / "r.md").read_text()


def test_baseline_regression(cli, artifacts, tmp_path):
    base = tmp_path / "base.json"
    args = [
        "validate",
        FACTORY,
        artifacts["torchscript"],
        "--data",
        artifacts["data"],
        "--batch-sizes",
        "1",
        "--threads",
        "1",
        *FAST,
    ]
    assert cli(*args, "--json", base)[0] == 0
    code, out, err = cli(*args, "--baseline", base, "--max-regression", "100000")
    assert code == 0, err
    stored = json.loads(base.read_text())
    stored["artifacts"][0]["latency"]["1"]["p50_ms"] /= 1000.0  # the stored run was 1000x faster
    stored["artifacts"][0]["metric"] = 1.0  # and perfectly accurate
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps(stored))
    code, out, err = cli(*args, "--baseline", fast, "--max-regression", "10", "--json", tmp_path / "r.json")
    assert code == 1
    gates = {
        g["gate"] for g in json.loads((tmp_path / "r.json").read_text())["gate_results"] if not g["passed"]
    }
    assert gates == {"max-regression:latency@bs1", "max-regression:accuracy"}
    code, out, err = cli(*args, "--baseline", fast, "--max-regression", "10", "--regression-on", "accuracy")
    assert code == 1 and "max-regression:latency" not in err


def test_speedup_regression_ignores_machine_speed(cli, artifacts, tmp_path):
    """--regression-on speedup compares reference p50 / artifact p50 of each run: a baseline taken on a
    machine 1000x faster fails the latency check but not the speedup check, and a baseline whose
    artifact was 1000x faster than its reference fails it."""
    base = tmp_path / "base.json"
    args = [
        "validate",
        FACTORY,
        artifacts["torchscript"],
        "--data",
        artifacts["data"],
        "--batch-sizes",
        "1",
        "--threads",
        "1",
        *FAST,
    ]
    assert cli(*args, "--json", base)[0] == 0
    stored = json.loads(base.read_text())
    for e in [stored["reference"]] + stored["artifacts"]:
        e["latency"]["1"]["p50_ms"] /= 1000.0  # every p50 of the stored run 1000x lower: a faster machine
    faster_machine = tmp_path / "faster-machine.json"
    faster_machine.write_text(json.dumps(stored))
    code, out, err = cli(
        *args, "--baseline", faster_machine, "--max-regression", "90", "--regression-on", "latency", "-q"
    )
    assert code == 1 and "max-regression:latency@bs1" in err
    code, out, err = cli(
        *args,
        "--baseline",
        faster_machine,
        "--max-regression",
        "90",
        "--regression-on",
        "speedup,accuracy",
        "--json",
        tmp_path / "r.json",
        "-q",
    )
    assert code == 0, err
    gates = {g["gate"]: g for g in json.loads((tmp_path / "r.json").read_text())["gate_results"]}
    assert set(gates) == {"max-regression:speedup@bs1", "max-regression:accuracy"}
    assert (
        "speedup" in gates["max-regression:speedup@bs1"]["message"]
        and "x ->" in gates["max-regression:speedup@bs1"]["message"]
    )
    stored["artifacts"][0]["speedup"]["1"] *= (
        1000.0  # the artifact used to be 1000x faster than its reference
    )
    lost = tmp_path / "lost-speedup.json"
    lost.write_text(json.dumps(stored))
    code, out, err = cli(
        *args, "--baseline", lost, "--max-regression", "90", "--regression-on", "speedup", "-q"
    )
    assert code == 1 and "max-regression:speedup@bs1" in err and "max-regression:latency" not in err


def _bad(tmp_path, *more):
    return [*more, "--data", tmp_path / "nodata"]


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "garbage",
        "mar",
        "state_dict",
        "data-mismatch",
        "accuracy-unlabeled",
        "latency-bs-not-measured",
        "baseline-without-pct",
        "unknown-metric",
        "regression-without-baseline",
        "bad-batch-sizes",
        "tensorrt",
        "report-unwritable",
        "metric-fails",
        "zero-rounds",
        "bad-regression-on",
        "baseline-lacks-batch",
        "regression-accuracy-unlabeled",
    ],
)
def test_bad_input_exits_2_before_measuring(cli, artifacts, tmp_path, case):
    from ptopt.core.artifact import Artifact

    data, extra, art = artifacts["data"], [], artifacts["onnx"]
    reference = FACTORY
    expect = {
        "missing": "no such file",
        "garbage": "not a PyTorch model file",
        "mar": "TorchServe .mar package",
        "state_dict": "state_dict",
        "data-mismatch": "does not fit tiny.onnx",
        "accuracy-unlabeled": "needs labels",
        "latency-bs-not-measured": "batch size 64 is not measured",
        "baseline-without-pct": "--baseline needs --max-regression",
        "unknown-metric": "unknown metric",
        "regression-without-baseline": "--max-regression needs --baseline",
        "bad-batch-sizes": "--batch-sizes",
        "tensorrt": "torch_tensorrt is needed",
        "report-unwritable": "cannot write there",
        "metric-fails": "broken on purpose",
        "zero-rounds": "--rounds must be >= 1",
        "bad-regression-on": "--regression-on: unknown latncy",
        "baseline-lacks-batch": "the baseline did not time batch size(s) 1",
        "regression-accuracy-unlabeled": "--regression-on accuracy needs the metric",
    }[case]
    if case == "missing":
        art = tmp_path / "nope.onnx"
    elif case == "garbage":
        art = tmp_path / "junk.bin"
        art.write_bytes(b"not a model at all")
    elif case == "mar":
        art = tmp_path / "m.mar"
        art.write_bytes(b"PK")
        Artifact(art, "mar").finalize()
    elif case == "state_dict":
        import torch

        from tests.helpers import tiny_cnn

        art = tmp_path / "w.pt"
        torch.save(tiny_cnn().state_dict(), art)
    elif case == "data-mismatch":
        reference, data = "zoo:resnet", artifacts["data32"]
    elif case == "accuracy-unlabeled":
        data, extra = artifacts["unlabeled"], ["--max-accuracy-drop", "1"]
    elif case == "latency-bs-not-measured":
        extra = ["--max-latency-ms", "64=5"]
    elif case == "baseline-without-pct":
        (tmp_path / "b.json").write_text(json.dumps({"schema": "ptopt.validate/1", "artifacts": []}))
        extra = ["--baseline", tmp_path / "b.json"]
    elif case == "unknown-metric":
        extra = ["--metric", "f1-macro"]
    elif case == "regression-without-baseline":
        extra = ["--max-regression", "5"]
    elif case == "bad-regression-on":
        extra = ["--regression-on", "latncy"]
    elif case in (
        "baseline-lacks-batch",
        "regression-accuracy-unlabeled",
    ):  # a regression gate comparing nothing
        (tmp_path / "b.json").write_text(
            json.dumps(
                {
                    "schema": "ptopt.validate/1",
                    "artifacts": [],
                    "batch_sizes": [32],
                    "metric": {"name": "top1", "measured": True},
                }
            )
        )
        extra = [
            "--baseline",
            tmp_path / "b.json",
            "--max-regression",
            "5",
            "--regression-on",
            "latency,speedup" if case == "baseline-lacks-batch" else "accuracy",
        ]
        if case == "regression-accuracy-unlabeled":
            data = artifacts["unlabeled"]
    elif case == "bad-batch-sizes":
        extra = ["--batch-sizes", "1,x"]
    elif case == "tensorrt":
        art = tmp_path / "engine.ep"
        art.write_bytes(artifacts["exported_program"].read_bytes())
        Artifact(art, "tensorrt").finalize()
    elif case == "metric-fails":
        extra = ["--metric", "tests.validate.fns:broken"]
    elif case == "zero-rounds":
        extra = ["--rounds", "0"]
    elif case == "report-unwritable":
        (tmp_path / "file").write_text("")
        extra = ["--report", tmp_path / "file" / "r.html"]  # a file is in the way
    code, out, err = cli(
        "validate",
        reference,
        art,
        "--data",
        data,
        "--threads",
        "1",
        *FAST,
        *extra,
        *(_report_args(tmp_path)[:6] if case == "report-unwritable" else _report_args(tmp_path)),
    )
    assert code == 2, (out, err)
    assert expect in err and "Traceback" not in err and err.count("\n") <= 8
    assert "evaluating" not in err and "timing" not in err  # rejected before any measurement started
    assert not any((tmp_path / r).exists() for r in REPORTS)


def test_bad_input_names_the_artifact_and_shapes(cli, artifacts, tmp_path):
    code, out, err = cli(
        "validate", "zoo:resnet", artifacts["onnx"], "--data", artifacts["data32"], "--threads", "1"
    )
    assert code == 2
    assert (
        "does not fit tiny.onnx" in err
        and "expected input: [1..64]x1x8x8 float32" in err
        and "2x1x32x32" in err
    )


def test_artifact_against_the_base_commits_artifact(cli, artifacts, tmp_path):
    """The latency check of examples/github-actions/ptopt-gate.yml: the base commit's artifact is the
    reference, the pull request's the artifact; same file name in two folders, told apart by path."""
    import shutil

    for side in ("base-build", "build"):
        (tmp_path / side).mkdir()
        for f in artifacts["onnx"].parent.glob("tiny.onnx*"):
            shutil.copy2(f, tmp_path / side / f.name)
    args = [
        "validate",
        "base-build/tiny.onnx",
        "build/tiny.onnx",
        "--data",
        artifacts["data"],
        "--batch-sizes",
        "1,4",
        "--threads",
        "1",
        *FAST,
        "--max-accuracy-drop",
        "0.5",
        "--json",
        tmp_path / "r.json",
        "-q",
    ]
    code, out, err = cli(*args, "--min-speedup", "0.01")
    assert code == 0, err
    data = json.loads((tmp_path / "r.json").read_text())
    assert (
        data["reference"]["name"] == "base-build/tiny.onnx"
        and data["artifacts"][0]["name"] == "build/tiny.onnx"
    )
    assert data["artifacts"][0]["accuracy_drop"] == 0 and set(data["artifacts"][0]["speedup"]) == {"1", "4"}
    code, out, err = cli(*args, "--min-speedup", "1000")  # "the pull request made it slower"
    assert code == 1 and "min-speedup@bs1" in err and "build/tiny.onnx" in err
