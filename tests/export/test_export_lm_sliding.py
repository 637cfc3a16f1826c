"""A sliding-window decoder's refusal says what a user may change in config.json only where the change
keeps what the model computes: GPT-OSS names each layer's kind (``layer_types``), so ``sliding_window:
null`` (the old advice) built no cache; Gemma 3's sliding layers have a rotary embedding of their own,
so making them full-attention layers changes the model (no advice). Tiny models from configs."""

from __future__ import annotations

import json

import torch

import ptopt
from tests.export.lm_models import VOCAB
from tests.helpers import assert_refused


def _save(cfg, folder):
    from ptopt.core.hf import import_transformers
    from tests.compress.hf_models import word_tokenizer

    torch.manual_seed(0)
    import_transformers().AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(folder)
    word_tokenizer(folder, VOCAB)
    return folder


def _common():
    return dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=32,
                initializer_range=0.2, bos_token_id=1, eos_token_id=2)  # fmt: skip


def test_gemma3_is_refused_without_advice_that_would_change_it(cli, tmp_path):
    from ptopt.core.hf import import_transformers

    cfg = import_transformers().Gemma3TextConfig(intermediate_size=64, **_common())
    folder = _save(cfg, tmp_path / "gemma3")
    message = assert_refused(cli, "export", f"hf:{folder}", "--target", "onnx", "-o", tmp_path / "o",
                             match=("rotary embedding of their own", "cannot be exported"), where=tmp_path)  # fmt: skip
    assert "sliding_window to null" not in message and "layer_types" not in message


def test_gpt_oss_advice_is_layer_types_and_following_it_exports_the_same_model(cli, tmp_path):
    from ptopt.core.hf import import_transformers, load_causal_lm
    from ptopt.export.lm_check import greedy_reference

    tf = import_transformers()
    cfg = tf.GptOssConfig(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                          layer_types=["sliding_attention", "full_attention"], **_common())  # fmt: skip
    folder = _save(cfg, tmp_path / "gptoss")
    advice = 'set every "sliding_attention" in layer_types to "full_attention"'
    assert_refused(cli, "export", f"hf:{folder}", "--target", "onnx", "-o", tmp_path / "o", match=advice)
    copy = tmp_path / "gptoss-full"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config["layer_types"] = ["full_attention"] * 2
    (copy / "config.json").write_text(json.dumps(config))
    res = ptopt.export(f"hf:{copy}", "onnx", tmp_path / "onnx", new_tokens=8)
    assert res.metrics["greedy"]["equal"]
    prompt = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    # the original model (its sliding layer: 7 + 12 tokens stay under the window of 32) generates the same
    want = greedy_reference(load_causal_lm(folder), prompt, 12)
    assert torch.equal(res.model.generate(prompt, 12), want)


def test_llama4_chunked_attention_advice_and_following_it_keeps_the_model(tmp_path):
    """Llama 4's chunked layers were told to set sliding_window to null (already null: no way out).
    The advice names ``chunked_attention``; with it followed, the ExportedProgram generates what the
    chunked original generates under its chunk (its experts computed whole, ``formats.lm_experts``)."""
    from ptopt.core.errors import UnsupportedModelError
    from ptopt.core.hf import import_transformers
    from ptopt.export.lm_check import greedy_reference

    tf = import_transformers()
    kw = dict(_common(), intermediate_size=32, intermediate_size_mlp=64, num_local_experts=4,
              num_experts_per_tok=1, attention_chunk_size=32)  # fmt: skip
    kw.pop("sliding_window")
    torch.manual_seed(0)
    chunked = tf.AutoModelForCausalLM.from_config(tf.Llama4TextConfig(**kw)).eval()
    try:
        ptopt.export(chunked, "exported_program", tmp_path / "never", new_tokens=4)
    except UnsupportedModelError as e:
        assert 'set every "chunked_attention" in layer_types to "full_attention"' in str(e)
    else:
        raise AssertionError("a chunked-attention cache was exported")
    full = tf.AutoModelForCausalLM.from_config(tf.Llama4TextConfig(layer_types=["full_attention"] * 2, **kw))
    full.load_state_dict(chunked.state_dict())
    res = ptopt.export(full.eval(), "exported_program", tmp_path / "ep", new_tokens=8)
    assert res.metrics["greedy"]["equal"]
    prompt = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    assert torch.equal(res.model.generate(prompt, 12), greedy_reference(chunked, prompt, 12))
