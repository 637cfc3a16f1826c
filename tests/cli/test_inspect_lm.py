"""``ptopt inspect`` of language-model folders: an exported decoder with its KV cache (ONNX Runtime
here) has no torch parameters to count (it was an internal error: ``'OnnxLM' object has no attribute
'parameters'``), and a weight-only folder's parameters are counted as stored (int8 bytes, not the float
dtype its tensors present). Tiny random-weight Llama (``tests.export.lm_models``)."""

from __future__ import annotations

import json

import pytest

import ptopt
from ptopt.core.inspect import inspect_model
from tests.export.lm_models import save


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect_lm")
    src = save("llama", root / "llama", layers=2)  # two: the cache names print as 0..1
    out = {"src": src, "onnx": root / "llama-onnx", "int8": root / "llama-int8"}
    ptopt.export(f"hf:{src}", "onnx", out["onnx"], new_tokens=2, progress=False)
    ptopt.quantize(f"hf:{src}", "weight-only", out["int8"], bits=8, progress=False)
    return out


def test_cli_inspect_of_an_onnx_lm_folder_names_its_graph(cli, folders):
    code, out, err = cli("inspect", folders["onnx"])
    assert code == 0, err  # was exit 3: internal error: AttributeError
    assert "internal error" not in err
    assert "model:      " in out and "(onnx_lm)" in out
    weights = next(ln for ln in out.splitlines() if ln.startswith("weights:"))
    assert "bytes as onnxruntime holds them" in weights
    graph = next(ln for ln in out.splitlines() if ln.startswith("graph:"))
    # the cache's names as export prints them (SmolLM2's 60 names each way were one 2,400-character line)
    assert graph.endswith(
        "input_ids, attention_mask, position_ids, past_key_values.0..1.key/value -> logits, present.0..1.key/value"
    ), graph
    assert "batch 1..8" in out


def test_api_inspect_of_an_onnx_lm_folder(folders):
    report = inspect_model(str(folders["onnx"]))
    assert report["format"] == "onnx_lm" and report["runtime"] == "onnxruntime"
    record = json.loads((folders["onnx"] / "ptopt_lm.json").read_text())
    assert report["weight_bytes"] == record["weight_bytes"] > 0
    assert report["lm_graph"]["inputs"][:2] == ["input_ids", "attention_mask"]
    assert report["layers"] == []


def test_inspect_counts_a_weight_only_folders_bytes_as_stored(cli, folders):
    fp32 = inspect_model(f"hf:{folders['src']}")
    int8 = inspect_model(str(folders["int8"]))
    assert int8["parameters"] == fp32["parameters"]
    # was the fp32 figure (each int8 tensor's elements x 4 bytes)
    assert int8["parameter_bytes"] < 0.6 * fp32["parameter_bytes"]
    code, out, err = cli("inspect", folders["int8"])
    assert code == 0, err
    assert f"({int8['parameter_bytes']:,} bytes" in out


def test_weights_line_names_no_runtime_it_does_not_know():
    """A report without a runtime said 'as None holds them'."""
    from ptopt.cli.inspect import _weights_line

    assert _weights_line({"parameters": None, "weight_bytes": 1234}) == "weights:    1,234 bytes in memory"
    assert _weights_line({"parameters": None, "weight_bytes": 1234, "runtime": "onnxruntime"}).endswith(
        "1,234 bytes as onnxruntime holds them"
    )


def test_token_ids_run_through_a_language_model_as_one_sequence(cli, folders, tmp_path):
    """A 1-D file of token ids (what validate and quantize read for a language model) was read as
    scalar samples: 'does not fit model ... The size of tensor a (2) must match ...'."""
    import torch

    ids = tmp_path / "ids.pt"
    torch.save(torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(0)), ids)
    code, out, err = cli("inspect", f"hf:{folders['src']}", "--data", ids)
    assert code == 0, err
    assert "(its first 64 tokens as one sequence)" in out and "one batch ran: input_ids 1x64" in out
    report = inspect_model(f"hf:{folders['src']}", data=str(ids))
    assert report["data"]["samples"] == 1 and report["inputs"][0]["name"] == "input_ids"


def test_a_token_ids_file_is_read_once(folders, tmp_path, monkeypatch):
    """inspect read a .pt/.npy of token ids twice: once to see it is one row, once for the ids."""
    import numpy as np
    import torch

    row = torch.randint(0, 64, (80,), generator=torch.Generator().manual_seed(1))
    torch.save(row, tmp_path / "ids.pt")
    np.save(tmp_path / "ids.npy", row.numpy())
    reads: list[str] = []
    for owner, name in ((torch, "load"), (np, "load")):
        real = getattr(owner, name)
        monkeypatch.setattr(
            owner, name, lambda f, *a, _real=real, **k: reads.append(str(f)) or _real(f, *a, **k)
        )
    for path in (tmp_path / "ids.pt", tmp_path / "ids.npy"):
        report = inspect_model(f"hf:{folders['src']}", data=str(path))
        assert reads.count(str(path)) == 1
        assert report["data"]["samples"] == 1 and "its first 64 tokens" in report["data"]["name"]
