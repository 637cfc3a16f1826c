"""`ptopt demo`: the whole pipeline end to end, then a second run that reuses every artifact."""

import json

import pytest

from ptopt.core.artifact import Artifact


@pytest.mark.slow
@pytest.mark.timeout(1500)  # trains zoo:resnet and zoo:lstm from scratch (~2.5 min of the ~4.5 min here)
def test_demo_runs_end_to_end_and_reuses_artifacts(cli, tmp_path):
    out = tmp_path / "demo"
    code, stdout, err = cli("demo", "-o", out, "--threads", "2")
    assert code == 0, err[-3000:]
    expected = [
        "resnet.int8.pt",
        "resnet.qat.pt",
        "lstm.int8.pt",
        "resnet.pruned.pt",
        "resnet.sparse.pt",
        "resnet.ts.pt",
        "resnet.onnx",
        "resnet.int8.onnx",
    ]
    for name in expected:
        art = Artifact.load(out / name)  # every artifact has its sidecar
        assert art.size_bytes > 0
    assert Artifact.load(out / "resnet.int8.pt").precision == "int8"
    assert Artifact.load(out / "resnet.int8.onnx").precision == "int8"
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and len(report["artifacts"]) == 7
    assert report["best"] and (out / "resnet-best.mar").is_file() and (out / "report.html").is_file()
    assert "<img" in (out / "report.html").read_text() and (out / "summary.md").read_text().strip()
    assert "ptopt validate — PASSED" in stdout and "resnet-best.mar" in stdout

    code, stdout, err = cli("demo", "-o", out, "--threads", "2")
    assert code == 0, err[-3000:]
    assert err.count("reusing") == len(expected) and "reused 8 cached artifacts" in stdout
