"""A tiny causal-LM teacher/student pair in Hugging Face folders for the distillation tests: a seeded
Llama teacher (2 layers, hidden 32) with a word-level tokenizer, a student config of the same family
(1 layer, hidden 16; ``config.json`` alone: a fresh student), and text over a small alphabet of words
(``w1`` ... ``w24``) that a student learns something about in a few steps."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 64


def _llama(hidden: int, layers: int, vocab: int = VOCAB):
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=0,
    )  # fmt: skip
    return tf.LlamaForCausalLM(cfg).eval()


def text(n: int, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    return " ".join(f"w{i}" for i in torch.randint(1, 25, (n,), generator=g).tolist())


def make_pair(root: Path) -> dict[str, Path]:
    """Folders and data under ``root``: teacher, student (config only), other (another vocabulary),
    train.txt / eval.txt, train.pt (token ids)."""
    from tests.compress.hf_models import word_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    _llama(32, 2).save_pretrained(root / "teacher")
    word_tokenizer(root / "teacher", VOCAB)
    _llama(16, 1).config.save_pretrained(root / "student")
    _llama(16, 1, vocab=2 * VOCAB).config.save_pretrained(root / "other")
    (root / "train.txt").write_text(text(320, 1), encoding="utf-8")
    (root / "eval.txt").write_text(text(200, 2), encoding="utf-8")
    torch.save(torch.randint(1, 25, (500,), generator=torch.Generator().manual_seed(4)), root / "train.pt")
    return {n: root / n for n in ("teacher", "student", "other", "train.txt", "eval.txt", "train.pt")}
