"""Tiny random-weight causal LMs of four families, built from configs (no download), for the causal-LM
export tests: Llama-style (GQA, RMSNorm, rotary, SwiGLU), Qwen2-style (biased q/k/v), GPT-2-style
(Conv1D projections, learned positions, LayerNorm, tied head) and Phi-3-style (fused qkv / gate-up).
One layer each but Llama's two (the cache's per-layer names), hidden 32, 64 positions; weights drawn
wider than the families' defaults (``initializer_range`` 0.2) so greedy decoding picks clear winners
instead of near ties."""

from __future__ import annotations

from pathlib import Path

VOCAB = 256
POSITIONS = 64
FAMILIES = ("llama", "qwen2", "gpt2", "phi3")


def build(family: str, layers: int = 1):
    """The family's causal LM, seeded, in eval mode."""
    import torch

    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        max_position_embeddings=POSITIONS, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    if family == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=2, **common))
    elif family == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(num_key_value_heads=2, **common))
    elif family == "phi3":
        model = tf.Phi3ForCausalLM(tf.Phi3Config(num_key_value_heads=2, pad_token_id=0, **common))
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=POSITIONS,
                            initializer_range=0.2, bos_token_id=1, eos_token_id=2)  # fmt: skip
        model = tf.GPT2LMHeadModel(cfg)
    elif family == "falcon":  # multi-query attention: one cached key/value head, fused qkv
        cfg = tf.FalconConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=layers,
            num_attention_heads=4,
            multi_query=True,
            new_decoder_architecture=False,
            max_position_embeddings=POSITIONS,
            initializer_range=0.2,
            bos_token_id=1,
            eos_token_id=2,
        )  # fmt: skip
        model = tf.FalconForCausalLM(cfg)
    elif family == "mistral":  # sliding-window layers: refused
        model = tf.MistralForCausalLM(tf.MistralConfig(num_key_value_heads=2, sliding_window=16, **common))
    elif family == "mixtral":  # a mixture of experts: fused 3-D expert Parameters, a top-k router
        cfg = tf.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **common)
        model = tf.MixtralForCausalLM(cfg)
    elif family == "qwen2_moe":  # routed experts beside a shared expert (an MLP of Linear layers)
        cfg = tf.Qwen2MoeConfig(num_key_value_heads=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                num_experts=4, num_experts_per_tok=2, **common)  # fmt: skip
        model = tf.Qwen2MoeForCausalLM(cfg)
    elif family == "mamba":  # state-space layers, no attention: refused
        cfg = tf.MambaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, state_size=4, expand=2,
                             conv_kernel=2, bos_token_id=1, eos_token_id=2)  # fmt: skip
        model = tf.MambaForCausalLM(cfg)
    else:
        raise ValueError(family)
    return model.eval()


def save(family: str, folder: Path, layers: int = 1) -> Path:
    """The family's model saved as a Hugging Face folder with a word tokenizer (``w7 w42`` is ids 7, 42)."""
    from tests.compress.hf_models import word_tokenizer

    build(family, layers).save_pretrained(folder)
    word_tokenizer(folder, VOCAB)
    return folder
