"""``validate --compile``: eager and ExportedProgram models also timed through torch.compile, as extra
rows with their compile time; refused in one line without a C++ compiler or without such a model.

torch.compile of the tiny CNN takes a few seconds per phase (probe, accuracy, timing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ptopt.core.errors import MissingDependencyError, UsageError
from ptopt.validate.api import validate
from tests.helpers import assert_refused
from tests.validate.conftest import FACTORY, FAST
from tests.validate.test_validate_api import QUICK


def test_api_adds_a_compiled_row_per_eager_and_exported_model(artifacts):
    res = validate(
        FACTORY,
        [artifacts["exported_program"], artifacts["torchscript"]],
        artifacts["data"],
        batch_sizes=(1, 8),
        threads=1,
        latency=QUICK,
        compile=True,
    )
    names = [e["name"] for e in res.entries]
    ref = res.reference["name"]
    # the reference's compiled row first, each right after its model; TorchScript gets none
    assert names == [f"{ref} (torch.compile)", "tiny.pt2", "tiny.pt2 (torch.compile)", "tiny.ts.pt"]
    for e in res.entries[0], res.entries[2]:
        assert "torch.compile" in e["runtime"] and e["info"]["compile_seconds"] > 0
        assert set(e["latency"]) == {"1", "8"} and e["speedup"]
        # the same model compiled: same predictions as the reference
        assert e["agreement"]["top1_agreement"] == 1.0
        assert e["metric"] == pytest.approx(res.reference["metric"])
    assert res.entries[0]["info"]["compiled_from"] == "eager"
    assert res.entries[2]["info"]["compiled_from"] == "exported_program"


def test_cli_reports_compile_time(cli, tmp_path, artifacts):
    code, out, err = cli(
        "validate", FACTORY, artifacts["onnx"], "--data", artifacts["data"], "--batch-sizes", "1",
        "--threads", "1", "--compile", "--json", "r.json", "-q", *FAST,
    )  # fmt: skip
    assert code == 0, err
    assert "(torch.compile)" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("torch.compile:"))
    assert "compiled in" in line and line.rstrip().endswith(" s")
    rows = json.loads((tmp_path / "r.json").read_text())["artifacts"]
    compiled = [r for r in rows if r["name"].endswith("(torch.compile)")]
    assert len(compiled) == 1 and np.isfinite(compiled[0]["latency"]["1"]["p50_ms"])


def test_refused_without_a_compiler(cli, tmp_path, artifacts, monkeypatch):
    from torch._inductor import cpp_builder

    def no_compiler(*a, **k):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    args = (FACTORY, artifacts["onnx"], "--data", artifacts["data"], "--compile")
    assert_refused(cli, "validate", *args, match=("--compile", "C++ compiler", "g++"), where=tmp_path)
    assert_refused(
        validate, FACTORY, artifacts["onnx"], artifacts["data"], compile=True,
        match="C++ compiler", error=MissingDependencyError, where=tmp_path,
    )  # fmt: skip


def test_refused_when_nothing_can_be_compiled(tmp_path, artifacts):
    assert_refused(
        validate, artifacts["torchscript"], artifacts["onnx"], artifacts["data"], compile=True, threads=1,
        match=("--compile", "none here", "onnx", "torchscript"), error=UsageError, where=tmp_path,
    )  # fmt: skip
