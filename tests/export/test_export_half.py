"""``--precision fp16|bf16`` and ``--device`` for ``ptopt export``: half-precision artifacts (weights and
activations, inputs cast at the boundary, the half dtype in the InputSpecs, parity at the half
tolerance), and the refusals (fp16 or ONNX bf16 on the CPU, CUDA where there is none, CUDA graphs
off the aoti/CUDA path). bf16 runs on this CPU; the CUDA tests run only where a GPU is. The bf16
AOTInductor package (precision, bf16 InputSpec, parity, device) is checked with its fixed-batch model
in tests/export/test_aoti.py::test_bf16_package_checks_its_fixed_batch_in_bf16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ptopt.core.errors import ParityError, UsageError
from ptopt.export.api import export
from ptopt.export.parity import DEFAULT_TOLERANCES, MIN_COSINE
from tests.helpers import SUFFIX, assert_refused, not_progress

MODELS = "tests.export.export_models"
CNN = "tests.helpers:tiny_cnn"
MLP = f"{MODELS}:block_mlp"


def needs_cuda(f):
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(f))


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")


def _side(path: Path) -> dict:
    return json.loads(Path(str(path) + ".ptopt.json").read_text())


@pytest.mark.parametrize("target", ["torchscript", "exported_program"])
@pytest.mark.parametrize("model", [CNN, MLP], ids=["cnn", "mlp"])
def test_bf16_on_the_cpu(tmp_path, target, model):
    out = tmp_path / f"m{SUFFIX[target]}"
    res = export(model, target, out, precision="bf16")
    side = _side(out)
    assert side["precision"] == "bf16" and side["config"]["precision"] == "bf16"
    assert [s["dtype"] for s in side["inputs"]] == ["bfloat16"]
    assert side["extra"]["dtype"] == "bfloat16" and side["extra"]["device"] == "cpu"
    parity = side["metrics"]["parity"]
    assert parity["passed"] and (parity["atol"], parity["rtol"]) == DEFAULT_TOLERANCES["bf16"]
    assert parity["min_cosine"] == MIN_COSINE["bf16"]
    assert 0 < parity["max_abs_diff"]  # it really ran in bf16: not bit-identical to the fp32 source
    x = torch.randn(3, *res.inputs[0].opt_shape[1:]).bfloat16()
    assert res.model(x).dtype == torch.bfloat16  # weights and activations are bf16


def test_bf16_cli(cli, tmp_path):
    out = tmp_path / "m.pt"
    code, stdout, err = cli("export", CNN, "--target", "torchscript", "--precision", "bf16", "-o", out)
    assert code == 0, err
    assert "(torchscript, bf16," in stdout and "device:  cpu, bfloat16" in stdout
    assert "input:   input: [1..64]x1x8x8 bfloat16" in stdout
    assert _side(out)["inputs"][0]["dtype"] == "bfloat16"


def test_half_divergence_is_a_parity_error_with_failed_kept(cli, tmp_path):
    out = tmp_path / "c.pt"
    code, _, err = cli(
        "export", f"{MODELS}:cancels", "--target", "torchscript", "--precision", "bf16", "-o", out
    )
    assert code == 2 and "Traceback" not in err and len(not_progress(err)) == 1
    assert "drifts from its source beyond tolerance" in err and "output 0 (" in err and "cosine" in err
    assert "c.pt.failed" in err and sorted(p.name for p in tmp_path.iterdir()) == ["c.pt.failed"]
    with pytest.raises(ParityError) as e:
        export(f"{MODELS}:cancels", "torchscript", precision="bf16")
    worst = e.value.metrics["worst_output"]
    assert worst["output"] == "0" and not worst["ok"] and worst["cosine"] < MIN_COSINE["bf16"]


REFUSED = [
    (["--target", "torchscript", "--precision", "fp16"], ("--precision fp16 on the CPU", "bf16")),
    (["--target", "onnx", "--precision", "bf16"], ("no bfloat16 kernels", "--device cuda")),
    (["--target", "onnx", "--precision", "fp16"], "--precision fp16 on the CPU"),
    (["--target", "aoti", "--cuda-graphs"], "--cuda-graphs needs --target aoti --device cuda"),
    (
        ["--target", "torchscript", "--device", "cuda", "--cuda-graphs"],
        "--cuda-graphs applies to --target aoti, not --target torchscript",
    ),
    (["--target", "torchscript", "--device", "tpu"], "unknown device 'tpu'"),
    (["--target", "torchscript", "--precision", "bf8"], "unknown precision 'bf8'"),
]
IDS = ["fp16-cpu", "onnx-bf16-cpu", "onnx-fp16-cpu", "graphs-cpu", "graphs-torchscript", "tpu", "bf8"]


@pytest.mark.parametrize("args, message", REFUSED, ids=IDS)
def test_refused_cli(cli, tmp_path, args, message):
    assert_refused(cli, "export", CNN, *args, "-o", tmp_path / "m.out", match=message, where=tmp_path)


@pytest.mark.parametrize("args, message", REFUSED, ids=IDS)
def test_refused_api(tmp_path, args, message):
    opts = {a.lstrip("-").replace("-", "_"): b for a, b in zip(args[::2], args[1::2], strict=False)}
    if "--cuda-graphs" in args:
        opts = {"target": args[1], "cuda_graphs": True} | ({"device": "cuda"} if "cuda" in args else {})
    assert_refused(
        export, CNN, output=tmp_path / "m.out", **opts, match=message, where=tmp_path, error=UsageError
    )


@no_cuda
@pytest.mark.parametrize("target", ["torchscript", "exported_program", "aoti"])
def test_device_cuda_without_cuda(cli, tmp_path, target):
    """Refused before the model loads, saying what torch sees."""
    match = ("device 'cuda'", "torch.cuda.is_available() is False")
    assert_refused(
        cli,
        "export",
        CNN,
        "--target",
        target,
        "--device",
        "cuda",
        "-o",
        tmp_path / "m",
        match=match,
        where=tmp_path,
    )
    assert_refused(export, CNN, target, tmp_path / "m", device="cuda", match=match, where=tmp_path)


def test_device_index_that_does_not_exist(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    match = ("device 'cuda:3'", "no such GPU", "1 CUDA device(s) (cuda:0)")
    args = ("--target", "torchscript", "--device", "cuda:3", "-o", tmp_path / "m.pt")
    assert_refused(cli, "export", CNN, *args, match=match, where=tmp_path)
    assert_refused(
        export, CNN, "torchscript", tmp_path / "m.pt", device="cuda:3", match=match, where=tmp_path
    )


@needs_cuda
@pytest.mark.parametrize("target", ["torchscript", "exported_program"])
def test_fp16_on_cuda(tmp_path, target):
    out = tmp_path / f"m{SUFFIX[target]}"
    res = export(CNN, target, out, precision="fp16", device="cuda")
    side = _side(out)
    assert side["precision"] == "fp16" and side["inputs"][0]["dtype"] == "float16"
    assert side["extra"]["device"].startswith("cuda") and res.metrics["parity"]["passed"]


@needs_cuda
def test_aoti_fp16_on_cuda_with_cuda_graphs(tmp_path):
    out = tmp_path / "m.pt2"
    res = export(CNN, "aoti", out, precision="fp16", device="cuda", cuda_graphs=True, dynamic_batch="1:2:4")
    side = _side(out)
    assert side["extra"]["device"].startswith("cuda") and side["extra"]["cuda_graphs"] is True
    assert res.metrics["parity"]["passed"]
