"""validate refuses data it cannot score honestly and batch sizes that cannot fit in memory (issue 16)."""

from __future__ import annotations

import pytest
import torch

import ptopt
from tests.helpers import assert_refused, tiny_cnn


@pytest.fixture
def files(tmp_path, cli):
    torch.save({"x": torch.randn(16, 1, 8, 8), "y": torch.arange(16) + 5}, tmp_path / "bad.pt")
    torch.save({"x": torch.randn(16, 1, 8, 8), "y": torch.arange(16) % 10}, tmp_path / "good.pt")
    code, _, err = cli("export", "tests.helpers:tiny_cnn", "--target", "torchscript", "--opt-shape", "2x1x8x8",
                       "-o", "m.pt")  # fmt: skip
    assert code == 0, err
    return tmp_path


CASES = {
    "labels beyond the classes": (("--data", "bad.pt"), ("labels run from 5 to 20", "10 outputs")),
    "a batch size no memory holds": (
        ("--data", "good.pt", "--batch-sizes", "100000000000"),
        ("--batch-sizes 100000000000", "GiB", "use at most"),
    ),
}


@pytest.mark.parametrize(("args", "match"), CASES.values(), ids=CASES.keys())
def test_cli_refuses(cli, files, args, match):
    assert_refused(cli, "validate", "tests.helpers:tiny_cnn", "m.pt", *args, "--json", "r.json", "-q", match=match,
                   where=files)  # fmt: skip


def test_api_refuses_labels_beyond_the_classes():
    x, y = torch.randn(8, 1, 8, 8), torch.full((8,), 12)
    assert_refused(ptopt.validate, tiny_cnn(), [tiny_cnn()], (x, y), match="labels run from 12 to 12")
