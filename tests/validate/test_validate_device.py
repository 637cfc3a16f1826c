"""``ptopt validate --device`` and half-precision artifacts: bf16 TorchScript / ExportedProgram artifacts
run against the fp32 reference on this CPU (inputs cast to the artifact's dtype, outputs compared in
fp32); a device torch does not have is refused before anything runs; ONNX Runtime without GPU
providers says so in one line. The CUDA tests run only where a GPU is."""

from __future__ import annotations

import pytest
import torch

from ptopt.core.errors import UsageError
from ptopt.export.api import export
from ptopt.validate.api import validate
from ptopt.validate.latency import LatencyOptions
from tests.helpers import assert_refused
from tests.validate.conftest import FACTORY, FAST

QUICK = LatencyOptions(min_iters=3, min_seconds=0.01, warmup_iters=1, warmup_seconds=0.0, rounds=2)


@pytest.fixture(scope="module")
def bf16_artifacts(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16")
    ts, ep = d / "tiny.bf16.pt", d / "tiny.bf16.pt2"
    export(FACTORY, "torchscript", ts, precision="bf16")
    export(FACTORY, "exported_program", ep, precision="bf16")
    return ts, ep


def test_bf16_artifacts_validate_against_fp32(artifacts, bf16_artifacts):
    res = validate(
        FACTORY, list(bf16_artifacts), artifacts["data"], batch_sizes=(1, 4), threads=1, latency=QUICK
    )
    assert res.data["device"] == "cpu"
    for e in res.entries:
        assert e["precision"] == "bf16" and e["device"] == "cpu" and e["peak_gpu_memory_mb"] is None
        assert e["agreement"]["cosine"] > 0.99 and e["agreement"]["top1_agreement"] >= 0.9
        assert e["latency"]["1"]["timer"] == "host" and e["latency"]["4"]["p50_ms"] > 0


def test_bf16_cli_with_device_cpu(cli, artifacts, bf16_artifacts):
    code, out, err = cli(
        "validate", FACTORY, str(bf16_artifacts[0]), "--data", artifacts["data"], "--device", "cpu",
        "--batch-sizes", "2", "--threads", "1", *FAST,
    )  # fmt: skip
    assert code == 0, err
    assert "tiny.bf16.pt" in out and "bf16" in out


BAD_DEVICES = [
    ("tpu", "unknown device 'tpu'"),
    ("cuda:x", "unknown device 'cuda:x'"),
]
if not torch.cuda.is_available():
    BAD_DEVICES.append(("cuda", ("device 'cuda'", "torch.cuda.is_available() is False")))


@pytest.mark.parametrize("device, message", BAD_DEVICES, ids=[d for d, _ in BAD_DEVICES])
def test_bad_device_refused(cli, artifacts, tmp_path, device, message):
    report = tmp_path / "r.json"
    args = [FACTORY, str(artifacts["torchscript"]), "--data", artifacts["data"], "--json", report]
    assert_refused(cli, "validate", *args, "--device", device, match=message, where=tmp_path)
    assert_refused(
        validate,
        FACTORY,
        [artifacts["torchscript"]],
        artifacts["data"],
        device=device,
        json_path=report,
        match=message,
        where=tmp_path,
        error=UsageError,
    )


def test_index_that_does_not_exist(cli, artifacts, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    match = ("device 'cuda:2'", "no such GPU")
    args = [FACTORY, str(artifacts["torchscript"]), "--data", artifacts["data"], "--device", "cuda:2"]
    assert_refused(cli, "validate", *args, match=match, where=tmp_path)
    assert_refused(
        validate, FACTORY, [artifacts["torchscript"]], artifacts["data"], device="cuda:2", match=match
    )


def test_onnx_runtime_without_gpu_providers_says_so(artifacts, monkeypatch):
    import onnxruntime as ort

    from ptopt.validate.runners import open_runner

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    runner = open_runner(artifacts["onnx"])
    runner.place("cuda:0")
    runner.prepare(1)
    note = runner.info["device_note"]
    assert "no CUDA/TensorRT execution provider" in note and "runs on the CPU, not cuda:0" in note
    assert runner.timer_device == "cpu"  # session.run is synchronous: host time, never CUDA events
    assert runner.runtime == "onnxruntime (CPU)" and runner.predict(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_cpu_only_runtime_refuses_a_gpu():
    from ptopt.formats.runner import Runner

    r = Runner(name="x", ref="x", format="custom", runtime="some runtime", input_specs=[])
    with pytest.raises(UsageError, match="some runtime runs on the CPU only, not on cuda:0"):
        r.place("cuda:0")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_every_torch_format_on_cuda(artifacts):
    refs = [artifacts["torchscript"], artifacts["exported_program"]]
    res = validate(
        FACTORY, refs, artifacts["data"], batch_sizes=(1, 8), threads=1, latency=QUICK, device="cuda"
    )
    assert res.data["device"].startswith("cuda:")
    for e in [res.reference, *res.entries]:
        assert e["device"].startswith("cuda:") and e["peak_gpu_memory_mb"] > 0
        assert e["latency"]["8"]["timer"] == "cuda_events"
    for e in res.entries:
        assert e["agreement"]["top1_agreement"] == 1.0
