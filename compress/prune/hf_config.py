"""The Hugging Face config of a structurally pruned model, so that the pruned model is still a
folder ``from_pretrained`` loads.

``from_pretrained`` rebuilds every layer from ``config.json``: a pruned model is a Hugging Face folder
only when its config can say its new sizes. :func:`pruned_config` sets the head counts
(``num_attention_heads``, ``num_key_value_heads``, ``n_head``...), the FFN width (``intermediate_size``,
``n_inner``, ``d_ff``, DistilBERT's ``hidden_dim``...), the hidden size (``hidden_size``, ``d_model``,
``dim``, ``n_embd``: the embedding tables' width) and ``head_dim`` (kept: the head size does not
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
FFN_KEYS = ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "encoder_ffn_dim", "hidden_dim",
            "shared_expert_intermediate_size")  # fmt: skip
#: config keys holding the hidden size (the embedding width, the residual stream)
HIDDEN_KEYS = ("hidden_size", "d_model", "dim", "n_embd", "embed_dim")


def is_hf_model(model: Any) -> bool:
    """A transformers ``PreTrainedModel`` (it has a config and ``save_pretrained``)."""
    return hasattr(model, "config") and hasattr(model, "save_pretrained") and hasattr(model.config, "to_dict")


def pruned_config(
    model: Any, heads: list[tuple[str, int, int, int]], layers: dict[str, tuple[int, int]]
) -> tuple[Any, list[str]]:
    """(the pruned ``model``'s config, what it cannot describe). ``heads``: (attention module, head size,
    old count, new count) of every split into heads; ``layers``: output channels (before, after) per
    layer. A text-and-image model (CLIP, SigLIP) states each tower's sizes in its own sub-config
    (``text_config`` for ``text_model``, ...): each is set from its tower's layers alone."""
    from ptopt.compress.prune import layers as L

    config = copy.deepcopy(model.config)
    tables = {n for n, m in model.named_modules() if L.kind(m) == "embedding"}
    if getattr(config, "n_inner", 0) is None and isinstance(getattr(config, "n_embd", None), int):
        config.n_inner = 4 * config.n_embd  # GPT-2's None means 4 x the hidden size, which may change
    parts = _parts(config)
    towers = tuple(prefix for _, _, prefix in parts)
    blockers = _set_sizes(
        config, [h for h in heads if not h[0].startswith(towers) or not towers],
        {n: v for n, v in layers.items() if not n.startswith(towers) or not towers}, tables,
    )  # fmt: skip
    for _, sub, prefix in parts:
        own = {n: v for n, v in layers.items() if n.startswith(prefix)}
        blockers += _set_sizes(sub, [h for h in heads if h[0].startswith(prefix)], own, tables)
    return config, blockers + mismatches(model, config)


def _parts(config: Any) -> list[tuple[str, Any, str]]:
    """(key, sub-config, module prefix) of each ``X_config`` that builds the module ``X_model``."""
    return [
        (key, value, key[: -len("_config")] + "_model.")
        for key, value in vars(config).items()
        if key.endswith("_config") and hasattr(value, "to_dict")
    ]


def _set_sizes(
    config: Any, heads: list[tuple[str, int, int, int]], layers: dict[str, tuple[int, int]], tables: set[str]
) -> list[str]:
    """Set ``config``'s head counts, FFN width, hidden size and head size from its layers; what differs
    between layers (one key cannot say it) is returned."""
    blockers: list[str] = []
    old_heads = _value(config, HEAD_KEYS)
    for keys, counts in (
        (HEAD_KEYS + KV_KEYS, {(old, new) for _, _, old, new in heads}),
        (FFN_KEYS, {size for n, size in layers.items() if n not in tables}),
        (HIDDEN_KEYS, {size for n, size in layers.items() if n in tables}),
    ):
        for key in keys:
            old = _value(config, key)
            if old is None:
                continue
            new = {after for before, after in counts if before == old and after != before}
            if keys is FFN_KEYS and not new:
                new = _glu_widths(old, counts)
            if len(new) > 1:
                blockers.append(f"{key}: {old} became {', '.join(map(str, sorted(new)))} in different layers")
            elif new:
                setattr(config, key, new.pop())
    size = next((s for _, s, old, new in heads if old != new and old == old_heads), None)
    if size is not None and getattr(config, "head_dim", None) in (None, size):
        config.head_dim = size  # the head size stays; a config reading head_dim keeps it
    return blockers


def _glu_widths(old: int, counts: set[tuple[int, int]]) -> set[int]:
    """The new FFN widths when the FFN's input projection makes input and gate together (ModernBERT's
    ``Wi``: ``2 x intermediate_size`` outputs, chunked in two): half of each such layer's new width.
    Only asked when no layer of the config's width changed; the built model's shapes confirm it."""
    return {
        after // 2 for before, after in counts if before == 2 * old and after != before and after % 2 == 0
    }


def _value(config: Any, key: str | tuple[str, ...]) -> int | None:
    for k in (key,) if isinstance(key, str) else key:
        v = getattr(config, k, None)
        if k == "n_inner" and v is None and hasattr(config, "n_embd"):
            v = 4 * config.n_embd  # GPT-2: None means 4 x hidden
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def mismatches(model: Any, config: Any) -> list[str]:
    """What differs between ``model`` and the model ``config`` builds (built on the meta device), or
    why it cannot be built; [] when the config describes the model."""
    fresh = _build(model, config)
    if isinstance(fresh, str):
        return [fresh]
    return list(_differences(model, config, fresh).values())


def _build(model: Any, config: Any) -> Any:
    """The model ``config`` builds, on the meta device (no memory), or why it cannot be built."""
    import torch

    try:
        with torch.device("meta"):
            fresh = type(model)(config)
    except Exception as e:  # noqa: BLE001 - a config the model class refuses
        return f"{type(model).__name__} cannot be built from the pruned config ({type(e).__name__}: {e})"
    try:  # transformers 5 validates the config in save_pretrained (hidden size a multiple of the heads)
        getattr(config, "validate", lambda: None)()
    except Exception as e:  # noqa: BLE001 - a config its own validators refuse
        return f"{type(config).__name__} refuses the pruned sizes ({e.__cause__ or e})"
    return fresh


def _differences(model: Any, config: Any, fresh: Any) -> dict[str, str]:
    want = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    return {
        k: f"{k} is {list(v.shape)} but {type(config).__name__} builds {list(want[k])}"
        for k, v in model.state_dict().items()
        if k in want and want[k] != tuple(v.shape)
    }


def unsaid_layers(model: Any, config: Any, changed: set[str]) -> list[str]:
    """Of the layers in ``changed`` with a tensor ``config`` builds in another shape, those whose output
    width it builds differently: the layers whose new size it cannot say. A layer whose inputs alone
    differ is not one of them (ALBERT's FFN reading a narrower hidden size: the layers making that
    hidden size are). All of them when none differs in its output width."""
    from ptopt.compress.prune import layers as L

    fresh = _build(model, config)
    if isinstance(fresh, str):
        return []
    named = sorted({key.rpartition(".")[0] for key in _differences(model, config, fresh)} & changed)
    outputs = [n for n in named if L.out_size(model.get_submodule(n)) != L.out_size(fresh.get_submodule(n))]
    return outputs or named


def describes(model: Any) -> bool:
    """Whether ``model.config`` builds a model of ``model``'s shapes."""
    return is_hf_model(model) and not mismatches(model, model.config)


def apply_config(model: Any, config: Any) -> list[str]:
    """Set on ``model.config`` (the object its modules share) and on its sub-configs (``text_config``
    ...: the objects their towers share) every key ``config`` changed; returns ``key: old → new``."""
    changed = _apply(model.config, config, "")
    for key, sub, _ in _parts(config):
        target = getattr(model.config, key, None)
        if target is not None:
            changed += _apply(target, sub, f"{key}.")
    return changed


def _apply(target: Any, config: Any, prefix: str) -> list[str]:
    changed = []
    old = target.to_dict()
    for key, value in config.to_dict().items():
        if key in old and old[key] != value and isinstance(value, (int, type(None))):
            setattr(target, key, value)
            changed.append(f"{prefix}{key}: {old[key]} → {value}")
    if getattr(config, "head_dim", None) is not None and getattr(target, "head_dim", None) is None:
        target.head_dim = config.head_dim
        changed.append(f"{prefix}head_dim: set to {config.head_dim}")
    return changed


class no_cache:
    """Run a Hugging Face causal LM without its key/value cache (``config.use_cache = False``): the
    graph and every comparison see tensors, not a cache object. Restored on exit."""

    def __init__(self, model: Any):
        self.config = getattr(model, "config", None)
        self.before = getattr(self.config, "use_cache", None)

    def __enter__(self) -> None:
        if self.before:
            self.config.use_cache = False

    def __exit__(self, *exc: Any) -> None:
        if self.before:
            self.config.use_cache = self.before


def write_folder(model: Any, folder: Any, source_dir: Any, example: Any) -> dict[str, Any]:
    """``save_pretrained`` of the pruned model into ``folder`` with the source folder's tokenizer and
    generation files; reloaded with ``from_pretrained`` and run on ``example`` to check that it is the
    same model. Returns the writer's facts."""
    import torch

    from ptopt.core.errors import UnsupportedModelError
    from ptopt.core.inputspec import call_model
    from ptopt.core.quiet import quiet_imports
    from ptopt.formats.hf import copy_companions

    bad = mismatches(model, model.config)
    if bad:
        raise UnsupportedModelError(
            f"the pruned model cannot be written as a Hugging Face folder: its config cannot describe it "
            f"({'; '.join(bad[:2])}); write .pt or .pt2, or prune with the output folder given up front "
            "(ptopt then keeps what the config cannot say)"
        )
    with quiet_imports():
        model.save_pretrained(str(folder), safe_serialization=True)
        back = type(model).from_pretrained(str(folder)).eval()
    files = copy_companions(source_dir, folder)
    with torch.no_grad(), no_cache(model), no_cache(back):
        a, b = _logits(call_model(model, example)), _logits(call_model(back, example))
    if a is not None and b is not None and not torch.allclose(a, b, atol=1e-5, rtol=1e-4):
        raise UnsupportedModelError(
            f"the Hugging Face folder {folder.name} does not load back as the pruned model "
            f"(max difference {float((a - b).abs().max()):.3g})"
        )
    return {"files": files, "format": "hf"}


def _logits(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    return None
