"""A sentence-transformers folder's pooling, on the server: the ``sentence_embedding`` output.

A sentence encoder saved by sentence-transformers (``modules.json``: ``Transformer``, then ``Pooling``,
often ``Normalize``) is exported by ptopt as its transformer alone: the artifact answers
``last_hidden_state`` (one vector per token), and the sentence's vector is what the folder's
``Pooling`` module makes of it. ``serve.ray_package`` reads that module's ``config.json`` when it packages
an artifact made from such a folder, and the Ray Serve ingress adds ``sentence_embedding`` to every
answer, computed as sentence-transformers computes it: the modes the config turns on (``cls``, ``max``,
``mean``, ``mean_sqrt_len``, ``lasttoken``), concatenated in that order, over the tokens the
``attention_mask`` marks, then scaled to unit length where ``Normalize`` follows. A folder with other
modules (``Dense``, ...) or another mode (``weightedmean``) gets no such output, and ``package`` says why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

OUTPUT = "sentence_embedding"
#: the hidden states pooled: what a Hugging Face encoder (``BertModel``, ...) answers first
HIDDEN = "last_hidden_state"
#: sentence-transformers' Pooling modes, in the order it concatenates them
MODES = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "lasttoken")
_ST = "sentence_transformers.models."


def pooling_of(folder: str | Path) -> tuple[dict[str, Any] | None, str]:
    """``({"modes": [...], "normalize": bool}, "")`` for a sentence-transformers folder whose modules
    the server reproduces; ``(None, why not)`` for one it does not; ``(None, "")`` for any other folder."""
    folder = Path(folder)
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, ""
    kinds = [str(m.get("type", "")).removeprefix(_ST) for m in modules if isinstance(m, dict)]
    pool = next((m for m in modules if isinstance(m, dict) and m.get("type") == _ST + "Pooling"), None)
    other = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if pool is None or other:
        why = f"its modules.json holds {', '.join(other)}" if other else "its modules.json holds no Pooling"
        return None, f"no {OUTPUT} ({why}, which the server does not run)"
    try:
        config = json.loads((folder / str(pool.get("path", "")) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return None, f"no {OUTPUT} (its Pooling config cannot be read: {e})"
    on = [k.removeprefix("pooling_mode_") for k, v in config.items() if k.startswith("pooling_mode_") and v]
    unknown = [m for m in on if m not in MODES]
    if unknown or not on:
        what = f"pooling mode {', '.join(unknown)}" if unknown else "no pooling mode"
        return None, f"no {OUTPUT} (its Pooling config turns on {what}, which the server does not run)"
    return {"modes": [m for m in MODES if m in on], "normalize": "Normalize" in kinds}, ""


def sentence_embedding(hidden: np.ndarray, mask: np.ndarray, pooling: dict[str, Any]) -> np.ndarray:
    """The ``[N, H * modes]`` sentence vectors of ``hidden`` (``[N, T, H]``) over the tokens ``mask``
    (``[N, T]``) marks (module docstring)."""
    h = hidden.astype(np.float32)
    m = mask.astype(np.float32)[..., None]
    count = np.clip(m.sum(axis=1), 1e-9, None)
    parts = []
    for mode in pooling["modes"]:
        if mode == "cls_token":
            parts.append(h[:, 0])
        elif mode == "max_tokens":
            parts.append(np.where(m > 0, h, -1e9).max(axis=1))
        elif mode == "mean_tokens":
            parts.append((h * m).sum(axis=1) / count)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((h * m).sum(axis=1) / np.sqrt(count))
        elif mode == "lasttoken":  # the last token the mask keeps, padded on either side
            keep = mask.astype(bool)
            last = keep.shape[1] - 1 - np.argmax(keep[:, ::-1], axis=1)
            parts.append(h[np.arange(h.shape[0]), last])
        else:
            raise ValueError(f"pooling mode {mode!r}: the server pools {', '.join(MODES)}")
    out = np.concatenate(parts, axis=1)
    if pooling.get("normalize"):
        out = out / np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)
    return out.astype(np.float32)


def with_pooled_output(meta: dict[str, Any], pooling: dict[str, Any] | None) -> dict[str, Any]:
    """The model metadata with ``sentence_embedding`` among the outputs, where it is added."""
    from ptopt.serve.oip import tensor_metadata

    hidden = next((t for t in meta["outputs"] if t["name"] == HIDDEN and len(t["shape"]) == 3), None)
    if not pooling or hidden is None:
        return meta
    width = hidden["shape"][-1] * len(pooling["modes"]) if hidden["shape"][-1] > 0 else -1
    return {
        **meta,
        "outputs": [*meta["outputs"], tensor_metadata(OUTPUT, "FP32", [hidden["shape"][0], width])],
    }
