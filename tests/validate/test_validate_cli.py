"""``ptopt validate`` through the CLI: reports, exit codes, baseline regressions, bad input."""

import json
import xml.etree.ElementTree as ET

import pytest

from ptopt.core.timing import round_spread
from tests.helpers import assert_refused
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
    assert "PASSED" in out and "tiny.onnx" in out and "absolute: drop = (base - new)" in out
    assert "machine:" in out and "threads: 1" in out
    data = json.loads((tmp_path / "r.json").read_text())
    # ★ only on a clear lead (ptopt.validate.noise; tests/validate/test_validate_noise.py makes it noisy)
    crowned = data["best_verdict"] == "clear"
    assert ("★" in out) is crowned and ("no clear best" in out) is not crowned
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
    assert (
        md.startswith("### ✅ ptopt validate: PASSED")
        and ("| ★ |" in md) is crowned
        and "absolute: drop" in md
    )
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


def _before_measuring(cli):
    """``cli`` for ``assert_refused``, asserting that no measurement started: the "checking NAME" lines
    of the probe may come before the error, "evaluating" and "timing" may not."""

    def run(*args):
        code, out, err = cli(*args)
        lines = err.strip().splitlines()
        assert not any(ln.startswith(("evaluating ", "timing ")) for ln in lines), err
        return code, out, "\n".join(ln for ln in lines if not ln.startswith("checking "))

    run.is_cli = True
    return run


def _baseline(tmp_path, **fields):
    (tmp_path / "b.json").write_text(json.dumps({"schema": "ptopt.validate/1", "artifacts": [], **fields}))
    return tmp_path / "b.json"


def _regression_baseline(tmp_path):
    """A baseline that times batch 32 only, with a labelled metric: a regression gate comparing nothing."""
    return _baseline(tmp_path, batch_sizes=[32], metric={"name": "top1", "measured": True})


def _garbage(tmp_path, artifacts):
    (tmp_path / "junk.bin").write_bytes(b"not a model at all")
    return {"art": tmp_path / "junk.bin"}


def _mar(tmp_path, artifacts):
    from ptopt.core.artifact import Artifact

    (tmp_path / "m.mar").write_bytes(b"PK")
    Artifact(tmp_path / "m.mar", "mar").finalize()
    return {"art": tmp_path / "m.mar"}


def _state_dict(tmp_path, artifacts):
    import torch

    from tests.helpers import tiny_cnn

    torch.save(tiny_cnn().state_dict(), tmp_path / "w.pt")
    return {"art": tmp_path / "w.pt"}


def _tensorrt(tmp_path, artifacts):
    from ptopt.core.artifact import Artifact

    art = tmp_path / "engine.ep"
    art.write_bytes(artifacts["exported_program"].read_bytes())
    Artifact(art, "tensorrt").finalize()
    return {"art": art}


def _report_unwritable(tmp_path, artifacts):
    (tmp_path / "file").write_text("")
    return {"extra": ["--report", tmp_path / "file" / "r.html"], "reports": 6}  # a file is in the way


#: case -> (what changes from a good run: {"art", "reference", "data" (a key of `artifacts`), "extra",
#: "reports" (how many report arguments)}, or a function of (tmp_path, artifacts) returning that;
#: what the error line says)
BAD_INPUTS = {
    "missing": (lambda t, a: {"art": t / "nope.onnx"}, "no such file"),
    "garbage": (_garbage, "not a PyTorch model file"),
    "mar": (_mar, "TorchServe .mar package"),
    "state_dict": (_state_dict, "state_dict"),
    "data-mismatch": ({"reference": "zoo:resnet", "data": "data32"}, "does not fit tiny.onnx"),
    "accuracy-unlabeled": ({"data": "unlabeled", "extra": ["--max-accuracy-drop", "1"]}, "needs labels"),
    "latency-bs-not-measured": ({"extra": ["--max-latency-ms", "64=5"]}, "batch size 64 is not measured"),
    "baseline-without-pct": (
        lambda t, a: {"extra": ["--baseline", _baseline(t)]},
        "--baseline needs --max-regression",
    ),
    "unknown-metric": ({"extra": ["--metric", "f1-macro"]}, "unknown metric"),
    "regression-without-baseline": (
        {"extra": ["--max-regression", "5"]},
        "--max-regression needs --baseline",
    ),
    "bad-batch-sizes": ({"extra": ["--batch-sizes", "1,x"]}, "--batch-sizes"),
    "zero-batch-size": ({"extra": ["--batch-sizes", "0"]}, "batch sizes must be positive"),
    "tensorrt": (_tensorrt, "torch_tensorrt is needed"),
    "report-unwritable": (_report_unwritable, "cannot write there"),
    "metric-fails": ({"extra": ["--metric", "tests.validate.fns:broken"]}, "broken on purpose"),
    "zero-rounds": ({"extra": ["--rounds", "0"]}, "--rounds must be >= 1"),
    "zero-min-iters": ({"extra": ["--min-iters", "0"]}, "--min-iters must be >= 1"),
    "zero-threads": ({"extra": ["--threads", "0"]}, "--threads must be >= 1"),
    "zero-eval-batch-size": ({"extra": ["--eval-batch-size", "0"]}, "--eval-batch-size must be >= 1"),
    "zero-max-samples": ({"extra": ["--max-samples", "0"]}, "--max-samples must be >= 1"),
    "negative-size-gate": ({"extra": ["--max-size-mb", "-1"]}, "--max-size-mb must be >= 0"),
    "agreement-over-1": ({"extra": ["--min-agreement", "99"]}, "--min-agreement is a fraction"),
    "bad-latency-limit": ({"extra": ["--max-latency-ms", "fast"]}, "--max-latency-ms 'fast'"),
    "bad-regression-on": ({"extra": ["--regression-on", "latncy"]}, "--regression-on: unknown latncy"),
    "baseline-not-json": (
        lambda t, a: (
            (t / "b.json").write_text("{")
            and {"extra": ["--baseline", t / "b.json", "--max-regression", "5"]}
        ),
        "not a JSON file",
    ),
    "baseline-lacks-batch": (
        lambda t, a: {
            "extra": [
                "--baseline",
                _regression_baseline(t),
                "--max-regression",
                "5",
                "--regression-on",
                "latency,speedup",
            ]
        },
        "the baseline did not time batch size(s) 1",
    ),
    "regression-accuracy-unlabeled": (
        lambda t, a: {
            "data": "unlabeled",
            "extra": [
                "--baseline",
                _regression_baseline(t),
                "--max-regression",
                "5",
                "--regression-on",
                "accuracy",
            ],
        },
        "--regression-on accuracy needs the metric",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_exits_2_before_measuring(cli, artifacts, tmp_path, case):
    setup, expect = BAD_INPUTS[case]
    change = setup(tmp_path, artifacts) if callable(setup) else setup
    data = artifacts[change.get("data", "data")]
    args = [change.get("reference", FACTORY), change.get("art", artifacts["onnx"]), "--data", data]
    reports = _report_args(tmp_path)[: change.get("reports", 8)]
    args += ["--threads", "1", *FAST, *change.get("extra", []), *reports]
    assert_refused(_before_measuring(cli), "validate", *args, match=expect, where=tmp_path)


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


def test_timing_defaults_and_the_environment(monkeypatch):
    """Without PTOPT_VALIDATE_* the CLI times with LatencyOptions' defaults; a value in the environment
    replaces the default, and one on the command line replaces both."""
    from ptopt.cli.main import cli
    from ptopt.validate.latency import MIN_SECONDS, ROUNDS, LatencyOptions

    def params(*args):
        ctx = cli.make_context(
            "ptopt", ["validate", "m.pt", "a.onnx", "--data", "d.pt", *args], auto_envvar_prefix="PTOPT"
        )
        sub = cli.get_command(ctx, "validate")
        return sub.make_context("validate", ["m.pt", "a.onnx", "--data", "d.pt", *args], parent=ctx).params

    for key in ("PTOPT_VALIDATE_MIN_SECONDS", "PTOPT_VALIDATE_ROUNDS"):
        monkeypatch.delenv(key, raising=False)
    got = params()  # not given: LatencyOptions' defaults apply
    assert (got["min_seconds"], got["rounds"]) == (None, None)
    assert (LatencyOptions().min_seconds, LatencyOptions().rounds) == (MIN_SECONDS, ROUNDS) == (3.0, 15)
    monkeypatch.setenv("PTOPT_VALIDATE_ROUNDS", "4")
    assert params()["rounds"] == 4 and params("--rounds", "7")["rounds"] == 7


def test_environment_values_apply_to_a_tensor_model(cli, artifacts, tmp_path, monkeypatch):
    """The timing options set in the environment time a tensor model; a language-model option set there
    (--context) is left out, not refused; one whose partner is missing (--max-regression without
    --baseline: a CI runner sets it for the jobs that pass one) is left out with a note, while typed it
    is refused; a refusal naming an option from the environment says so."""
    env = {"MIN_SECONDS": "0.01", "ROUNDS": "2", "MIN_ITERS": "3", "CONTEXT": "64", "MAX_REGRESSION": "5"}
    for key, value in env.items():
        monkeypatch.setenv(f"PTOPT_VALIDATE_{key}", value)
    args = ("validate", FACTORY, artifacts["torchscript"], "--data", artifacts["data"], "--batch-sizes", "1")
    code, out, err = cli(*args, "--json", tmp_path / "r.json")
    assert code == 0, err
    notes = [line for line in err.splitlines() if "PTOPT_VALIDATE_MAX_REGRESSION" in line]
    assert notes == [
        "note: ignored PTOPT_VALIDATE_MAX_REGRESSION=5 in the environment: --max-regression needs --baseline "
        "previous.json (a --json report of an earlier run)"
    ]
    report = json.loads((tmp_path / "r.json").read_text())
    got = report["latency_options"]
    assert (got["min_seconds"], got["rounds"], got["min_iters"]) == (0.01, 2, 3)
    assert report["gates"].get("max_regression") is None
    assert_refused(cli, *args, "--max-regression", "5", match="--max-regression needs --baseline")
    monkeypatch.setenv("PTOPT_VALIDATE_MAX_REGRESSION", "-5")
    assert_refused(cli, *args, match="--max-regression: PTOPT_VALIDATE_MAX_REGRESSION=-5 in the environment")
