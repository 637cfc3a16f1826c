"""Model outputs as flat lists of float64 numpy arrays: what every comparison of two models reads
(export's parity check, compress's fidelity check, validate's metrics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ptopt.core.errors import UnsupportedModelError


def flatten_outputs(out: Any) -> list[Any]:
    """Model outputs (tensor, tuple/list, dict, numpy) → a list of float64 numpy arrays."""
    return [a for _, a in flatten_named_outputs(out)]


def flatten_named_outputs(out: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Like :func:`flatten_outputs`, each array with a name: its dict key or its position
    (``"logits"``, ``"0"``, ``"1.hidden"``)."""
    import numpy as np
    import torch

    arrays: list[tuple[str, Any]] = []
    for name, o in named_leaves(out, prefix):
        if isinstance(o, torch.Tensor):
            t = o.detach()
            if t.is_quantized:
                t = t.dequantize()
            arrays.append((name, t.cpu().to(torch.float64).numpy()))
        else:
            try:
                arrays.append((name, np.asarray(o, dtype=np.float64)))
            except (TypeError, ValueError):
                raise UnsupportedModelError(
                    f"the model returns a {type(o).__name__} ({str(o)[:40]!r}); ptopt exports models whose "
                    f"outputs are tensors, or tuples, lists or dicts of tensors"
                ) from None
    return arrays


def named_leaves(out: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """The leaves of a model's output (nested tuples, lists and dicts, Hugging Face ModelOutputs among
    them), each with the name every comparison gives it: its keys and positions joined by dots
    (``"logits"``, ``"0"``, ``"text_model_output.pooler_output"``)."""
    if isinstance(out, dict):
        items: Sequence[tuple[str, Any]] = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(out)]
    else:
        items = [("", out)]
    leaves: list[tuple[str, Any]] = []
    for key, o in items:
        name = ".".join(p for p in (prefix, key) if p) or "0"
        leaves += named_leaves(o, name) if isinstance(o, (tuple, list, dict)) else [(name, o)]
    return leaves


def primary_output(out: Any) -> Any:
    """The tensor metrics compare: the output itself, the first of a tuple/list, the first dict value,
    or a HuggingFace-style object's ``logits``."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out:
        return primary_output(out[0])
    if isinstance(out, dict) and out:
        return primary_output(out["logits"] if "logits" in out else next(iter(out.values())))
    logits = getattr(out, "logits", None)
    if logits is not None:
        return primary_output(logits)
    raise TypeError(f"model output of type {type(out).__name__} holds no tensor")
