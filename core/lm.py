"""What every stage measures of a causal language model: perplexity on token ids (sliding window)
and the bytes its weights take in memory (quantized tensors counted by what they store); and how
weight-only int8 layers run in eager mode on the CPU (:func:`use_int8_kernel` for Linear layers,
:func:`use_int8_embedding` for an embedding reading the int8 matrix of a tied output layer). Both
compress (after quantizing) and formats (after loading a folder) call these; duck-typed on torchao's
``Int8Tensor`` (``qdata``, ``scale``, ``block_size``): core imports no torchao."""

from __future__ import annotations

import math
from typing import Any

from ptopt.core import progress

#: CPU flags under which ``aten._weight_int8pack_mm`` with bf16 activations beats an fp32 matmul at batch 1
#: (its vectorized path: AVX2 converts bf16 in registers, AVX512-BF16 / AMX multiply bf16 natively)
INT8_KERNEL_ISA = ("avx2", "avx512_bf16", "amx_bf16")
#: the window perplexity is scored with unless told otherwise (tokens of history, tokens per step)
CONTEXT = 512
STRIDE = 256
#: a compress command's perplexities (the sidecar's) read at most this many evaluation tokens (validate
#: reads them all)
EVAL_TOKENS = 8192


def eval_window(ids: Any) -> tuple[Any, int | None]:
    """The first ``EVAL_TOKENS`` of ``ids`` (what a compress command scores) and how many tokens they
    were cut from (None: all of them)."""
    n = int(ids.numel())
    return ids[:EVAL_TOKENS], (n if n > EVAL_TOKENS else None)


def scored_tokens(window: dict[str, Any]) -> str:
    """``8191 tokens`` (scored: each but the first), or ``the first 8192 of 22,376 tokens`` where the
    text was longer."""
    cut = window.get("of_tokens")
    return f"the first {window['tokens'] + 1} of {cut:,} tokens" if cut else f"{window['tokens']} tokens"


def perplexity(
    module: Any, ids: Any, context: int = CONTEXT, stride: int = STRIDE, what: str = "perplexity"
) -> dict[str, Any]:
    """exp(mean negative log-likelihood) of ``ids`` (1-D int64) under ``module``, scored as the
    transformers perplexity guide does: windows of at most ``context`` tokens moving by ``stride``,
    each token scored once, with the rest of its window as history (the first token has none and is
    not scored); ``context`` shrinks to what the model's positions cover. Returns ``perplexity``,
    ``nll`` (mean, nats), ``tokens`` (scored), ``context``, ``stride``. ``what``: the progress step's
    name (``ptopt.core.progress``: one line, a window count)."""
    import torch

    longest = max_positions(module)
    if longest is not None and context > longest:  # the model cannot see further back
        context, stride = longest, min(stride, longest)
    if context < 2 or not 0 < stride <= context:
        raise ValueError(f"need context >= 2 and 0 < stride <= context, got {context}, {stride}")
    n = int(ids.numel())
    total, scored, prev_end = 0.0, 0, 0
    windows = max(1, -(-(n - context) // stride) + 1) if n > context else 1
    shown = progress.step(f"{what} on {n} tokens", windows, "windows")
    keep = _keeps_logits(module)
    with torch.inference_mode(), shown as step:
        for begin in range(0, n - 1, stride):
            end = min(begin + context, n)
            window = ids[begin:end].unsqueeze(0)
            new = end - max(prev_end, begin + 1)  # tokens not scored by an earlier window
            # only the logits that score a new token (the output layer over the whole vocabulary is most of
            # a small model's work, and a window's first half was scored by the one before)
            extra = {"logits_to_keep": new + 1} if keep else {}
            logits = module(input_ids=window, use_cache=False, **extra).logits[0, :-1].float()
            target = window[0, 1:]
            nll = torch.nn.functional.cross_entropy(logits[-new:], target[-new:], reduction="sum")
            total, scored, prev_end = total + float(nll), scored + new, end
            step.advance()
            if end == n:
                break
    mean = total / scored
    return {"perplexity": math.exp(mean), "nll": mean, "tokens": scored, "context": context, "stride": stride}


def perplexity_change(reference: Any, model: Any, ids: Any, names: tuple[str, str]) -> dict[str, Any]:
    """:func:`perplexity` of ``reference`` and ``model`` on the same ``ids`` (``names``: the progress
    steps'): ``before``, ``after``, ``increase_pct`` (after over before, in %) and the ``window`` scored,
    what quantize and prune record."""
    before = perplexity(reference, ids, what=names[0])
    after = perplexity(model, ids, what=names[1])
    return {
        "window": {"context": before["context"], "stride": before["stride"], "tokens": before["tokens"]},
        "before": before["perplexity"],
        "after": after["perplexity"],
        "increase_pct": 100 * (after["perplexity"] / before["perplexity"] - 1),
    }


def _keeps_logits(module: Any) -> bool:
    """Whether ``module`` computes only its last N logits when told (transformers' ``logits_to_keep``)."""
    import inspect

    try:
        return "logits_to_keep" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError, AttributeError):  # not a Python forward (a runtime's session wrapper)
        return False


def max_positions(module: Any) -> int | None:
    """The longest sequence the model's position embeddings cover (None: not stated)."""
    config = getattr(module, "config", None)
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 1:
            return value
    return None


def _storage(t: Any) -> list[Any]:
    """The plain tensors ``t`` stores (a tensor subclass such as torchao's: its inner tensors)."""
    if hasattr(t, "__tensor_flatten__") and type(t).__name__ not in ("Tensor", "Parameter"):
        names, _ = t.__tensor_flatten__()
        out: list[Any] = []
        for name in names:
            inner = getattr(t, name, None)
            if inner is not None:
                out.extend(_storage(inner))
        return out
    return [t]


def stored_bytes(t: Any) -> int:
    """Bytes ``t`` stores: a quantized tensor subclass (torchao's int8 / int4) its inner tensors' bytes,
    not its logical elements times the float dtype it presents."""
    return sum(inner.numel() * inner.element_size() for inner in _storage(t))


def weight_bytes(module: Any) -> int:
    """Bytes of ``module``'s parameters and buffers as stored (shared storage counted once); a model
    run by another runtime (``formats.openvino_lm``) states its own as an int ``weight_bytes``."""
    stated = getattr(module, "weight_bytes", None)
    if isinstance(stated, int):
        return stated
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        for inner in _storage(t.data if type(t).__name__ == "Parameter" else t):
            key = (inner.untyped_storage().data_ptr(), inner.untyped_storage().nbytes())
            if key in seen:
                continue
            seen.add(key)
            total += inner.numel() * inner.element_size()
    return total


def expert_tensors(module: Any) -> dict[str, int]:
    """``{name: parameters}`` of ``module``'s fused expert tensors: the 3-D Parameters a mixture of
    experts keeps every expert's matrix in (transformers 5's ``mlp.experts.gate_up_proj`` / ``down_proj``),
    which no technique that works on Linear or Conv layers touches. A Conv1d's 3-D weight is not one, nor
    its weight norm's tensors (a ``ParametrizationList``'s: wav2vec2 / HuBERT's positional conv), nor a
    tensor of one row (a ViT's ``[1, 1, D]`` class token, its ``[1, N, D]`` position table): experts are
    two or more along the first dimension."""
    import torch

    out: dict[str, int] = {}
    for owner_name, owner in module.named_modules():
        if isinstance(owner, (torch.nn.modules.conv._ConvNd, torch.nn.Linear, torch.nn.Embedding)):
            continue
        if type(owner).__name__ == "ParametrizationList":
            continue
        for pname, p in owner.named_parameters(recurse=False):
            if p.dim() == 3 and p.shape[0] > 1 and p.dtype.is_floating_point:
                out[f"{owner_name}.{pname}" if owner_name else pname] = p.numel()
    return out


def pattern_summary(names: Any) -> str:
    """Names with their layer numbers as ``*``, each pattern once: ``model.layers.*.mlp.experts.down_proj``."""
    import re

    return ", ".join(dict.fromkeys(re.sub(r"\.\d+\.", ".*.", n) for n in names))


def cache_keyword(module: Any) -> str:
    """What the model's forward calls its KV cache: ``cache`` (transformers 5.x) or
    ``past_key_values`` (4.x, and models written for it)."""
    import inspect

    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def generation_speed(module: Any, prompt: Any, new_tokens: int) -> dict[str, float]:
    """One timed generation at batch 1 with the KV cache, greedy: the prompt's forward pass (prefill)
    and ``new_tokens - 1`` single-token steps after it (decode). Returns seconds and tokens/s of
    each. ``prompt``: 1-D int64 ids."""
    import time

    import torch

    ids = prompt.reshape(1, -1)
    key = cache_keyword(module)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = module(input_ids=ids, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            out = module(input_ids=nxt, use_cache=True, **{key: out[key]})
            nxt = out.logits[:, -1:].argmax(-1)
        t2 = time.perf_counter()
    steps = max(new_tokens - 1, 1)
    return {
        "prefill_s": t1 - t0,
        "decode_s": t2 - t1,
        "prefill_tokens_per_s": ids.shape[1] / (t1 - t0),
        "decode_tokens_per_s": steps / (t2 - t1) if t2 > t1 else float("inf"),
    }


def greedy_tokens(module: Any, ids: Any, new_tokens: int, eos_token_id: Any = None) -> list[int]:
    """Up to ``new_tokens`` token ids greedily generated after ``ids`` (1-D int64) with the KV cache, as
    :func:`generation_speed` runs them, stopping after an end-of-sequence id (``eos_token_id``: an int
    or a list of them). One sequence at a time (a stateful runtime holds one)."""
    return decode_tokens(module, ids, new_tokens, eos_token_id)


def decode_tokens(
    module: Any,
    ids: Any,
    new_tokens: int,
    eos_token_id: Any = None,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
) -> list[int]:
    """:func:`greedy_tokens` when ``temperature`` is 0; above 0, each token drawn from
    ``softmax(logits / temperature)`` by a generator seeded with ``seed`` (the same seed, prompt and
    model give the same tokens; None: a fresh seed each call)."""
    import torch

    stop = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]) - {None}
    key = cache_keyword(module)
    pick = _token_picker(temperature, seed)
    out_ids: list[int] = []
    with torch.inference_mode():
        out = module(input_ids=ids.reshape(1, -1), use_cache=True)
        for step in range(new_tokens):
            nxt = pick(out.logits[:, -1:])
            out_ids.append(int(nxt))
            if out_ids[-1] in stop or step == new_tokens - 1:
                break
            out = module(input_ids=nxt, use_cache=True, **{key: out[key]})
    return out_ids


def _token_picker(temperature: float, seed: int | None) -> Any:
    """``logits [1, 1, vocab] -> token [1, 1]``: the most likely one, or one sampled (``decode_tokens``)."""
    import torch

    if not temperature:
        return lambda logits: logits.argmax(-1)
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))

    def sample(logits: Any) -> Any:
        row = logits.reshape(-1).float().cpu()
        # the best logit subtracted first: a tiny temperature then gives 0 and -inf, never inf - inf
        probs = torch.softmax((row - row.max()) / float(temperature), -1)
        return torch.multinomial(probs, 1, generator=generator).reshape(1, 1).to(logits.device)

    return sample


def token_ids(ref: Any, vocab_size: int | None, tokenizer_dir: Any, name: str = "text data") -> Any:
    """``ref`` (text data, ``ptopt.core.text``) as 1-D token ids for a model of ``vocab_size``
    (None: unchecked): text is tokenized with the tokenizer saved in ``tokenizer_dir``; ids outside
    the vocabulary are a DataError. None stays None."""
    if ref is None:
        return None
    from ptopt.core.hf import load_tokenizer
    from ptopt.core.text import check_vocab, is_text_ref, read_token_ids

    tokenizer = load_tokenizer(tokenizer_dir) if is_text_ref(ref) else None
    ids = read_token_ids(ref, tokenizer, name=name)
    if vocab_size:
        check_vocab(ids, vocab_size, name)
    return ids


def interleaved_generation(modules: list[Any], prompt: Any, new_tokens: int, rounds: int) -> list[dict]:
    """:func:`generation_speed` of every module in shared rounds: each round one generation per
    module, the order rotating every round and reversed every other one (so each sees the same mix of
    the machine's states), after one warm-up round that is not kept. Returns, per module,
    ``{"decode": [tokens/s per round], "prefill": [...]}``."""
    out: list[dict[str, list[float]]] = [{"decode": [], "prefill": []} for _ in modules]
    n = len(modules)
    with progress.step(f"timing generation of {n} models", rounds + 1, "rounds (1 warm-up)") as step:
        for r in range(rounds + 1):
            order = [(i + r) % n for i in range(n)]
            for i in order[::-1] if r % 2 else order:
                speed = generation_speed(modules[i], prompt, new_tokens)
                if r:  # round 0 warms every model up
                    out[i]["decode"].append(speed["decode_tokens_per_s"])
                    out[i]["prefill"].append(speed["prefill_tokens_per_s"])
            step.advance()
    return out


def speed_summary(per_round: list[float]) -> dict[str, Any]:
    """The median of per-round tokens/s and their spread (IQR in % of the median, as validate's
    ``round_spread_pct``: ``ptopt.core.timing.round_spread``)."""
    import statistics

    from ptopt.core.timing import round_spread

    if not per_round:
        return {"median": None, "spread_pct": None}
    return {"median": statistics.median(per_round), "spread_pct": round_spread(list(per_round))}


def use_int8_kernel(model: Any) -> list[str]:
    """Route each Linear whose weight is torchao's per-row ``Int8Tensor`` (weight-only) through
    torch's CPU kernel ``aten._weight_int8pack_mm`` with bf16 activations; returns the layers routed
    (none on a CPU without AVX512-BF16 or AMX-BF16, where that kernel has no fast path).

    torchao 0.18's eager ``F.linear`` on an ``Int8Tensor`` converts the whole int8 matrix to the
    activation dtype on every call and multiplies in float (its fast path is ``torch.compile``): in
    eager mode int8 was slower than fp32 here. ``_weight_int8pack_mm`` with fp32 activations was ~10x
    slower than an fp32 matmul at batch 1, with bf16 activations faster than fp32 (an AVX512-BF16
    path): the input is rounded to bf16, the output returned in the input's dtype. The weight, its
    scales and the saved file are unchanged: only the module's ``forward`` is replaced, for CPU inputs.
    Duck-typed on the tensor (``qdata``, ``scale``, ``block_size``): core imports no torchao."""
    import types

    import torch

    from ptopt.core.system import cpu_info

    isa = cpu_info()["isa"]
    if not any(isa.get(f) for f in INT8_KERNEL_ISA):
        return []
    routed: list[str] = []
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if not isinstance(m, torch.nn.Linear) or type(w).__name__ != "Int8Tensor":
            continue
        if getattr(w, "act_quant_kwargs", None) is not None or w.qdata.dim() != 2:
            continue  # dynamic int8 activations: torchao's own path
        if list(w.block_size) != [1, w.qdata.shape[1]]:
            continue  # per-group scales: torchao's own path
        if w.qdata.data_ptr() % 64 or not w.qdata.is_contiguous():
            w.qdata = (
                w.qdata.contiguous().clone()
            )  # the kernel reads aligned rows (a safetensors map need not be)
        m._ptopt_int8_scale = w.scale.reshape(-1).to(torch.bfloat16).contiguous()
        m.forward = types.MethodType(_int8_forward, m)
        routed.append(name)
    return routed


def _int8_forward(self: Any, x: Any) -> Any:
    import torch

    w = self.weight
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return torch.nn.functional.linear(x, w, self.bias)
    if w.act_pre_scale is not None:  # AWQ's activation scales
        x = x * w.act_pre_scale
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
    y = torch.ops.aten._weight_int8pack_mm(flat, w.qdata, self._ptopt_int8_scale)
    y = y.to(x.dtype).reshape(*x.shape[:-1], w.qdata.shape[0])
    return y + self.bias if self.bias is not None else y


def use_int8_embedding(model: Any) -> list[str]:
    """Route each ``nn.Embedding`` whose weight is torchao's ``Int8Tensor`` (the int8 matrix it shares
    with a tied output layer: ``ptopt quantize --mode weight-only --bits 8``) through
    :func:`int8_rows`, which gathers the int8 rows of the ids and multiplies them by their scales;
    returns the embeddings routed. torchao 0.18's embedding on an ``Int8Tensor`` dequantizes the whole
    table on every call (49152 x 576 floats per decode step for SmolLM2). Any CPU: no kernel is
    involved. The weight and the saved file are unchanged: only the module's ``forward`` is replaced."""
    import types

    import torch

    routed: list[str] = []
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if type(m) is not torch.nn.Embedding or type(w).__name__ != "Int8Tensor":
            continue  # a subclass (Gemma's scaled embedding) does more than look rows up
        if m.max_norm is not None or w.qdata.dim() != 2:
            continue  # max_norm rewrites the rows it reads: torchao's own path
        m.forward = types.MethodType(_int8_embedding_forward, m)
        routed.append(name)
    return routed


def int8_rows(weight: Any, ids: Any) -> Any:
    """The rows ``ids`` of an ``Int8Tensor`` ``weight`` in its float dtype, what
    ``weight.dequantize()[ids]`` gives without converting the other rows: ``(q - zero) * scale`` with
    a scale per row, or per group of ``block_size[-1]`` columns; times AWQ's ``act_pre_scale`` (its
    input scales, folded into the matrix) when set."""
    rows, width = weight.qdata.shape[0], int(weight.block_size[-1])
    q = weight.qdata[ids].unflatten(-1, (-1, width)).to(weight.dtype)  # [..., groups, width]
    if weight.zero_point is not None:
        q = q - weight.zero_point.reshape(rows, -1)[ids].unsqueeze(-1).to(q.dtype)
    out = (q * weight.scale.reshape(rows, -1)[ids].unsqueeze(-1)).flatten(-2).to(weight.dtype)
    return out * weight.act_pre_scale.to(out.dtype) if weight.act_pre_scale is not None else out


def _int8_embedding_forward(self: Any, ids: Any) -> Any:
    return int8_rows(self.weight, ids)
