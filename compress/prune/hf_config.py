"""The Hugging Face config of a structurally pruned model, so that the pruned model is still a
folder ``from_pretrained`` loads.

``from_pretrained`` rebuilds every layer from ``config.json``: a pruned model is a Hugging Face folder
only when its config can say its new sizes. :func:`pruned_config` sets the head counts
(``num_attention_heads``, ``num_key_value_heads``, ``n_head``...), the FFN width (``intermediate_size``,
``n_inner``, ``d_ff``, DistilBERT's ``hidden_dim``...) and ``head_dim`` (kept: the head size does not
change) from what the pruning did, then builds the model of that config on the meta device (no
memory) and compares every tensor's shape with the pruned model's. What does not match is named:
a config that derives the head size from ``hidden_size / num_attention_heads`` (BERT, GPT-2) cannot
hold fewer heads, nor can any config hold a different FFN width per layer.
"""

from __future__ import annotations

import copy
from typing import Any

#: config keys holding a number of attention heads, of key/value heads, an FFN width, a head size
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads")
KV_KEYS = ("num_key_value_heads",)
FFN_KEYS = ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "encoder_ffn_dim", "hidden_dim")


def is_hf_model(model: Any) -> bool:
    """A transformers ``PreTrainedModel`` (it has a config and ``save_pretrained``)."""
    return hasattr(model, "config") and hasattr(model, "save_pretrained") and hasattr(model.config, "to_dict")


def pruned_config(
    model: Any, heads: list[tuple[int, int, int]], layers: dict[str, tuple[int, int]]
) -> tuple[Any, list[str]]:
    """(the pruned ``model``'s config, what it cannot describe). ``heads``: (head size, old count,
    new count) of every split into heads; ``layers``: output channels (before, after) per layer."""
    config = copy.deepcopy(model.config)
    blockers: list[str] = []
    for keys, counts in ((HEAD_KEYS + KV_KEYS, {(old, new) for _, old, new in heads}), (FFN_KEYS, set(layers.values()))):
        for key in keys:
            old = _value(config, key)
            if old is None:
                continue
            new = {after for before, after in counts if before == old and after != before}
            if len(new) > 1:
                blockers.append(f"{key}: {old} became {', '.join(map(str, sorted(new)))} in different layers")
            elif new:
                setattr(config, key, new.pop())
    size = next((s for s, old, new in heads if old != new and old == _value(model.config, HEAD_KEYS)), None)
    if size is not None and getattr(config, "head_dim", None) in (None, size):
        config.head_dim = size  # the head size stays; a config reading head_dim keeps it
    return config, blockers + mismatches(model, config)


def _value(config: Any, key: str | tuple[str, ...]) -> int | None:
    for k in (key,) if isinstance(key, str) else key:
        v = getattr(config, k, None)
        if k == "n_inner" and v is None and hasattr(config, "n_embd"):
            v = 4 * config.n_embd  # GPT-2: None means 4 x hidden
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def mismatches(model: Any, config: Any) -> list[str]:
    """Tensors whose shape in ``model`` differs from the model ``config`` builds (built on the meta
    device); [] when the config describes the model."""
    import torch

    try:
        with torch.device("meta"):
            fresh = type(model)(config)
    except Exception as e:  # noqa: BLE001 - a config the model class refuses
        return [f"{type(model).__name__} cannot be built from the pruned config ({type(e).__name__}: {e})"]
    want = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    out = []
    for k, v in model.state_dict().items():
        if k in want and want[k] != tuple(v.shape):
            out.append(f"{k} is {list(v.shape)} but {type(config).__name__} builds {list(want[k])}")
    return out


def describes(model: Any) -> bool:
    """Whether ``model.config`` builds a model of ``model``'s shapes."""
    return is_hf_model(model) and not mismatches(model, model.config)
