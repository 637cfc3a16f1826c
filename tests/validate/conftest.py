"""Artifacts of the tiny CNN in every format, made once per session, with their sidecars; a small
labelled and an unlabeled data file of 8×8 digits. Latency is timed briefly (FAST) in tests."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

FACTORY = "tests.helpers:tiny_cnn"
#: short timing for tests: the numbers are not asserted, only that they are produced
FAST = ("--min-iters", "3", "--min-seconds", "0.01", "--rounds", "2")


def _specs(batch_dynamic: bool = True):
    import torch

    from ptopt.core.inputspec import specs_from_example

    return specs_from_example(torch.randn(2, 1, 8, 8), dynamic_batch=batch_dynamic)


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"torchscript", "onnx", "exported_program", "static_pt2", "data", "unlabeled", "data32"} paths."""
    import torch

    from ptopt.core.artifact import Artifact
    from ptopt.core.data import Dataset, load_data
    from ptopt.core.modelref import load_model

    d = tmp_path_factory.mktemp("validate-artifacts")
    lm = load_model(FACTORY)
    m = lm.module.eval()
    x = torch.randn(2, 1, 8, 8)
    parent = lm.parent_record()
    out: dict[str, Path] = {}
    p = d / "tiny.ts.pt"
    torch.jit.save(torch.jit.trace(m, x), str(p))
    Artifact(p, "torchscript", _specs(), config={"type": "test"}, parent=parent).finalize()
    out["torchscript"] = p
    p = d / "tiny.pt2"
    batch = torch.export.Dim("batch", min=1, max=64)
    torch.export.save(torch.export.export(m, (x,), dynamic_shapes={"x": {0: batch}}), str(p))
    Artifact(p, "exported_program", _specs(), parent=parent).finalize()
    out["exported_program"] = p
    p = d / "tiny.static1.pt2"  # batch 1 baked in: batch 32 cannot be timed, evaluation pads nothing
    torch.export.save(torch.export.export(m, (torch.randn(1, 1, 8, 8),)), str(p))
    out["static_pt2"] = p
    p = d / "tiny.onnx"
    with warnings.catch_warnings():  # the exporter's own upstream deprecation warnings
        warnings.simplefilter("ignore")
        torch.onnx.export(
            m, (x,), str(p), dynamic_shapes={"x": {0: torch.export.Dim("batch")}}, verbose=False
        )
    files = [f.name for f in (p, d / "tiny.onnx.data") if f.exists()]
    Artifact(p, "onnx", _specs(), parent=parent, files=files).finalize()
    out["onnx"] = p
    ds = load_data("builtin:digits:test").take(120)
    ds.save(d / "digits120.pt")
    out["data"] = d / "digits120.pt"
    Dataset(ds.x).save(d / "unlabeled.pt")
    out["unlabeled"] = d / "unlabeled.pt"
    load_data("builtin:digits32:test").take(20).save(d / "digits32.pt")
    out["data32"] = d / "digits32.pt"
    return out
