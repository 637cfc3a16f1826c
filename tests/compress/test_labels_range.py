"""Labels that cannot index the model's classes are refused before anything trains or runs (issue 16:
QAT used to raise IndexError, exit 3)."""

from __future__ import annotations

import pytest
import torch

import ptopt
from tests.helpers import assert_refused, tiny_cnn


@pytest.fixture
def bad_labels(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"x": torch.randn(16, 1, 8, 8), "y": torch.arange(16) + 5}, path)  # 5..20; the model has 10
    return path


CLI = {
    "quantize qat": ("quantize", "tests.helpers:tiny_cnn", "--mode", "qat", "--train-data", "bad.pt", "-o", "q.pt"),
    "quantize static eval": (
        "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--calib-data", "bad.pt", "--eval-data",
        "bad.pt", "-o", "q.pt",
    ),
    "prune fine-tune": (
        "prune", "tests.helpers:tiny_cnn", "--method", "global", "--amount", "0.5", "--fine-tune-data", "bad.pt",
        "--epochs", "1", "-o", "p.pt",
    ),
    "distill": (
        "distill", "--teacher", "tests.helpers:tiny_cnn", "--student", "tests.helpers:tiny_cnn", "--train-data",
        "bad.pt", "-o", "s.pt",
    ),
}  # fmt: skip


@pytest.mark.parametrize("args", CLI.values(), ids=CLI.keys())
def test_cli_refuses_labels_out_of_range(cli, bad_labels, tmp_path, args):
    assert_refused(cli, *args, match=("labels run from 5 to 20", "10 outputs"), where=tmp_path)


def test_api_refuses_labels_out_of_range():
    x, y = torch.randn(16, 1, 8, 8), torch.full((16,), 10)
    assert_refused(ptopt.quantize, tiny_cnn(), "qat", train_data=(x, y), match="labels run from 10 to 10")


def test_labels_in_range_pass_the_check():
    from ptopt.core.data import load_data

    ds = load_data((torch.randn(4, 1, 8, 8), torch.tensor([0, 9, 3, 1])))
    ds.check_labels(torch.zeros(4, 10))  # no error
    with pytest.raises(ptopt.PtoptError, match="labels run from -1"):
        load_data((torch.randn(2, 1, 8, 8), torch.tensor([-1, 2]))).check_labels(torch.zeros(2, 10))
