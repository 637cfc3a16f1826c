"""``quantize --mode weight-only --bits 8`` of a model with tied embeddings (issue 28's "int8 file <=
0.30x fp32"): the matrix the token embedding shares with ``lm_head`` is quantized once, ``lm_head``
runs it as an int8 Linear and the embedding gathers its int8 rows times their scales; the folder
stores it once. A tiny random-weight Llama whose embedding is most of its parameters (vocabulary 4096,
hidden 128), as SmolLM2's is a fifth of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ptopt
from ptopt.core.hf import import_transformers
from ptopt.core.lm import int8_rows
from ptopt.core.modelref import load_model
from tests.compress.hf_models import llama
from tests.helpers import torchao

VOCAB = 4096
REPO = Path(__file__).resolve().parents[2]
#: a fresh interpreter loads the folder with ptopt and writes the logits of the ids it is given
RELOAD = """
import sys, torch, ptopt
model = ptopt.load_model(sys.argv[1]).module
with torch.no_grad():
    torch.save(model(input_ids=torch.load(sys.argv[2])).logits, sys.argv[3])
"""


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tied") / "llama"
    llama(VOCAB, 128, tie=True).save_pretrained(path)
    return path


def _ids(n: int = 24) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(2))


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _keys(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return list(f.keys())


def _reload_in_a_fresh_process(folder: Path, ids: torch.Tensor, tmp_path: Path) -> torch.Tensor:
    torch.save(ids, tmp_path / "ids.pt")
    env = dict(os.environ, PYTHONPATH=str(REPO), TORCHAO_FORCE_SKIP_LOADING_SO_FILES="1")
    proc = subprocess.run(
        [sys.executable, "-c", RELOAD, str(folder), str(tmp_path / "ids.pt"), str(tmp_path / "logits.pt")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return torch.load(tmp_path / "logits.pt", weights_only=True).float()


def _dequantize_calls(monkeypatch) -> list[int]:
    """Count ``Int8Tensor.dequantize`` calls (torchao's embedding dequantizes the whole table)."""
    Int8Tensor = torchao("torchao.quantization").Int8Tensor

    calls: list[int] = []
    original = Int8Tensor.dequantize
    monkeypatch.setattr(
        Int8Tensor, "dequantize", lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    )
    return calls


def test_tied_int8_is_stored_once_and_reloads_exactly(tied_dir, tmp_path, monkeypatch):
    out = tmp_path / "llama.int8"
    res = ptopt.quantize(f"hf:{tied_dir}", "weight-only", out)
    rec = res.extra["weight_only"]
    assert rec["tied_embedding"] == {"model.embed_tokens": "lm_head"}
    assert "lm_head" in rec["quantized_layers"] and rec["float_layers"] == res.extra["float_layers"] == {}
    assert json.loads((out / "quantization.json").read_text())["tied_embedding"] == rec["tied_embedding"]
    # one int8 matrix, stored once: the file is about a quarter of the fp32 one (0.73x with it float)
    fp32 = (tied_dir / "model.safetensors").stat().st_size
    assert (out / "model.safetensors").stat().st_size < 0.30 * fp32
    assert res.metrics["weight_bytes_ratio"] < 0.30
    keys = _keys(out / "model.safetensors")
    assert "model.embed_tokens._weight_qdata" in keys and not any(k.startswith("lm_head") for k in keys)
    # in memory: one Parameter; the embedding gathers int8 rows and scales them, never the whole table
    q = res.model
    w = q.lm_head.weight
    assert q.model.embed_tokens.weight is w and type(w).__name__ == "Int8Tensor"
    ids = _ids()
    calls = _dequantize_calls(monkeypatch)
    with torch.no_grad():
        rows = q.model.embed_tokens(ids)
    assert not calls and rows.dtype == torch.float32
    assert torch.equal(rows, w.qdata[ids].float() * w.scale[ids].float())  # scale: [rows, 1]
    assert torch.equal(rows, w.dequantize()[ids])
    ref = _logits(q, ids)
    loaded = load_model(out).module
    assert loaded.model.embed_tokens.weight is loaded.lm_head.weight
    calls.clear()
    with torch.no_grad():
        assert torch.equal(loaded.model.embed_tokens(ids), rows) and not calls  # the loader routes it too
    assert torch.equal(_logits(loaded, ids), ref)
    assert torch.equal(_reload_in_a_fresh_process(out, ids, tmp_path), ref)


def test_from_pretrained_reads_the_shared_int8_matrix(tied_dir, tmp_path):
    """The user's own loader: include_input_output_embeddings in the folder's TorchAoConfig makes
    from_pretrained read the embedding's int8 tensor, and tie_word_embeddings gives lm_head the same one
    (its embedding is torchao's, which dequantizes the table per call: same values)."""
    out = tmp_path / "g32"
    res = ptopt.quantize(tied_dir, "weight-only", out, group_size=32)
    w = res.model.lm_head.weight
    assert list(w.block_size) == [1, 32] and list(w.scale.shape) == [VOCAB, 4]
    ids = _ids()
    with torch.no_grad():
        rows = res.model.model.embed_tokens(ids)
    by_hand = (w.qdata[ids].float().unflatten(-1, (4, 32)) * w.scale[ids].unsqueeze(-1)).flatten(-2)
    assert torch.equal(rows, by_hand)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["include_input_output_embeddings"] is True
    plain = import_transformers().AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert plain.model.embed_tokens.weight is plain.lm_head.weight
    assert type(plain.lm_head.weight).__name__ == "Int8Tensor"
    ref = _logits(res.model, ids)  # per-group int8: torchao's path in both, same numbers
    assert torch.equal(_logits(plain, ids), ref) and torch.equal(_logits(load_model(out).module, ids), ref)


def test_cli_tied_int8_and_excluded_head_keeps_the_float_folder(cli, tied_dir, tmp_path):
    code, stdout, stderr = cli("quantize", tied_dir, "--mode", "weight-only", "-o", tmp_path / "q8")
    assert code == 0, stderr
    assert "tied: model.embed_tokens reads the int8 matrix of lm_head (stored once" in stdout
    assert "float: lm_head" not in stdout
    fp32 = (tied_dir / "model.safetensors").stat().st_size
    assert (tmp_path / "q8" / "model.safetensors").stat().st_size < 0.30 * fp32
    side = json.loads((tmp_path / "q8.ptopt.json").read_text())
    assert side["extra"]["float_layers"] == {} and side["extra"]["weight_only"]["tied_embedding"]
    # --exclude lm_head: today's folder, the tied matrix float (stored once), from_pretrained loads it
    code, stdout, stderr = cli(
        "quantize", tied_dir, "--mode", "weight-only", "--exclude", "lm_head", "-o", tmp_path / "keep"
    )
    assert code == 0, stderr
    rec = json.loads((tmp_path / "keep" / "quantization.json").read_text())
    assert rec["tied_embedding"] == {} and rec["float_layers"] == {"lm_head": "excluded (--exclude)"}
    assert (tmp_path / "keep" / "model.safetensors").stat().st_size > 0.6 * fp32
    plain = import_transformers().AutoModelForCausalLM.from_pretrained(
        tmp_path / "keep", local_files_only=True
    )
    assert type(plain.model.embed_tokens.weight) is torch.nn.Parameter
    assert plain.model.embed_tokens.weight is plain.lm_head.weight
    kept = load_model(tmp_path / "keep").module
    assert (
        type(kept.lm_head.weight) is torch.nn.Parameter
        and kept.lm_head.weight is kept.model.embed_tokens.weight
    )


def test_excluding_the_embedding_or_int4_keeps_the_matrix_float(tied_dir):
    res = ptopt.quantize(tied_dir, "weight-only", exclude=["model.embed_tokens"])
    rec = res.extra["weight_only"]
    assert rec["tied_embedding"] == {} and "the embedding is excluded" in rec["float_layers"]["lm_head"]
    assert res.model.lm_head.weight is res.model.model.embed_tokens.weight
    assert type(res.model.lm_head.weight) is torch.nn.Parameter
    res = ptopt.quantize(tied_dir, "weight-only", bits=4, group_size=32)
    assert "int4 keeps it float" in res.extra["weight_only"]["float_layers"]["lm_head"]
    assert res.extra["weight_only"]["tied_embedding"] == {}


def test_awq_rounds_the_tied_matrix_to_nearest(tied_dir):
    """AWQ folds input scales into a matrix; the embedding reads the tied one's rows, so it is rounded to
    nearest (no act_pre_scale) and the embedding's rows stay the matrix's."""
    ids = torch.randint(0, VOCAB, (600,), generator=torch.Generator().manual_seed(5))
    res = ptopt.quantize(tied_dir, "weight-only", method="awq", calib_data=ids, calibration_samples=2)
    q = res.model
    assert q.lm_head.weight.act_pre_scale is None
    assert q.model.layers[0].mlp.up_proj.weight.act_pre_scale is not None  # the others are AWQ's
    x = _ids()
    with torch.no_grad():
        assert torch.equal(q.model.embed_tokens(x), q.lm_head.weight.dequantize()[x])


def test_int8_rows_matches_dequantize_with_zero_points_and_awq_scales():
    """``core.lm.int8_rows`` on the fields torchao may set: asymmetric zero points per group and AWQ's
    ``act_pre_scale``."""
    Int8Tensor = torchao("torchao.quantization").Int8Tensor
    PerGroup = torchao("torchao.quantization.granularity").PerGroup
    MappingType = torchao("torchao.quantization.quant_primitives").MappingType

    g = torch.Generator().manual_seed(0)
    w = Int8Tensor.from_hp(
        torch.randn(64, 48, generator=g), PerGroup(16), mapping_type=MappingType.ASYMMETRIC
    )
    assert bool(w.zero_point.ne(0).any())
    ids = torch.randint(0, 64, (3, 5), generator=g)
    assert torch.equal(int8_rows(w, ids), w.dequantize()[ids])
    w.act_pre_scale = torch.rand(48, generator=g) + 0.5
    assert torch.allclose(int8_rows(w, ids), w.dequantize()[ids] * w.act_pre_scale)


def test_decode_step_holds_the_shared_matrix_once(tied_dir, tmp_path):
    """torch.export.save pickles each tensor-subclass weight on its own: the program of the decode step
    lifts the tied int8 matrix once (through lm_head), replays like the folder's model, and the model in
    memory keeps its embedding afterwards."""
    torchao()  # its tensors, for torch.export.load

    from ptopt.formats.hf_decode import DECODE_FILE

    out = tmp_path / "step"
    res = ptopt.quantize(tied_dir, "weight-only", out, decode_step=16)
    assert res.extra["weight_only"]["decode_step"]["check"]["worst_cosine"] >= 0.999
    program = torch.export.load(out / DECODE_FILE)
    shared = [k for k, v in program.state_dict.items() if tuple(v.shape) == (VOCAB, 128)]
    assert shared == ["model.lm_head.weight"], shared
    q = res.model
    assert q.model.embed_tokens.weight is q.lm_head.weight  # restored after the export
    assert torch.equal(q.model.embed_tokens(_ids()), q.lm_head.weight.dequantize()[_ids()])
