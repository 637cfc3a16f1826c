"""A model of one named input (a Hugging Face vision model's ``pixel_values``) exported to an
ExportedProgram takes plain tensor data, as its ONNX and OpenVINO files do: ``inspect --data`` and
``validate`` of a ViT's ``.pt2`` / ``aoti`` package refused tensor data ("kwarg keyword mismatch: Got the
following keywords [] but expected ['pixel_values']")."""

from __future__ import annotations

import torch
from torch import nn

import ptopt

LATENCY = {"min_iters": 2, "min_seconds": 0.01, "rounds": 2}


class Vision(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.fc(pixel_values)


def _program(tmp_path):
    out = tmp_path / "v.pt2"
    ptopt.export(Vision().eval(), "exported_program", out, input_shapes=["pixel_values=1x4"], progress=False)
    data = tmp_path / "d.pt"
    torch.save({"x": torch.randn(6, 4)}, data)
    return out, data


def test_cli_inspect_runs_tensor_data_through_a_keyword_program(cli, tmp_path):
    out, data = _program(tmp_path)
    code, text, err = cli("inspect", out, "--data", data)
    assert code == 0, err
    assert "input:      pixel_values: [1..64]x4 float32" in text and "output:     output: 6x3 float32" in text


def test_api_validate_runs_tensor_data_through_a_keyword_program(tmp_path):
    out, data = _program(tmp_path)
    res = ptopt.validate(Vision().eval(), [out], data, batch_sizes=[2], threads=1, latency=LATENCY).to_dict()
    assert res["artifacts"][0]["agreement"]["min_cosine"] > 0.9999
