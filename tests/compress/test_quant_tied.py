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


def test_groups_follow_the_shared_weight():
    from ptopt.compress.quantize.tied import tied_groups
    from tests.compress.quant_models import shared_vocab, tied_lm

    m = tied_lm()
    assert tied_groups(m) == [(["embed"], ["lm_head"])]
    assert tied_groups(m, float_modules=("lm_head",)) == []
    assert tied_groups(shared_vocab()) == [(["shared", "enc_embed", "dec_embed"], ["lm_head"])]
    m.lm_head.weight = torch.nn.Parameter(m.embed.weight.detach().clone())
    assert tied_groups(m) == []


def test_one_matrix_for_three_embeddings_and_the_head(tmp_path):
    import ptopt
    from tests.compress.quant_models import shared_vocab

    fp32 = shared_vocab()
    res = ptopt.quantize(fp32, "dynamic", calib_data=DATA, progress=False)
    assert res.extra["dynamic"]["tied_int8_stored_once"] == ["shared + enc_embed + dec_embed + lm_head"]
    ids = torch.randint(0, 600, (2, 7), generator=torch.Generator().manual_seed(3))
    cos = torch.nn.functional.cosine_similarity(res.model(ids).flatten(), fp32(ids).flatten(), 0)
    assert cos > 0.99
    assert _int8_vocab_tensors(res.save(tmp_path / "s.int8.pt").path) == 1


def test_a_half_kept_float_keeps_its_partner_float(cli, tmp_path):
    out = tmp_path / "lm.int8.pt"
    code, _, err = cli(
        "quantize", MODEL, "--mode", "dynamic", "--calib-data", DATA, "--exclude", "lm_head", "-o", out
    )
    assert code == 0, err
    side = json.loads((tmp_path / "lm.int8.pt.ptopt.json").read_text())
    assert "tied to lm_head" in side["extra"]["float_layers"]["embed"]
    assert "tied_int8_stored_once" not in side["extra"]["dynamic"]
    assert _int8_vocab_tensors(out) == 0  # the matrix is float, once


def test_table_numerics_and_reload_of_new_weights():
    import torch.ao.nn.quantized.dynamic as nnqd
    import torch.ao.quantization as tq

    from ptopt.compress.quantize.engine_fx import dynamic_weight_observer, quantize_dynamic
    from ptopt.compress.quantize.tied import Int8Table
    from tests.compress.quant_models import TiedLM, tied_lm

    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4))
    lin = torch.nn.Linear(64, 600).eval()
    for per_channel, qconfig in ((True, tq.per_channel_dynamic_qconfig), (False, tq.default_dynamic_qconfig)):
        lin.qconfig = qconfig
        ref = nnqd.Linear.from_float(lin)  # torch's own dynamic int8 Linear: the same int8 kernel
        table = Int8Table(lin.weight, lin.bias, dynamic_weight_observer(per_channel))
        torch.testing.assert_close(table(x), ref(x), rtol=0, atol=0)
    ids = torch.randint(0, 600, (2, 5), generator=torch.Generator().manual_seed(5))
    q = quantize_dynamic(tied_lm(), ("linear", "embedding"), True, "x86")
    torch.manual_seed(1)
    other = quantize_dynamic(TiedLM().eval(), ("linear", "embedding"), True, "x86")
    q.load_state_dict(other.state_dict())  # new int8 rows reach the packed output layer too
    torch.testing.assert_close(q(ids), other(ids))


def test_only_the_table_is_kept_out_of_freezing(tmp_path):
    """torch's own int8 modules have a ``__setstate__`` too: they must still be frozen (folded)."""
    import ptopt
    from ptopt.formats.torchscript import self_serializing as _self_serializing
    from tests.helpers import tiny_cnn

    static = ptopt.quantize(tiny_cnn(), "static", calib_data="builtin:digits:train", progress=False)
    assert _self_serializing(static.model) == []
    with zipfile.ZipFile(static.save(tmp_path / "c.int8.pt").path) as z:
        assert not any("/data/" in n for n in z.namelist())  # every tensor a frozen constant
    tied = ptopt.quantize(MODEL, "dynamic", calib_data=DATA, progress=False)
    kept = _self_serializing(torch.jit.load(str(tied.save(tmp_path / "t.int8.pt").path)))
    assert kept and all(k.endswith("table") for k in kept)
