"""A tied embedding and output layer (one matrix in the fp32 model) is one int8 matrix in the dynamic
int8 file, stored once, frozen around it, and loads with plain torch."""

from __future__ import annotations

import json
import zipfile

import torch

MODEL, DATA = "tests.compress.quant_models:tied_lm", "tests.compress.quant_models:tied_tokens"


def _int8_vocab_tensors(path) -> int:
    """How many tensors of the file have the tied matrix's int8 size (600 × 64 bytes)."""
    with zipfile.ZipFile(path) as z:
        return sum(
            1
            for i in z.infolist()
            if "/data/" in i.filename or "/constants/" in i.filename
            if i.file_size == 600 * 64
        )


def test_tied_matrix_is_stored_once_through_the_cli(cli, tmp_path):
    out = tmp_path / "lm.int8.pt"
    code, stdout, err = cli("quantize", MODEL, "--mode", "dynamic", "--calib-data", DATA, "-o", out)
    assert code == 0, err
    assert "tied:  embed + lm_head share one int8 matrix, stored once" in stdout
    side = json.loads((tmp_path / "lm.int8.pt.ptopt.json").read_text())
    assert side["extra"]["dynamic"]["tied_int8_stored_once"] == ["embed + lm_head"]
    assert side["extra"]["frozen"] and side["metrics"]["vs_fp32"]["passed"]
    assert not {"embed", "lm_head"} & set(side["extra"].get("float_layers", {}))
    assert _int8_vocab_tensors(out) == 1
    # measured 0.33× with the matrix once; 0.475× when it was stored twice (an int8 Embedding + Linear)
    assert side["metrics"]["size_ratio_vs_fp32_torchscript"] < 0.4


def test_tied_int8_runs_in_memory_and_from_plain_torch(tmp_path):
    import ptopt
    from tests.compress.quant_models import tied_lm

    fp32 = tied_lm()
    ids = torch.randint(0, 600, (3, 9), generator=torch.Generator().manual_seed(2))
    res = ptopt.quantize(fp32, "dynamic", calib_data=DATA, progress=False)
    ref = fp32(ids)
    assert torch.nn.functional.cosine_similarity(res.model(ids).flatten(), ref.flatten(), 0) > 0.99
    art = res.save(tmp_path / "lm.int8.pt")
    loaded = torch.jit.load(str(art.path))  # no ptopt import needed to run it
    torch.testing.assert_close(loaded(ids), res.model(ids), rtol=1e-2, atol=1e-3)
    assert _int8_vocab_tensors(art.path) == 1


def test_an_untied_copy_keeps_two_matrices():
    from ptopt.compress.quant_tied import tied_pairs
    from tests.compress.quant_models import tied_lm

    m = tied_lm()
    assert tied_pairs(m) == [("embed", "lm_head")]
    assert tied_pairs(m, float_modules=("lm_head",)) == []
    m.lm_head.weight = torch.nn.Parameter(m.embed.weight.detach().clone())
    assert tied_pairs(m) == []
