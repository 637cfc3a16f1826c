"""``ptopt optimize --device cuda``: the GPU catalogue (fp16/bf16 TorchScript and ExportedProgram,
torch.compile with CUDA graphs, fp16/bf16 AOTInductor with and without CUDA graphs, ONNX Runtime's CUDA
provider), its refusals, and a search on the GPU where there is one.

On a machine without CUDA the catalogue is read with CUDA faked (``torch.cuda.is_available`` and the
device count); the searches themselves are ``cuda``-marked and run on a GPU only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import assert_refused, tiny_cnn

FACTORY = "tests.helpers:tiny_cnn"
GPU_ROWS = {
    "fp16-torchscript", "bf16-torchscript", "fp16-exported-program", "bf16-exported-program", "fp16-onnx-cuda",
    "fp16-compiled-graphs", "fp16-aoti", "fp16-aoti-graphs", "bf16-aoti",
}  # fmt: skip
BOTH = {"fp32-eager", "fp32-torchscript", "fp32-exported-program", "fp32-aoti"}


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch sees one CUDA GPU without bfloat16 kernels (nothing runs on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    from ptopt.core.data import load_data

    d = tmp_path_factory.mktemp("optimize-cuda-data")
    load_data("builtin:digits:train").take(32).save(d / "calib.pt")
    load_data("builtin:digits:test").take(64).save(d / "eval.pt")
    return {k: d / f"{k}.pt" for k in ("calib", "eval")}


def test_each_device_has_its_catalogue():
    from ptopt.optimize.candidates import select

    cpu = {s.name for s in select()}
    gpu = {s.name for s in select(device="cuda:0")}
    assert gpu == GPU_ROWS | BOTH and not GPU_ROWS & cpu and BOTH <= cpu
    assert [s.name for s in select("fp16-aoti,fp16-aoti-graphs", device="cuda")] == [
        "fp32-eager", "fp16-aoti", "fp16-aoti-graphs",
    ]  # fmt: skip


def test_gpu_rows_say_how_they_run():
    from ptopt.optimize.candidates import SPECS

    compiled = SPECS["fp16-compiled-graphs"]
    assert compiled.runtime == "torch + torch.compile (reduce-overhead)" and not compiled.packageable
    assert all(SPECS[n].packageable for n in GPU_ROWS - {"fp16-compiled-graphs"})
    assert SPECS["fp16-aoti-graphs"].steps == (
        "export --target aoti --precision fp16 --device cuda --cuda-graphs",
    )
    assert SPECS["bf16-torchscript"].steps == ("export --target torchscript --precision bf16 --device cuda",)


def test_a_faked_gpu_gets_the_gpu_catalogue(fake_gpu, data):
    """--device cuda is checked (the GPU exists), resolved to cuda:0, and selects the GPU rows; bf16 rows
    say why they do not apply on a GPU without bfloat16 kernels; ONNX Runtime's CUDA row names the wheel."""
    from ptopt.optimize.api import _settings
    from ptopt.optimize.candidates import SPECS, Context
    from ptopt.optimize.options import resolve

    given = dict(min_cosine=0.99, time_budget=60, device="cuda", threads=1, batch_sizes="1,256")
    _, opts, lat = resolve(given, None)
    settings, specs = _settings(opts, lat, data["eval"], data["calib"])
    assert settings.device == "cuda:0" and {s.name for s in specs} == GPU_ROWS | BOTH
    ctx = Context(tiny_cnn(), None, None, None, None, None, 0.99, lambda: 60.0, device="cuda:0")
    assert "Fake GPU has no bfloat16 kernels" in SPECS["bf16-exported-program"].not_applicable(ctx)
    assert "no bfloat16 kernels" in SPECS["bf16-aoti"].not_applicable(ctx)
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert "pip install onnxruntime-gpu" in SPECS["fp16-onnx-cuda"].not_applicable(ctx)


def test_a_batch_beyond_the_default_range_widens_the_exported_range(monkeypatch):
    """Timed at batch 256 (beyond the default range of 64), every export gets a batch range up to it, and the
    AOTInductor package a fixed-batch model for each timed batch size."""
    from ptopt.export import api
    from ptopt.optimize.candidates import SPECS, Context

    calls = []
    monkeypatch.setattr(api, "export", lambda module, target, **kw: calls.append((target, kw)) or "result")
    ctx = Context(tiny_cnn(), None, None, None, None, None, 0.99, lambda: 60.0, batch_sizes=(1, 256))
    ctx.device = "cuda:0"
    assert SPECS["fp16-aoti"].build(ctx) == "result" and SPECS["fp16-torchscript"].build(ctx) == "result"
    (aoti, a), (ts, t) = calls
    assert a["static_batches"] == [1, 256] and a["dynamic_batch"] == t["dynamic_batch"] == "1:64:256"
    assert a["device"] == t["device"] == "cuda:0" and a["precision"] == t["precision"] == "fp16"


BAD = [
    ("gpu-row-on-cpu", ["--candidates", "fp16-aoti"], ("fp16-aoti", "--device cuda, not --device cpu")),
    ("cpu-row-on-gpu", ["--candidates", "int8-fx", "--device", "cuda"], ("int8-fx", "--device cpu")),
]


@pytest.mark.parametrize("args, match", [(a, m) for _, a, m in BAD], ids=[i for i, *_ in BAD])
def test_a_candidate_of_the_other_device_is_refused(cli, tmp_path, data, fake_gpu, args, match):
    base = ["--calib-data", data["calib"], "--eval-data", data["eval"], "--min-cosine", "0.9", "-o", "opt"]
    assert_refused(cli, "optimize", FACTORY, *base, *args, match=match, where=tmp_path)
    import ptopt

    device = "cuda" if "--device" in args else "cpu"
    assert_refused(
        ptopt.optimize, tiny_cnn(), calib_data=data["calib"], eval_data=data["eval"], min_cosine=0.9,
        candidates=args[1], device=device, match=match, where=tmp_path,
    )  # fmt: skip


def test_the_language_model_search_refuses_a_gpu(tmp_path):
    import ptopt

    assert_refused(
        ptopt.optimize, "model", eval_data="builtin:pydoc-text:eval", max_perplexity_increase=5.0,
        device="cuda", match="runs on the CPU", where=tmp_path,
    )  # fmt: skip


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_search_on_the_gpu_api(tmp_path, data):
    """A search over the cheap GPU rows: each built on the GPU, judged against fp32 on the GPU, timed with
    CUDA events; the best is a half-precision artifact whose sidecar says it runs on CUDA."""
    import ptopt

    names = ["fp16-torchscript", "fp16-exported-program", "fp16-compiled-graphs"]
    res = ptopt.optimize(
        tiny_cnn(), calib_data=data["calib"], eval_data=data["eval"], min_cosine=0.99, device="cuda",
        candidates=names, batch_sizes=(1, 4), threads=1, rounds=3, min_seconds=0.1, output=tmp_path / "opt",
    )  # fmt: skip
    assert res.report["device"].startswith("cuda:") and res.exit_code == 0
    status = {c.name: c.status for c in res.candidates}
    assert status["fp16-torchscript"] == status["fp16-exported-program"] == "kept", res.report["candidates"]
    assert res.best.precision == "fp16" and res.artifact.extra["device"].startswith("cuda")
    assert res.candidate("fp16-compiled-graphs").latency_ms["4"]["median"] > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_search_on_the_gpu_cli(cli, tmp_path, data):
    import json

    args = ["--calib-data", data["calib"], "--eval-data", data["eval"], "--min-cosine", "0.99"]
    code, out, err = cli(
        "optimize", FACTORY, *args, "--device", "cuda", "--candidates", "fp16-torchscript,bf16-torchscript",
        "--batch-size", "1,4", "--threads", "1", "--rounds", "3", "--min-seconds", "0.1", "-o", "opt",
    )  # fmt: skip
    assert code == 0, out + err
    report = json.loads((tmp_path / "opt" / "report.json").read_text())
    assert report["device"].startswith("cuda:") and report["best"] in ("fp16-torchscript", "bf16-torchscript")
