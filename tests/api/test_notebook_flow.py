"""The README's Python example, run as written: one nn.Module through quantize, prune, export and
validate in memory, with the same shape arguments every stage takes."""

from __future__ import annotations

import torch
from torch import nn

import ptopt


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    ).eval()  # fmt: skip


def test_notebook_flow(tmp_path):
    model, calib = _model(), torch.randn(64, 3, 32, 32)

    res = ptopt.quantize(model, "static", calib_data=calib, progress=False)
    assert res.artifact is None and res.precision == "int8"
    cos = torch.nn.functional.cosine_similarity(res.model(calib[:8]), model(calib[:8])).min()
    assert cos > 0.99 and res.metrics["vs_fp32"]["min_cosine"] > 0.99
    art = res.save(tmp_path / "model.int8.pt")
    assert art.path.is_file() and res.path == art.path

    pr = ptopt.prune(model, "structured", 0.5, input_shapes=("1x3x32x32",), progress=False)
    assert pr.metrics["parameter_ratio"] < 0.75
    onnx = ptopt.export(pr.model, "onnx", input_shapes=("1x3x32x32",))  # the same form prune takes
    torch.testing.assert_close(onnx.model(calib[:4]), pr.model(calib[:4]), atol=1e-4, rtol=1e-4)
    onnx.save(tmp_path / "pruned.onnx")

    report = ptopt.validate(model, [tmp_path / "model.int8.pt", tmp_path / "pruned.onnx"], calib[:32],
                            batch_sizes=[1], min_seconds=0.02, rounds=2)  # fmt: skip
    assert report.passed
