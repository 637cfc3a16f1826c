"""Text data for language models: a DATA reference read as one stream of token ids.

==============================  ===================================================================
reference                       what it is
==============================  ===================================================================
``corpus.txt``                  UTF-8 text, tokenized with the model's own tokenizer
``ids.pt`` / ``ids.npy``        int64 token ids (any shape, flattened; ``torch.load(weights_only)``
                                / ``numpy.load(allow_pickle=False)``: no code runs)
``builtin:pydoc-text:SPLIT``    English prose shipped with Python (``pydoc_data.topics``, the help
                                pages of the language reference); SPLIT ``calib`` or ``eval``: cut
                                at paragraph ends into blocks of 2,000+ characters, every fifth
                                block ``eval``, the rest ``calib``, never both
==============================  ===================================================================

Calibration (GPTQ, AWQ) and evaluation (perplexity) should read different parts: the builtin's two
splits share no topic.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptopt.core.errors import DataError

BUILTIN_TEXT = "pydoc-text"
TEXT_SPLITS = ("calib", "eval", "all")
#: every EVAL_EVERY-th block of at least BLOCK_CHARS characters is the eval split
EVAL_EVERY = 5
BLOCK_CHARS = 2000
ID_SUFFIXES = (".pt", ".npy")
TEXT_SUFFIXES = (".txt", ".tsv", ".text", ".md")


def is_text_ref(ref: Any) -> bool:
    """Whether ``ref`` names text data (a text or token-id file, or the builtin text)."""
    if not isinstance(ref, (str, os.PathLike)):
        return False
    text = str(ref)
    if text.startswith(f"builtin:{BUILTIN_TEXT}"):
        return True
    return Path(text).suffix.lower() in TEXT_SUFFIXES


def builtin_text(split: str = "all") -> str:
    """The builtin corpus (module docstring) as one string: the topics in name order, cut at
    paragraph ends into blocks of at least ``BLOCK_CHARS``; every ``EVAL_EVERY``-th block is eval."""
    if split not in TEXT_SPLITS:
        raise DataError(f"unknown split {split!r} for builtin:{BUILTIN_TEXT} (use {', '.join(TEXT_SPLITS)})")
    from pydoc_data.topics import topics

    paragraphs = [p for name in sorted(topics) for p in topics[name].strip().split("\n\n") if p.strip()]
    blocks, current = [], []
    for p in paragraphs:
        current.append(p)
        if sum(map(len, current)) >= BLOCK_CHARS:
            blocks.append("\n\n".join(current))
            current = []
    blocks += ["\n\n".join(current)] if current else []
    if split == "all":
        return "\n\n".join(blocks)
    is_eval = split == "eval"
    return "\n\n".join(b for i, b in enumerate(blocks) if (i % EVAL_EVERY == EVAL_EVERY - 1) == is_eval)


def read_text(ref: str | os.PathLike) -> str:
    """The text of a ``.txt`` file or of the builtin corpus."""
    text = str(ref)
    if text.startswith("builtin:"):
        parts = text.split(":")
        if len(parts) not in (2, 3) or parts[1] != BUILTIN_TEXT:
            raise DataError(
                f"bad builtin text reference {text!r}: write builtin:{BUILTIN_TEXT}[:calib|:eval]"
            )
        return builtin_text(parts[2] if len(parts) == 3 else "all")
    path = Path(text)
    if not path.is_file():
        raise DataError(f"text data {path}: no such file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"text data {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_token_ids(ref: Any, tokenizer: Any = None, *, name: str = "text data") -> Any:
    """``ref`` as a 1-D int64 tensor of token ids. ``ref``: a reference (module docstring), a string of
    text (with ``tokenizer``) or a tensor of ids. Text needs ``tokenizer`` (``core.hf.load_tokenizer``)."""
    import torch

    if isinstance(ref, torch.Tensor):
        return _checked_ids(ref, name)
    text = str(ref)
    suffix = Path(text).suffix.lower()
    if suffix in ID_SUFFIXES and not text.startswith("builtin:"):
        return _checked_ids(_load_ids(Path(text)), f"{name} {text}")
    if tokenizer is None and not is_text_ref(text):  # image data, a .npz, a typo: no text to tokenize
        raise DataError(
            f"{name} {text} is not text: a language model reads a {'/'.join(TEXT_SUFFIXES)} file, token ids "
            f"in a {'/'.join(ID_SUFFIXES)}, or builtin:{BUILTIN_TEXT}:calib|eval"
        )
    if tokenizer is None:
        raise DataError(f"{name} {text} is text: tokenizing it needs the model's tokenizer")
    from ptopt.core.quiet import silenced

    words = read_text(ref)
    with silenced(["transformers"]):  # "longer than the maximum sequence length": windows come later
        ids = tokenizer(words, return_tensors="pt", add_special_tokens=False)["input_ids"]
    return _checked_ids(ids, f"{name} {text}")


def _load_ids(path: Path) -> Any:
    import torch

    if not path.is_file():
        raise DataError(f"token ids {path}: no such file")
    try:
        if path.suffix.lower() == ".npy":
            import numpy as np

            return torch.from_numpy(np.load(path, allow_pickle=False))
        loaded = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's data problem
        raise DataError(f"token ids {path}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(loaded, torch.Tensor):
        raise DataError(f"token ids {path}: holds a {type(loaded).__name__}, not a tensor of token ids")
    return loaded


def _checked_ids(ids: Any, name: str) -> Any:
    import torch

    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise DataError(f"{name}: token ids must be integers, got {ids.dtype}")
    ids = ids.reshape(-1).to(torch.long)
    if ids.numel() < 2:
        raise DataError(f"{name}: {ids.numel()} token(s); a language model needs at least 2")
    if int(ids.min()) < 0:
        raise DataError(f"{name}: negative token id {int(ids.min())}")
    return ids


def check_vocab(ids: Any, vocab_size: int, name: str = "text data") -> None:
    """DataError when an id is outside the model's vocabulary (the embedding would index past it)."""
    top = int(ids.max())
    if top >= vocab_size:
        raise DataError(f"{name}: token id {top} is outside the model's vocabulary of {vocab_size}")
