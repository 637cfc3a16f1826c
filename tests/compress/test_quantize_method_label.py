"""The int8 TorchScript's sidecar says how the file was made (traced from the int8 model, frozen),
not how it was last copied ("re-saved TorchScript")."""

from __future__ import annotations

import json


def test_sidecar_method_is_trace_and_freeze(cli, tmp_path):
    out = tmp_path / "m.int8.pt"
    code, _, err = cli(
        "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--calib-data", "builtin:digits:train",
        "--calibration-batches", "2", "--no-progress", "-o", out,
    )  # fmt: skip
    assert code == 0, err
    extra = json.loads((tmp_path / "m.int8.pt.ptopt.json").read_text())["extra"]
    assert extra["method"] == "torch.jit.trace + torch.jit.freeze of the int8 model"
    assert extra["frozen"] is True
