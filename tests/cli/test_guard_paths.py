"""No output overwrites an input: every command refuses before anything runs (issue 16)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_refused


@pytest.fixture
def model_pt(tmp_path, cli):
    """A small TorchScript model with its sidecar, made by ptopt export."""
    code, _, err = cli(
        "export",
        "tests.helpers:tiny_cnn",
        "--target",
        "torchscript",
        "--opt-shape",
        "2x1x8x8",
        "-o",
        "m.pt",
    )
    assert code == 0, err
    return tmp_path / "m.pt"


CASES = {
    "validate --json onto an artifact": (
        "validate",
        "tests.helpers:tiny_cnn",
        "m.pt",
        "--data",
        "d.pt",
        "--json",
        "m.pt",
    ),
    "validate --report onto the data": (
        "validate",
        "tests.helpers:tiny_cnn",
        "m.pt",
        "--data",
        "d.pt",
        "--report",
        "d.pt",
    ),
    "validate --markdown onto --junit": (
        "validate",
        "tests.helpers:tiny_cnn",
        "m.pt",
        "--data",
        "d.pt",
        "--junit",
        "r.txt",
        "--markdown",
        "r.txt",
    ),  # fmt: skip
    "quantize -o onto the model": ("quantize", "m.pt", "--mode", "dynamic", "-o", "m.pt"),
    "quantize -o onto the model's sidecar": (
        "quantize",
        "m.pt",
        "--mode",
        "dynamic",
        "-o",
        "m.pt.ptopt.json",
    ),
    "quantize -o onto --calib-data": (
        "quantize",
        "tests.helpers:tiny_cnn",
        "--mode",
        "static",
        "--calib-data",
        "d.pt",
        "-o",
        "d.pt",
    ),
    "prune -o onto the model": ("prune", "m.pt", "--method", "global", "--amount", "0.5", "-o", "m.pt"),
    "prune --save-recipe onto -o": (
        "prune",
        "tests.helpers:tiny_cnn",
        "--method",
        "global",
        "--amount",
        "0.5",
        "--input-shape",
        "1x1x8x8",
        "-o",
        "p.pt",
        "--save-recipe",
        "p.pt",
    ),
    "distill -o onto --train-data": (
        "distill",
        "--teacher",
        "tests.helpers:tiny_cnn",
        "--student",
        "tests.helpers:tiny_cnn",
        "--train-data",
        "d.pt",
        "-o",
        "d.pt",
    ),
    "distill --metrics-file onto -o": (
        "distill",
        "--teacher",
        "tests.helpers:tiny_cnn",
        "--student",
        "tests.helpers:tiny_cnn",
        "--train-data",
        "d.pt",
        "-o",
        "s.pt",
        "--metrics-file",
        "s.pt",
    ),
    "package -o onto the model": ("package", "m.pt", "--format", "mar", "-o", "m.pt"),
    "package --save-recipe onto -o": (
        "package",
        "m.pt",
        "--format",
        "mar",
        "-o",
        "m.mar",
        "--save-recipe",
        "m.mar",
    ),
}


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_output_onto_input_refused(cli, model_pt, tmp_path, args):
    torch.save({"x": torch.randn(4, 1, 8, 8), "y": torch.tensor([0, 1, 2, 3])}, tmp_path / "d.pt")
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert_refused(cli, *args, match="would overwrite", where=tmp_path)
    assert {p: p.read_bytes() for p in before} == before
