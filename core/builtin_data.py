"""Bundled data sets (no download): scikit-learn's digits, in the variants the model zoo needs.

``builtin:NAME[:SPLIT]`` with SPLIT ``train`` (80%), ``test`` (20%, held out) or ``all`` (default).
The split is a fixed seeded permutation, the same on every machine.

| name            | x                                                   | for                  |
|-----------------|-----------------------------------------------------|----------------------|
| digits          | float32 N×1×8×8 in [0, 1]                           | tiny CNNs            |
| digits32        | float32 N×1×32×32, bilinear upsampled, normalized   | ResNet / MobileNet   |
| digits-seq      | float32 N×32×32 (32 rows of 32 pixels), normalized  | LSTM classifier      |
| digits-tokens   | input_ids int64 N×72 (position·value tokens) + attention_mask | transformer encoder |
"""

from __future__ import annotations

import functools
from typing import Any

from ptopt.core.errors import DataError

SPLIT_SEED = 0
TRAIN_FRACTION = 0.8
#: digits-tokens: pixel p (0..63) with value v (0..16) is token 1 + 17·p + v, so a token carries
#: both where and how bright; 0 is padding; 8 padded positions per sample.
TOKEN_PAD = 8

NAMES = ("digits", "digits32", "digits-seq", "digits-tokens")
SPLITS = ("train", "test", "all")


@functools.cache
def _digits_raw():
    """The 1,797 digits as ``(N×8×8 float32 images, N int64 labels)``: read from the file scikit-learn
    ships (``sklearn/datasets/data/digits.csv.gz``, 64 pixel columns then the label) without importing
    scikit-learn (1-3 s of SciPy imports in every command that names builtin data); through
    ``load_digits`` where that file is not where this expects it."""
    import numpy as np

    path = _digits_file()
    if path is None:
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images.astype(np.float32), d.target.astype(np.int64)
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8).astype(np.float32), data[:, -1].astype(np.int64)


def _digits_file():
    from importlib.machinery import PathFinder
    from pathlib import Path

    spec = PathFinder.find_spec("sklearn")  # where it is installed, imported or not
    if spec is None or not spec.submodule_search_locations:
        raise DataError("builtin data needs scikit-learn's digits: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


@functools.cache
def _variant(name: str):
    import torch
    import torch.nn.functional as F

    images, target = _digits_raw()
    x8 = torch.from_numpy(images / 16.0).unsqueeze(1)  # N×1×8×8 in [0, 1]
    y = torch.from_numpy(target)
    if name == "digits":
        return x8, y
    if name in ("digits32", "digits-seq"):
        x32 = F.interpolate(x8, size=(32, 32), mode="bilinear", align_corners=False)
        x32 = (x32 - 0.5) / 0.5
        return (x32 if name == "digits32" else x32.squeeze(1).contiguous()), y
    if name == "digits-tokens":
        ids = 1 + 17 * torch.arange(64) + torch.from_numpy(images.reshape(len(images), 64)).long()
        ids = torch.cat([ids, torch.zeros(len(ids), TOKEN_PAD, dtype=torch.long)], dim=1)
        mask = (ids != 0).long()
        return {"input_ids": ids, "attention_mask": mask}, y
    raise KeyError(name)


def load_builtin(ref: str) -> tuple[Any, Any, str]:
    """``(x, y, name)`` of ``builtin:NAME[:SPLIT]`` (``ptopt.core.data`` makes the Dataset): the
    variant's tensors, the split a seeded permutation's (``TRAIN_FRACTION`` train), order kept."""
    parts = ref.split(":")
    if len(parts) not in (2, 3) or parts[0] != "builtin":
        raise DataError(f"bad builtin data reference {ref!r}: write builtin:NAME[:SPLIT]")
    name, split = parts[1], parts[2] if len(parts) == 3 else "all"
    if name not in NAMES:
        raise DataError(f"unknown builtin data {name!r} (known: {', '.join(NAMES)})")
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r} for builtin:{name} (use {', '.join(SPLITS)})")
    import torch

    x, y = _variant(name)
    if split == "all":
        return x, y, f"builtin:{name}:{split}"
    n = len(y)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED))
    k = int(round(n * TRAIN_FRACTION))
    idx = torch.sort(perm[:k] if split == "train" else perm[k:]).values
    x = {key: v[idx] for key, v in x.items()} if isinstance(x, dict) else x[idx]
    return x, y[idx], f"builtin:{name}:{split}"
