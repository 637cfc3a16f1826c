"""A causal language model's decoder as a graph with its KV cache as explicit tensors, laid out as
optimum (and onnxruntime-genai) lay it out: inputs ``input_ids`` [batch, sequence], ``attention_mask``
[batch, past + sequence], ``position_ids`` [batch, sequence] and, per layer ``N``,
``past_key_values.N.key`` / ``.value`` [batch, kv_heads, past, head_dim]; outputs ``logits``
[batch, sequence, vocab] and ``present.N.key`` / ``.value`` [batch, kv_heads, past + sequence,
head_dim]. One graph serves prefill (past of length 0) and decode (sequence 1).

:class:`KVStep` wraps the transformers model: it fills a ``DynamicCache`` with the past tensors and
calls the model's own ``forward`` (its attention, masks and rotary embeddings, nothing rewritten),
returning the logits and the grown cache as tensors. :func:`capture` exports it with ``torch.export``
and dynamic batch, sequence and past dimensions.

**Sizes 0 and 1.** torch.export traces a dimension as a symbol only when its example size is at least
2 (0 and 1 are specialized), so the program is traced with a sequence and a past of at least 2 (the
dimensions ``Dim.AUTO``: the solver finds that the mask spans past + sequence), which puts ``[2, ...]``
into its range constraints. What the trace decided for sizes >= 2 holds at 0 and 1
for these decoders (no broadcast or squeeze turns on a sequence or past dimension: the branches
transformers takes on ``q_len == 1`` are shortcuts whose general path is also exact), so the ranges are
widened to ``[1, ...]`` for the sequence and ``[0, ...]`` for the past after tracing, and every export
is then checked where it matters: the prefill runs with an empty past, every decode step with one
token, against transformers' own generation (``ptopt.export.lm``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ptopt.core.errors import UnsupportedModelError

#: the token inputs, before the cache tensors
TOKEN_INPUTS = ("input_ids", "attention_mask", "position_ids")
#: optimum's names for the symbolic dimensions
DIMS = {
    "batch": "batch_size",
    "sequence": "sequence_length",
    "past": "past_sequence_length",
    "total": "past_sequence_length + sequence_length",
}
#: the batch range exported when none is asked for
DEFAULT_BATCH = (1, 8)


def layout(config: Any) -> dict[str, int]:
    """Layers, key/value heads and head size of the model's cache (config names vary by family)."""
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    return {
        "layers": int(config.num_hidden_layers),
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or _falcon_kv_heads(config) or heads),
        "head_dim": int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        "vocab": int(config.vocab_size),
    }


def _falcon_kv_heads(config: Any) -> int | None:
    """Falcon's cached heads (transformers' ``FalconAttention``): all of them with the new decoder
    architecture (it repeats its key/value heads before caching), else one for multi-query attention,
    else ``num_kv_heads``; None for other families."""
    if getattr(config, "model_type", None) != "falcon":
        return None
    if config.new_decoder_architecture:
        return config.num_attention_heads
    return 1 if config.multi_query else config.num_kv_heads


def cache_shape(config: Any, past: int, batch: int = 1) -> tuple[int, int, int, int]:
    """One layer's key (or value) cache for ``past`` tokens."""
    lay = layout(config)
    return (batch, lay["kv_heads"], past, lay["head_dim"])


def io_names(layers: int, position_ids: bool = True) -> tuple[list[str], list[str]]:
    """The graph's input and output names (module docstring)."""
    kv = [(i, k) for i in range(layers) for k in ("key", "value")]
    inputs = list(TOKEN_INPUTS if position_ids else TOKEN_INPUTS[:2])
    return inputs + [f"past_key_values.{i}.{k}" for i, k in kv], ["logits"] + [
        f"present.{i}.{k}" for i, k in kv
    ]


def check_cache(model: Any) -> None:
    """UnsupportedModelError when the model's cache is not one full-attention key/value pair per layer:
    state-space / linear-attention layers (Mamba, its hybrids) keep fixed-size states, not keys and
    values, and are named as such; sliding-window layers keep only their last tokens."""
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    try:
        layers = tf.DynamicCache(config=model.config).layers
    except (TypeError, ValueError, AttributeError) as e:
        raise UnsupportedModelError(
            f"{type(model).__name__}: transformers builds no DynamicCache for it ({e}); ptopt exports "
            "decoders whose cache is one key/value pair per layer"
        ) from None
    kinds = {type(layer).__name__ for layer in layers}
    # transformers' state-space cache layers (LinearAttentionLayer and its hybrids with attention)
    state = sorted(k for k in kinds if "LinearAttention" in k)
    if state:
        raise UnsupportedModelError(
            f"{type(model).__name__} has state-space (recurrent) layers: its cache holds fixed-size "
            f"convolution and SSM states per layer ({', '.join(state)}), not the growing key/value pairs "
            "of attention, so ptopt's language-model export (onnx, openvino, exported_program, aoti), which "
            "lays out a KV cache as graph inputs and outputs, cannot take it, and no config.json setting "
            "changes that. Export a full-attention decoder instead (Llama, Qwen2, GPT-2, Phi, Gemma ...), "
            "or run this model with transformers as it is"
        )
    other = sorted(kinds - {"DynamicLayer"})
    if not other:
        _check_shapes(model)
    if other:
        sliding = all("SlidingWindow" in k for k in other)
        raise UnsupportedModelError(
            f"{type(model).__name__}: its cache has {', '.join(other)} layers"
            + (" (sliding-window attention: they keep only their last tokens)" if sliding else "")
            + ", not one growing key/value pair per layer; ptopt exports full-attention decoders (Llama, "
            "Qwen2, GPT-2, Phi, Gemma ...)" + (_sliding_advice(model.config) if sliding else "")
        )


def _check_shapes(model: Any) -> None:
    """UnsupportedModelError when the cache a forward of three tokens fills is not the layout read from
    the config (``cache_shape``): DeepSeek's multi-head latent attention caches keys and values of
    different head sizes over every head, which one ``[batch, kv_heads, seq, head_dim]`` cannot hold
    (torch.export then failed with 'Sizes of tensors must match'). A forward that fails says nothing here."""
    import torch

    want = list(cache_shape(model.config, 3))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
        layers = cache_of(out).layers
    except Exception:  # noqa: BLE001 - the capture says what fails in a forward
        return
    for i, layer in enumerate(layers):
        keys, values = list(layer.keys.shape), list(layer.values.shape)
        if keys != want or values != want:
            why = (
                "keys and values of different head sizes (multi-head latent attention, as DeepSeek's)"
                if keys[-1] != values[-1]
                else "a head count or size its config does not say"
            )
            raise UnsupportedModelError(
                f"{type(model).__name__}: its cache holds keys {keys} and values {values} for 3 tokens (layer "
                f"{i}) where ptopt's cache layout, one [batch, key/value heads, tokens, head size] read from "
                f"its config, is {want}: {why}; ptopt cannot export its cache"
            )


def _sliding_advice(config: Any) -> str:
    """What a user whose sequences stay under the window can change in config.json, where a change keeps
    what the model computes: ``sliding_window`` null, or (configs naming each layer's kind: GPT-OSS,
    Gemma 2; Llama 4's ``chunked_attention``) every such entry in ``layer_types`` made ``full_attention``.
    Not where the sliding layers have a rotary embedding of their own (Gemma 3's
    ``rope_parameters['sliding_attention']``): made full-attention layers they would take the other one
    and compute something else."""
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and isinstance(rope.get("sliding_attention"), dict):
        return (
            ". Its sliding-window layers have a rotary embedding of their own (rope_parameters"
            "['sliding_attention']): no config.json change turns them into full-attention layers that "
            "compute the same, so this model cannot be exported"
        )
    kinds = getattr(config, "layer_types", None) or ()
    for kind, span in (("sliding_attention", "window"), ("chunked_attention", "attention_chunk_size")):
        if kind in kinds:  # Llama 4's chunked layers: one chunk is full causal attention
            return (
                f'. A model whose sequences stay under its {span}: set every "{kind}" in layer_types to '
                '"full_attention" in a copy of config.json'
            )
    return (
        ". A sliding-window model whose sequences stay under its window: set sliding_window to null in a copy "
        "of config.json"
    )


def step_module(model: Any, position_ids: bool = True) -> Any:
    """:class:`KVStep` around ``model`` (the class is defined on first use: torch imports lazily)."""
    import torch

    from ptopt.core.hf import import_transformers
    from ptopt.core.lm import cache_keyword

    dynamic_cache = import_transformers().DynamicCache
    key = cache_keyword(model)

    class KVStep(torch.nn.Module):
        """``(input_ids, attention_mask[, position_ids], *past) -> (logits, *present)``."""

        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids: Any, attention_mask: Any, *rest: Any) -> tuple:
            pos, kv = (rest[0], rest[1:]) if position_ids else (None, rest)
            cache = dynamic_cache(config=self.m.config)
            for i, layer in enumerate(cache.layers):  # filled directly: update() would trace a cat of []
                layer.keys, layer.values, layer.is_initialized = kv[2 * i], kv[2 * i + 1], True
                layer.device, layer.dtype = kv[0].device, kv[0].dtype
            out = self.m(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=pos,
                use_cache=True,
                **{key: cache},
            )
            flat = [t for layer in cache_of(out).layers for t in (layer.keys, layer.values)]
            return (out.logits, *flat)

    return KVStep().eval()


@contextlib.contextmanager
def attention(model: Any, kind: str | None) -> Iterator[None]:
    """The model's attention implementation set to ``kind`` inside the block (None: left as it is)."""
    was = getattr(model.config, "_attn_implementation", None)
    if kind is None or was == kind or not callable(getattr(model, "set_attn_implementation", None)):
        yield
        return
    model.set_attn_implementation(kind)
    try:
        yield
    finally:
        model.set_attn_implementation(was)


def cache_of(out: Any) -> Any:
    """The cache a transformers model returned (``cache`` in 5.x, ``past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def example(config: Any, batch: int = 2, seq: int = 3, past: int = 5) -> tuple:
    """Seeded example inputs of the step (sizes >= 2 everywhere: module docstring)."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(1000, int(config.vocab_size)), (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq).expand(batch, -1).contiguous()
    kv = [
        torch.randn(cache_shape(config, past, batch), generator=g)
        for _ in range(2 * layout(config)["layers"])
    ]
    return (ids, mask, pos, *kv)


def capture(model: Any, batch: tuple[int, int], max_len: int, decode: bool = False) -> Any:
    """The step of ``model`` as an ExportedProgram: batch in ``batch``, sequence and past dynamic up to
    ``max_len`` positions, the ranges widened to sizes 1 / 0 (module docstring); ``decode``: the sequence
    fixed at one token (a decode step). UnsupportedModelError when torch.export cannot capture it."""
    import torch

    from ptopt.formats.capture import first_lines, quiet_export

    auto = torch.export.Dim.AUTO  # the solver infers the relations (total = past + sequence) itself
    lo, hi = batch
    b = auto if hi > 1 else None
    args = example(model.config, batch=2 if b is not None else 1, seq=1 if decode else 3)
    tok = {k: v for k, v in ((0, b), (1, None if decode else auto)) if v is not None} or None
    kv = {k: v for k, v in ((0, b), (2, auto)) if v is not None}
    mask = {k: v for k, v in ((0, b), (1, auto)) if v is not None}
    dynamic = {"input_ids": tok, "attention_mask": mask, "rest": (tok,) + (kv,) * (len(args) - 3)}
    try:
        with quiet_export(), torch.no_grad():
            program = torch.export.export(step_module(model), args, dynamic_shapes=dynamic, strict=False)
    except Exception as e:  # noqa: BLE001 - torch.export raises many kinds; the user gets one line
        raise UnsupportedModelError(
            f"torch.export cannot capture {type(model).__name__} with its KV cache as inputs "
            f"(torch {torch.__version__}): {type(e).__name__}: {first_lines(str(e), 2)}"
        ) from None
    # a batch range ending at 2 is kept open to 3 in the graph: traced at batch 2 (>= 2, module docstring),
    # a [1, 2] range becomes [2, 2] when the ONNX exporter re-traces the program, batch fixed at 2
    widen(program, (lo, 3) if hi == 2 else batch, max_len)
    return program


def widen(program: Any, batch: tuple[int, int], max_len: int) -> None:
    """The ranges of the program's symbols, in place: batch ``batch``, sequence and attention mask
    [1, max_len], past [0, max_len - 1] (module docstring: traced at sizes >= 2)."""
    from torch.utils._sympy.value_ranges import ValueRanges

    names = set(program.graph_signature.user_inputs)
    user = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]
    ranges: dict[str, tuple[int, int]] = {}
    for i, node in enumerate(user):  # input_ids, attention_mask, position_ids, then the past
        spots = {0: batch, 1: (1, max_len)} if i < len(TOKEN_INPUTS) else {0: batch, 2: (0, max_len - 1)}
        for dim, rng in spots.items():
            size = node.meta["val"].shape[dim]
            if not isinstance(size, int):
                ranges.setdefault(str(size.node.expr), rng)
    for sym in list(program.range_constraints):
        if str(sym) in ranges:
            program.range_constraints[sym] = ValueRanges(*ranges[str(sym)])
