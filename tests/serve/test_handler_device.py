"""The TorchServe handler's device and precision: the worker's ``gpu_id`` is used where torch sees CUDA
(else the CPU, with a log line), and a half-precision artifact (sidecar precision bf16/fp16) gets its
inputs cast to that dtype. Built with plain torch, as the other serve tests (no other stage)."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch

from ptopt.core.artifact import Artifact
from ptopt.core.device import half_specs
from ptopt.core.inputspec import specs_from_example
from ptopt.serve import handler as handler_mod
from tests.helpers import tiny_cnn
from tests.serve.test_handler import FakeContext, _json, _model_dir


@pytest.fixture(scope="module")
def bf16_artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16")
    model = tiny_cnn().eval()
    x = model.example_inputs(4)
    path = d / "cnn.bf16.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jit deprecation
        torch.jit.trace(model.to(torch.bfloat16), x.bfloat16()).save(str(path))
    Artifact(
        path, "torchscript", inputs=half_specs(specs_from_example(x), "bf16"), precision="bf16"
    ).finalize()
    return path


def _ctx(tmp_path, artifact, gpu_id):
    ctx = FakeContext(_model_dir(tmp_path, artifact), artifact.name)
    if gpu_id is not None:
        ctx.system_properties["gpu_id"] = gpu_id
    return ctx


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback where CUDA is absent")
def test_gpu_id_without_cuda_runs_on_cpu_with_a_log_line(tmp_path, bf16_artifact, caplog):
    h = handler_mod.PtoptHandler()
    with caplog.at_level(logging.INFO, logger=handler_mod.logger.name):
        h.initialize(_ctx(tmp_path, bf16_artifact, 1))
    assert h.device == "cpu"
    lines = [r.getMessage() for r in caplog.records if "gpu_id" in r.getMessage()]
    assert len(lines) == 1 and "gpu_id 1" in lines[0] and "torch.cuda.is_available() is False" in lines[0]
    assert "on cpu (bfloat16)" in caplog.text  # the ready line names where it runs


def test_half_artifact_gets_half_inputs_and_float_outputs(tmp_path, bf16_artifact):
    h = handler_mod.PtoptHandler()
    ctx = _ctx(tmp_path, bf16_artifact, None)
    h.initialize(ctx)
    assert h.half == "bfloat16" and h.device == "cpu"
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    (answer,) = h.handle([_json({"inputs": x.tolist()})], ctx)
    got = torch.tensor(json.loads(answer)["outputs"])
    want = tiny_cnn().eval()(x)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)  # bf16 weights: close, not equal
    assert not torch.equal(got, want.detach())


def test_worker_device_from_gpu_id(monkeypatch):
    assert handler_mod._worker_device(None) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert handler_mod._worker_device(3) == "cuda:3" and handler_mod._worker_device("0") == "cuda:0"
