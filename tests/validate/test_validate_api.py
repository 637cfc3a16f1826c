"""The Python twin: every runner, the metrics against an independent evaluation, gates, best pick."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ptopt.core.data import load_data
from ptopt.core.errors import (
    DataError,
    GateFailedError,
    MissingDependencyError,
    ShapeMismatchError,
    UsageError,
)
from ptopt.validate.api import validate
from ptopt.validate.gates import accuracy_drop, drop_definition
from ptopt.validate.latency import LatencyOptions
from tests.helpers import assert_refused
from tests.validate.conftest import FACTORY

QUICK = LatencyOptions(min_iters=3, min_seconds=0.01, warmup_iters=1, warmup_seconds=0.0, rounds=2)


def _run(artifacts, refs, data=None, **kw):
    return validate(
        FACTORY,
        [artifacts[r] for r in refs],
        data or artifacts["data"],
        batch_sizes=(1, 8),
        threads=1,
        latency=QUICK,
        **kw,
    )


def test_every_format_runs_in_its_runtime(artifacts):
    res = _run(artifacts, ["torchscript", "exported_program", "onnx"])
    assert res.passed and len(res.entries) == 3
    by = {e["name"]: e for e in res.entries}
    assert by["tiny.ts.pt"]["runtime"] == "torch.jit"
    assert by["tiny.pt2"]["runtime"] == "torch.export"
    assert by["tiny.onnx"]["runtime"] == "onnxruntime (CPU)"
    assert (
        res.reference["runtime"] == "torch eager" and res.reference["size"]["what"] == "state_dict (no file)"
    )
    for e in res.entries:
        assert e["agreement"]["top1_agreement"] == 1.0 and e["agreement"]["cosine"] > 0.9999
        assert e["agreement"]["max_abs_diff"] < 1e-4
        assert e["metric"] == res.reference["metric"] and e["accuracy_drop"] == 0.0
        for bs in ("1", "8"):
            st = e["latency"][bs]
            assert st["p50_ms"] > 0 and st["p50_ms"] <= st["p90_ms"] <= st["p99_ms"] and st["iterations"] >= 3
            assert e["speedup"][bs] > 0
        assert e["peak_memory_mb"] is None or e["peak_memory_mb"] > 0
    onnx = by["tiny.onnx"]
    files = [artifacts["onnx"].parent / f for f in onnx["size"]["files"]]
    assert onnx["size"]["bytes"] == sum(f.stat().st_size for f in files) and 0 < onnx["size"]["gzip_bytes"]
    assert res.data["threads"] == 1 and res.data["machine"]["cpu"]["model"]
    json.dumps(res.to_dict())  # JSON-ready as is


def test_accuracy_equals_an_independent_evaluation(artifacts):
    """The same samples through plain torch.jit / onnxruntime give exactly the accuracy validate reports."""
    import onnxruntime as ort

    ds = load_data(artifacts["data"])
    ts = torch.jit.load(str(artifacts["torchscript"]))
    with torch.no_grad():
        ts_acc = float((torch.cat([ts(b.x) for b in ds.batches(64)]).argmax(1) == ds.y).double().mean())
    sess = ort.InferenceSession(str(artifacts["onnx"]), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    logits = np.concatenate([sess.run(None, {name: b.x.numpy()})[0] for b in ds.batches(64)])
    ort_acc = float((logits.argmax(1) == ds.y.numpy()).mean())
    res = _run(artifacts, ["torchscript", "onnx"])
    assert res.entry("tiny.ts.pt")["metric"] == ts_acc
    assert res.entry("tiny.onnx")["metric"] == ort_acc


def test_fixed_batch_artifact_skips_other_batch_sizes(artifacts):
    res = _run(artifacts, ["static_pt2"])
    e = res.entries[0]
    assert e["batch_range"] == [1, 1] and e["eval_batch_size"] == 1
    assert "p50_ms" in e["latency"]["1"] and "fixed batch size of 1" in e["latency"]["8"]["skipped"]
    assert e["agreement"]["top1_agreement"] == 1.0


def test_user_metric_and_lower_is_better(artifacts):
    res = _run(artifacts, ["torchscript"], metric="tests.validate.fns:error_rate", max_accuracy_drop=0.0)
    assert res.data["metric"]["name"] == "tests.validate.fns:error_rate"
    assert res.data["metric"]["higher_is_better"] is False
    assert 0 < res.reference["metric"] < 1 and res.entries[0]["accuracy_drop"] == 0.0 and res.passed


def test_unlabeled_data_measures_agreement_only(artifacts):
    res = _run(artifacts, ["onnx"], data=artifacts["unlabeled"], min_agreement=0.99)
    assert (
        res.entries[0]["metric"] is None
        and res.entries[0]["agreement"]["top1_agreement"] == 1.0
        and res.passed
    )


@pytest.mark.parametrize(
    "relative,expected", [(False, 0.6), (True, 0.006 / 0.981 * 100)], ids=["absolute", "relative"]
)
def test_accuracy_drop_definition(relative, expected):
    assert accuracy_drop(0.981, 0.975, relative=relative) == pytest.approx(expected)
    assert accuracy_drop(0.2, 0.25, higher_is_better=False, scale=1.0) == pytest.approx(0.05)
    assert drop_definition(relative).startswith("relative:" if relative else "absolute:")


def test_failed_gates_and_best_pick(artifacts, tmp_path):
    res = _run(
        artifacts,
        ["torchscript", "onnx"],
        max_size_mb=1e-6,
        min_speedup=0.0,
        max_latency_ms=["1=10000"],
        json_path=tmp_path / "r.json",
    )
    assert not res.passed and res.best is None
    assert {g["gate"] for g in res.failed_gates} == {"max-size-mb"}
    gates = {g["gate"] for g in res.entries[0]["gates"]}
    assert gates == {"max-size-mb", "min-speedup@bs1", "min-speedup@bs8", "max-latency-ms@bs1"}
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is False
    ok = _run(artifacts, ["torchscript", "onnx"], max_accuracy_drop=0.5, relative=True)
    assert ok.passed and ok.best in ("tiny.ts.pt", "tiny.onnx")
    assert sum(e["best"] for e in ok.entries) == (ok.data["best_verdict"] == "clear")  # no ★ on noise
    assert ok.data["accuracy_drop"]["definition"].startswith("relative:")


def test_raise_on_failure_after_reports(artifacts, tmp_path):
    with pytest.raises(GateFailedError, match="max-size-mb"):
        _run(artifacts, ["onnx"], max_size_mb=1e-6, raise_on_failure=True, markdown_path=tmp_path / "r.md")
    assert "❌" in (tmp_path / "r.md").read_text()


def test_python_twin_accepts_modules_and_names_bad_data(artifacts):
    from tests.helpers import tiny_cnn

    res = validate(
        tiny_cnn(), [tiny_cnn()], artifacts["data"], batch_sizes="1", threads=1, latency=QUICK, max_samples=10
    )
    assert res.data["data"]["samples"] == 10 and res.entries[0]["name"] == "TinyCNN (2)"
    with pytest.raises(ShapeMismatchError, match=r"does not fit tiny.onnx.*expected input: \[1..64\]x1x8x8"):
        validate("zoo:resnet", [artifacts["onnx"]], artifacts["data32"], threads=1, latency=QUICK)
    with pytest.raises(UsageError, match="needs labels"):
        _run(artifacts, ["onnx"], data=artifacts["unlabeled"], max_accuracy_drop=1)


def test_tensorrt_artifact_needs_tensorrt(artifacts, tmp_path):
    from ptopt.core.artifact import Artifact

    p = tmp_path / "engine.ep"
    p.write_bytes(artifacts["exported_program"].read_bytes())
    Artifact(p, "tensorrt").finalize()
    with pytest.raises(MissingDependencyError, match="torch_tensorrt"):
        _run({"data": artifacts["data"], "trt": p}, ["trt"])


def test_keyword_inputs_in_every_runtime(tmp_path):
    """input_ids + attention_mask: fed by name to the ExportedProgram and to ONNX Runtime."""
    import warnings

    import ptopt
    from ptopt.core.artifact import Artifact
    from ptopt.core.inputspec import specs_from_example
    from tests.helpers import two_input

    ds = load_data("builtin:digits-tokens:test").take(40)
    m, x = two_input().eval(), ds.take(4).x
    specs = specs_from_example(x)
    batch = torch.export.Dim("batch", min=1, max=64)
    dyn = {"input_ids": {0: batch}, "attention_mask": {0: batch}}
    torch.export.save(torch.export.export(m, (), x, dynamic_shapes=dyn), str(tmp_path / "kw.pt2"))
    Artifact(tmp_path / "kw.pt2", "exported_program", specs, input_style="keyword").finalize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (), str(tmp_path / "kw.onnx"), kwargs=x, dynamic_shapes=dyn, verbose=False)
    res = ptopt.validate(
        "tests.helpers:two_input",
        [tmp_path / "kw.pt2", tmp_path / "kw.onnx"],
        ds,
        threads=1,
        latency=QUICK,
        batch_sizes=(1, 4),
    )
    assert [e["runtime"] for e in res.entries] == ["torch.export", "onnxruntime (CPU)"]
    assert all(e["agreement"]["top1_agreement"] == 1.0 and e["accuracy_drop"] == 0.0 for e in res.entries)


def test_runtime_failure_after_the_probe_names_the_artifact(artifacts):
    """Picky takes batches of up to 2: failing at 64 while smaller batches of the same samples run is
    a batch size it does not take (a shape problem)."""
    with pytest.raises(
        ShapeMismatchError,
        match=r"tests.validate.fns:picky .*accuracy pass.*batch 64 is too large.*does not take this batch size",
    ):
        validate(FACTORY, ["tests.validate.fns:picky"], artifacts["data"], threads=1, latency=QUICK)


def test_runtime_failure_while_timing_names_the_artifact(artifacts, cli):
    # the accuracy pass at batch 2 works; the interleaved timing at batch 4 does not
    with pytest.raises(
        ShapeMismatchError, match=r"tests.validate.fns:picky .*during timing.*batch 4 is too large"
    ):
        validate(
            FACTORY,
            ["tests.validate.fns:picky"],
            artifacts["data"],
            threads=1,
            latency=QUICK,
            eval_batch_size=2,
            batch_sizes=(1, 4),
        )
    code, _, err = cli(
        "validate",
        FACTORY,
        "tests.validate.fns:picky",
        "--data",
        artifacts["data"],
        "--threads",
        "1",
        "--eval-batch-size",
        "2",
        "--batch-sizes",
        "1,4",
        "--min-iters",
        "3",
        "--min-seconds",
        "0.01",
    )
    assert code == 2 and "during timing" in err and "Traceback" not in err


def test_runtime_failure_that_is_not_about_shapes_is_named_as_such(artifacts, monkeypatch):
    """The same samples fail in batches of 1 too: not a ShapeMismatchError, an ArtifactRunError."""
    from ptopt.validate.runners import ArtifactRunError
    from tests.validate import fns

    monkeypatch.setitem(fns.LOADS, "count", 0)
    msg = assert_refused(
        validate,
        FACTORY,
        ["tests.validate.fns:breaks_after_first_load"],
        artifacts["data"],
        threads=1,
        latency=QUICK,
        error=ArtifactRunError,
        match=("accuracy pass", "the kernel crashed"),
    )
    assert "does not take this batch size" not in msg


def _scripted_result(tmp_path=None):
    """A stage-like Result of the tiny CNN as TorchScript (saved at tmp_path/tiny.res.pt when given)."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.inputspec import specs_from_example
    from ptopt.core.result import Result
    from tests.helpers import tiny_cnn

    x = torch.randn(2, 1, 8, 8)
    scripted = torch.jit.trace(tiny_cnn().eval(), x)
    template = Artifact(Path("tiny.res.pt"), "torchscript", specs_from_example(x), precision="fp32")
    res = Result(scripted, template, lambda p: torch.jit.save(scripted, str(p)))
    if tmp_path is not None:
        res.save(tmp_path / "tiny.res.pt")
    return res


def test_in_memory_models_results_and_data(artifacts, tmp_path):
    """nn.Module reference, a saved Result (runs its file), an unsaved one (runs .model), (x, y) tensors;
    gates and latency as objects."""
    from ptopt.validate.gates import Gates
    from tests.helpers import tiny_cnn

    ds = load_data(artifacts["data"]).take(24)
    saved, unsaved = _scripted_result(tmp_path), _scripted_result()
    res = validate(
        tiny_cnn(),
        [saved, unsaved],
        (ds.x, ds.y),
        gates=Gates(max_accuracy_drop=0.5),
        latency=QUICK,
        threads=1,
    )
    assert (
        res.passed and res.data["data"]["ref"].startswith("in-memory") and res.data["data"]["samples"] == 24
    )
    a, b = res.entries
    assert (
        a["name"] == "tiny.res.pt"
        and a["ref"] == str(tmp_path / "tiny.res.pt")
        and a["runtime"] == "torch.jit"
    )
    assert b["name"] == "torchscript fp32 (in memory)" and b["runtime"] == "torch.jit" and b["size"]["bytes"]
    assert a["agreement"]["top1_agreement"] == 1.0 and b["agreement"]["top1_agreement"] == 1.0
    assert res.data["gates"]["max_accuracy_drop"] == 0.5 and res.data["latency_options"]["rounds"] == 2
    as_mappings = {
        "gates": {"min_agreement": 0.99},
        "latency": dataclasses.asdict(QUICK),
    }  # as a recipe has them
    tensor_only = validate(tiny_cnn(), tiny_cnn(), ds.x, threads=1, batch_sizes=1, **as_mappings)
    assert tensor_only.data["gates"]["min_agreement"] == 0.99 and tensor_only.passed
    assert tensor_only.data["data"]["labels"] is False and tensor_only.entries[0]["agreement"]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ds.x, ds.y), batch_size=10)
    from_loader = validate(tiny_cnn(), tiny_cnn(), loader, latency=QUICK, threads=1, batch_sizes=1)
    assert from_loader.data["data"]["samples"] == 24 and from_loader.data["data"]["labels"] is True


def _onnx_like_result():
    from ptopt.core.artifact import Artifact
    from ptopt.core.result import Result

    return Result(lambda x: x, Artifact(Path("m.onnx"), "onnx"), lambda p: None)


#: case -> (keyword arguments of validate(FACTORY, ...), the error, what its message says)
BAD_PYTHON_INPUTS = {
    "gates-twice": (
        {"gates": "Gates", "max_size_mb": 1.0},
        UsageError,
        "or its options (max_size_mb), not both",
    ),
    "latency-twice": ({"latency": QUICK, "rounds": 3}, UsageError, "not both"),
    "bad-latency-options": ({"latency": "zero-rounds"}, UsageError, "--rounds must be >= 1"),
    "unknown-gate-in-mapping": ({"gates": {"max_size": 1}}, UsageError, "gates: unknown option(s) max_size"),
    "unknown-latency-field": ({"latency": {"seconds": 1}}, UsageError, "unknown option(s) seconds"),
    "unsaved-onnx-result": ({"artifacts": "onnx-result"}, UsageError, "save it first"),
    "data-of-unknown-type": ({"data": object()}, DataError, "data of type object"),
    "data-with-nan": ({"data": "nan"}, DataError, "NaN"),
}


@pytest.mark.parametrize("case", list(BAD_PYTHON_INPUTS), ids=list(BAD_PYTHON_INPUTS))
def test_bad_python_input_is_refused(artifacts, tmp_path, case):
    from ptopt.validate.gates import Gates

    kwargs, error, match = BAD_PYTHON_INPUTS[case]
    kwargs = dict(kwargs)
    if kwargs.get("gates") == "Gates":
        kwargs["gates"] = Gates(max_size_mb=2.0)
    if kwargs.get("latency") == "zero-rounds":
        kwargs["latency"] = None
        kwargs["rounds"] = 0
    if kwargs.get("artifacts") == "onnx-result":
        kwargs["artifacts"] = [_onnx_like_result()]
    if kwargs.get("data") == "nan":
        x = torch.randn(4, 1, 8, 8)
        x[1, 0, 0, 0] = float("nan")
        kwargs["data"] = x
    kwargs.setdefault("artifacts", [artifacts["onnx"]])
    kwargs.setdefault("data", artifacts["data"])
    kwargs.setdefault("latency", QUICK)
    assert_refused(validate, FACTORY, threads=1, error=error, match=match, where=tmp_path, **kwargs)


@pytest.mark.parametrize(
    "gates, agreement, want",
    [
        ({"min_cosine": 0.99999}, {"min_cosine": 0.99962}, "worst-sample cosine 0.99962 (min 0.99999)"),
        ({"min_cosine": 0.98}, {"min_cosine": 0.98123}, "worst-sample cosine 0.9812 (min 0.9800)"),
        ({"min_agreement": 0.99995}, {"top1_agreement": 0.99991}, "top-1 agreement 99.991% (min 99.995%)"),
        ({"min_agreement": 0.99}, {"top1_agreement": 0.98765}, "top-1 agreement 98.77% (min 99.00%)"),
        ({"min_cosine": 0.99999}, {"min_cosine": 0.999986}, "worst-sample cosine 0.999986 (min 0.999990)"),
        ({"min_agreement": 0.99}, {"top1_agreement": 0.98999}, "top-1 agreement 98.999% (min 99.000%)"),
    ],
)
def test_a_gate_message_shows_its_limit_as_given(gates, agreement, want):
    """``--min-cosine 0.99999`` read "worst-sample cosine 0.9996 (min 1.0000)": a limit rounded past
    what the user gave, beside a figure rounded the same way."""
    from ptopt.validate.gates import Gates, evaluate

    (result,) = evaluate(Gates(**gates), {"name": "a", "agreement": agreement}, {}, {"name": "top1"})
    assert result.message == want
