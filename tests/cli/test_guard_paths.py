"""No output overwrites an input: every command refuses before anything runs (issue 16)."""

from __future__ import annotations

import pytest

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
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert_refused(cli, *args, match="would overwrite", where=tmp_path)
    assert {p: p.read_bytes() for p in before} == before
