"""Token inputs' value ranges: the model's vocabulary where the model is at hand, never the ids a data
sample happens to hold (servers refuse requests outside the recorded range: a padded sentence, id 0,
must pass)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import ptopt
from ptopt.core.input_infer import token_ranges
from ptopt.core.inputspec import specs_from_example
from tests.helpers import two_input

VOCAB = two_input().embed.num_embeddings


def _unpadded(n: int = 16) -> dict:
    """Ids 2..VOCAB-2 and an all-ones mask: a sample with no padding and no special ids."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, VOCAB - 1, (n, 8), generator=g)
    return {"x": {"input_ids": ids, "attention_mask": torch.ones(n, 8, dtype=torch.long)}}


def _ranges(path) -> dict:
    specs = json.loads(open(f"{path}.ptopt.json").read())["inputs"]
    return {s["name"]: tuple(s["value_range"]) for s in specs}


def test_a_range_from_data_alone_starts_at_zero_and_a_mask_takes_0_and_1():
    x = _unpadded()["x"]
    specs = {s.name: s.value_range for s in specs_from_example(x)}
    assert specs == {"input_ids": (0, int(x["input_ids"].max()) + 1), "attention_mask": (0, 2)}
    neg = specs_from_example(torch.tensor([[-3, 5]]))[0]
    assert neg.value_range == (-3, 6)


@pytest.mark.parametrize("target", ["torchscript", "onnx"])
def test_export_records_the_vocabulary_not_the_data(tmp_path, target):
    out = tmp_path / ("m.pt" if target == "torchscript" else "m.onnx")
    ptopt.export(two_input(), target=target, data=_unpadded()["x"], output=out)
    assert _ranges(out) == {"input_ids": (0, VOCAB), "attention_mask": (0, 2)}


def test_quantize_records_the_vocabulary_not_the_data(tmp_path):
    out = tmp_path / "m.int8.pt"
    ptopt.quantize(two_input(), mode="dynamic", calib_data=_unpadded()["x"], output=out)
    assert _ranges(out) == {"input_ids": (0, VOCAB), "attention_mask": (0, 2)}


def test_cli_export_with_data_records_the_vocabulary(cli, tmp_path):
    torch.save(_unpadded(), tmp_path / "d.pt")
    code, out, err = cli(
        "export", "tests.helpers:two_input", "--target", "torchscript", "--data", "d.pt", "-o", "m.pt"
    )
    assert code == 0, err
    assert _ranges(tmp_path / "m.pt") == {"input_ids": (0, VOCAB), "attention_mask": (0, 2)}


class _HFLike(nn.Module):
    """A model whose embeddings the probe cannot reach (its forward fails) but whose config says."""

    class config:  # noqa: N801 - as Hugging Face names it
        vocab_size = 30522
        type_vocab_size = 2

    def forward(self, **kw):
        raise RuntimeError("not reachable")


def test_a_hugging_face_config_gives_the_range_where_the_probe_cannot():
    x = {
        "input_ids": torch.tensor([[101, 2023, 102]]),
        "token_type_ids": torch.zeros(1, 3, dtype=torch.long),
        "attention_mask": torch.ones(1, 3, dtype=torch.long),
        "labels": torch.tensor([[5, 7, 9]]),
    }
    specs = {s.name: s.value_range for s in token_ranges(_HFLike(), specs_from_example(x), "keyword")}
    assert specs == {
        "input_ids": (0, 30522),
        "token_type_ids": (0, 2),
        "attention_mask": (0, 2),
        "labels": (0, 10),  # nothing better known: the data's, from 0
    }
