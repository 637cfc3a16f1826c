"""A .pt of keyword inputs alone ({"input_ids", "attention_mask"}: what a tokenizer returns, saved) is
read as the same dict given in memory is; it was refused: "expected a mapping with 'x' (and optional
'y'), got keys ['attention_mask', 'input_ids']"."""

from __future__ import annotations

import torch

from ptopt.core.data import load_data


def _save(path):
    ids = torch.randint(1, 64, (12, 16), generator=torch.Generator().manual_seed(0))
    torch.save({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, path)
    return ids


def test_a_file_of_keyword_inputs_reads_as_in_memory(tmp_path):
    ids = _save(tmp_path / "kw.pt")
    ds = load_data(str(tmp_path / "kw.pt"))
    assert len(ds) == 12 and not ds.has_labels and torch.equal(ds.x["input_ids"], ids)


def test_cli_runs_a_keyword_model_on_a_file_of_keyword_inputs(cli, tmp_path):
    _save(tmp_path / "kw.pt")
    code, out, err = cli("inspect", "tests.helpers:two_input", "--data", tmp_path / "kw.pt")
    assert code == 0, err
    assert "input_ids" in out and "attention_mask" in out and "one batch ran" in out
