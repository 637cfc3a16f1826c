"""Training checkpoints: everything needed to continue a killed run bit for bit.

One file per run, ``<checkpoint_dir>/checkpoint.pt``, replaced atomically after every epoch: model,
trainable parts outside it, optimizer, scheduler, gradient scaler, every RNG (torch, CUDA, Python,
NumPy; one set per rank), the epoch, the history and the best-so-far weights, plus a fingerprint of
everything that decides the result (train config, model architecture, data, loss options). A
checkpoint whose fingerprint differs from the current run is refused, naming what differs. It holds
tensors and plain values only and loads with ``weights_only=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

from ptopt.core.errors import UsageError

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_KIND = "ptopt-train-checkpoint"
CHECKPOINT_VERSION = 1
#: TrainConfig fields that do not change the trained weights (and may differ on resume)
NON_RESULT_FIELDS = ("device", "eval_batch_size")


def checkpoint_path(checkpoint_dir: str | os.PathLike) -> Path:
    return Path(checkpoint_dir) / CHECKPOINT_NAME


def tensor_digest(tensors: Any) -> str:
    """sha256 (16 hex) over tensors' dtypes, shapes and bytes; identical tensors give identical digests."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


#: inputs whose name starts with this are derived from the others (e.g. cached teacher logits)
DERIVED_PREFIX = "__ptopt_derived:"


def data_digest(data: Any) -> dict[str, Any]:
    from ptopt.core.inputspec import flatten_inputs

    tensors = [t for name, t in flatten_inputs(data.x) if not name.startswith(DERIVED_PREFIX)]
    return {"samples": len(data), "sha": tensor_digest(tensors + [data.y])}


def model_signature(model: Any) -> str:
    """Hash of parameter/buffer names, shapes and dtypes: the architecture, not the weights."""
    text = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in model.state_dict().items())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(
    config: Any, model: Any, train_data: Any, eval_data: Any, world: int, extra: dict[str, Any] | None
) -> dict[str, Any]:
    cfg = {k: v for k, v in config.to_dict().items() if k not in NON_RESULT_FIELDS}
    return {
        "train": cfg,
        "model": model_signature(model),
        "train_data": data_digest(train_data),
        "eval_data": data_digest(eval_data) if eval_data is not None else None,
        "world_size": world,
        "loss": dict(extra or {}),
    }


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def describe_differences(saved: dict[str, Any], now: dict[str, Any], limit: int = 6) -> list[str]:
    a, b = _flatten(saved), _flatten(now)
    diffs = []
    for k in sorted(set(a) | set(b)):
        if json.dumps(a.get(k), default=str) != json.dumps(b.get(k), default=str):
            name = k.replace("train.", "", 1)
            diffs.append(f"{name}: checkpoint {a.get(k, '(unset)')!r}, now {b.get(k, '(unset)')!r}")
    return diffs[:limit] + ([f"(+{len(diffs) - limit} more)"] if len(diffs) > limit else [])


# -- RNG -------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # plain lists, so the checkpoint loads with weights_only=True
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- save / load -----------------------------------------------------------------------------------


def save_checkpoint(checkpoint_dir: str | os.PathLike, state: dict[str, Any]) -> Path:
    import torch

    from ptopt.core.artifact import atomic_path

    path = checkpoint_path(checkpoint_dir)
    with atomic_path(path) as tmp:
        torch.save({"kind": CHECKPOINT_KIND, "version": CHECKPOINT_VERSION, **state}, tmp)
    return path


def load_checkpoint(
    checkpoint_dir: str | os.PathLike, expected_fingerprint: dict[str, Any]
) -> dict[str, Any] | None:
    """The checkpoint in ``checkpoint_dir`` (None when there is none yet); refuses another run's checkpoint."""
    import pickle

    import torch

    path = checkpoint_path(checkpoint_dir)
    if not path.is_file():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise UsageError(
            f"{path}: not a readable ptopt checkpoint ({str(e).splitlines()[0][:200]})"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("kind") != CHECKPOINT_KIND:
        raise UsageError(f"{path}: not a ptopt training checkpoint")
    if ckpt.get("version") != CHECKPOINT_VERSION:
        raise UsageError(
            f"{path}: checkpoint version {ckpt.get('version')} (this ptopt reads {CHECKPOINT_VERSION})"
        )
    diffs = describe_differences(ckpt["fingerprint"], expected_fingerprint)
    if diffs:
        raise UsageError(
            f"{path} was written by another configuration, cannot resume: "
            + "; ".join(diffs)
            + " (resume with the original options, or use another --checkpoint-dir)"
        )
    return ckpt
