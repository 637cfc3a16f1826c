"""Hugging Face models for the quantization tests (need ``transformers``), random weights, tiny sizes:
``tests.compress.hf_models:gpt2`` and its DATA ``tests.compress.hf_models:gpt2_tokens``."""

from __future__ import annotations

import torch
from torch import nn


class LMLogits(nn.Module):
    """A causal LM called with ``input_ids``, returning its logits (transformers 5 returns a
    ModelOutput with caches, which ``torch.jit.trace`` cannot take)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def gpt2() -> nn.Module:
    """GPT-2 (2 layers, d=128, vocab 1000): its attention and MLP are transformers' ``Conv1D``."""
    from tests.compat.models import ensure_torchvision_ops

    ensure_torchvision_ops()  # transformers imports torchvision when installed (REFERENCE.md: CUDA build)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0)
    return LMLogits(GPT2LMHeadModel(cfg)).eval()


def gpt2_tokens(n: int = 32, seq: int = 16) -> dict:
    """Token ids for ``gpt2``."""
    return {"x": {"input_ids": torch.randint(0, 1000, (n, seq), generator=torch.Generator().manual_seed(0))}}


def bert() -> nn.Module:
    """BertForSequenceClassification (2 layers, hidden 128, 4 heads, vocab 1000, 3 labels): fx cannot
    trace it; the PT2E engine (torch.export) captures it with its attention mask."""
    from tests.compat.models import bert_classifier

    return bert_classifier(1000, hidden=128, layers=2, heads=4, ffn=256, positions=64)


def bert_tokens(n: int = 64, seq: int = 32, seed: int = 0) -> dict:
    """Padded token batches for ``bert``: ``input_ids`` and an ``attention_mask`` whose rows end in
    0 to seq/2 - 1 padded positions (ids 0 there), as a tokenizer pads a batch."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 1000, (n, seq), generator=g)
    mask = torch.ones(n, seq, dtype=torch.long)
    for i in range(n):
        pad = (i * 7) % (seq // 2)
        if pad:
            mask[i, seq - pad :] = 0
    return {"x": {"input_ids": ids * mask, "attention_mask": mask}}


def bert_labelled(n: int = 32, seq: int = 16) -> dict:
    """``bert_tokens`` with labels: what ``bert`` (3 classes) predicts on them, so top-1 is 100%."""
    d = bert_tokens(n, seq)
    with torch.no_grad():
        y = bert()(**d["x"]).logits.argmax(-1)
    return {"x": d["x"], "y": y}


def llama(vocab: int = 512, hidden: int = 128, tie: bool = False) -> nn.Module:
    """LlamaForCausalLM (2 layers, 4 heads, 2 key/value heads, 1024 positions), seeded random weights:
    the language model of the weight-only, optimize and validate tests."""
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=tie,
    )  # fmt: skip
    return tf.LlamaForCausalLM(cfg).eval()


def word_tokenizer(folder, vocab: int = 512) -> None:
    """Save a word-level tokenizer (``[UNK]``, ``w1`` ... ``w{vocab-1}``, split on whitespace) into
    ``folder``: text data without a downloaded tokenizer (``w7 w42 ...`` is ids 7, 42, ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ptopt.core.hf import import_transformers

    words = {"[UNK]": 0} | {f"w{i}": i for i in range(1, vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    import_transformers().PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(
        folder
    )
