"""Dynamic int8 of Hugging Face GPT-2 (random weights, tiny): transformers' ``Conv1D`` is quantized
as the linear layer it is, and an int8 file larger than its source is said loudly."""

from __future__ import annotations

import json

import pytest
import torch

import ptopt

MODEL = "tests.compress.hf_models:gpt2"
DATA = "tests.compress.hf_models:gpt2_tokens"


def test_conv1d_becomes_the_linear_it_is():
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    from ptopt.compress.quantize.layers import is_conv1d_linear, linearize_conv1d

    torch.manual_seed(0)
    model = torch.nn.Sequential(Conv1D(24, 8), torch.nn.GELU(), Conv1D(8, 24))
    x = torch.randn(2, 5, 8)
    before = model(x)
    state = torch.random.get_rng_state()
    assert all(is_conv1d_linear(m) for m in model if isinstance(m, Conv1D))
    assert linearize_conv1d(model, skip=("2",)) == ["0"]
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is untouched
    assert type(model[0]) is torch.nn.Linear and isinstance(model[2], Conv1D)
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-6)


def test_gpt2_dynamic_int8_is_a_third_of_the_fp32_file(cli, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "gpt2.int8.pt"
    code, stdout, err = cli("quantize", MODEL, "--mode", "dynamic", "--calib-data", DATA, "-o", out)
    assert code == 0, err
    side = json.loads((tmp_path / "gpt2.int8.pt.ptopt.json").read_text())
    m, extra = side["metrics"], side["extra"]
    # 0.28× with the tied wte / lm_head matrix stored once (0.335× when it was stored twice)
    assert m["size_ratio_vs_fp32_torchscript"] <= 0.3 and not m["larger_than_fp32"]
    assert extra["dynamic"]["tied_int8_stored_once"] == ["lm.transformer.wte + lm.lm_head"]
    assert len(extra["dynamic"]["conv1d_as_linear"]) == 8  # c_attn, c_proj, c_fc, mlp.c_proj × 2 layers
    assert not any("Conv1D" in why or "convolution" in why for why in extra["float_layers"].values())
    assert m["vs_fp32"]["passed"] and m["top1_agreement_vs_fp32"] > 0.95  # per token
    assert "LARGER" not in err and "Failed to load" not in err + stdout and "_pytree" not in err + stdout
    lm = torch.jit.load(str(out))
    assert lm(torch.randint(0, 1000, (3, 16))).shape == (3, 16, 1000)


def test_an_int8_file_larger_than_its_source_is_said_loudly(cli, tmp_path):
    args = ("quantize", "tests.compress.quant_models:tiny_linear", "--mode", "dynamic")
    code, stdout, err = cli(
        *args, "--calib-data", "tests.compress.quant_models:features4", "-o", tmp_path / "l.pt"
    )
    assert code == 0, err
    assert "warning: this int8 file is LARGER than its fp32 source" in err
    side = json.loads((tmp_path / "l.pt.ptopt.json").read_text())
    assert side["metrics"]["larger_than_fp32"] and side["metrics"]["size_ratio_vs_fp32_torchscript"] > 1


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tests.compress.hf_models import llama

    path = tmp_path_factory.mktemp("llama") / "llama"
    llama(vocab=128, hidden=32).save_pretrained(path)
    return path


def test_dynamic_int8_of_a_causal_lm_folder_quantizes_its_linear_layers(cli, llama_dir, tmp_path):
    """A transformers causal LM returns a KV cache object no trace carries: it is quantized as the function
    from token ids to logits, its layers under the names transformers gives them (CLI on ``hf:DIR``, API on
    the model in memory, which stays untouched)."""
    from ptopt.core.hf import load_causal_lm

    out = tmp_path / "llama.int8.pt"
    code, stdout, err = cli("quantize", f"hf:{llama_dir}", "--mode", "dynamic", "-o", out)
    assert code == 0, err
    extra = json.loads((tmp_path / "llama.int8.pt.ptopt.json").read_text())["extra"]
    assert "model.layers.1.mlp.down_proj" in extra["dynamic"]["quantized_layers"]
    assert "lm_head" in extra["dynamic"]["quantized_layers"]
    # the implied inputs: token ids and the padding mask, any length up to 128
    ids, mask = torch.randint(0, 128, (2, 40)), torch.ones(2, 40, dtype=torch.long)
    assert torch.jit.load(str(out))(input_ids=ids, attention_mask=mask).shape == (2, 40, 128)
    model = load_causal_lm(llama_dir)
    res = ptopt.quantize(model, "dynamic", exclude=["model.layers.0.mlp.down_proj"])
    assert "model.layers.0.mlp.down_proj" in res.extra["float_layers"]
    assert "forward" not in model.__dict__ and model(input_ids=torch.tensor([[1, 2]])).logits.shape == (
        1,
        2,
        128,
    )


def test_a_trace_failure_names_the_type_without_its_values():
    from ptopt.formats.capture import without_values

    msg = "Tracer cannot infer type of CausalLMOutputWithPast(loss=None, logits=tensor([[[-3.8e-02, -1.4e-01]]]))"
    assert without_values(msg) == (
        "Tracer cannot infer type of CausalLMOutputWithPast (a CausalLMOutputWithPast, not a tensor or a "
        "tuple/list/dict of tensors)"
    )
    assert without_values("shape mismatch: tensor([1, 2]) vs 3") == "shape mismatch:"


def test_a_weight_normed_conv_is_one_float_layer_named_as_a_conv():
    """wav2vec2 / HuBERT's positional conv is weight-normed: dynamic int8's 'stayed float' listed its
    ``parametrizations.weight`` ('ParametrizationList has no dynamic int8 kernel') as a second layer and the
    conv as 'ParametrizedConv1d has no dynamic int8 kernel' instead of the conv reason."""
    pytest.importorskip("transformers")
    from tests.compat import prune_families as F

    res = ptopt.quantize(F.wav2vec2(), "dynamic", input_shapes=("input_values=1x1600",), progress=False)
    floats = res.metrics.get("float_layers") or res.extra["float_layers"]
    assert not [n for n in floats if ".parametrizations." in n], floats
    assert floats["wav2vec2.encoder.pos_conv_embed.conv"].startswith("convolutions are never dynamically")
