"""The check every causal-LM export passes before anything is written where the user asked: the folder,
read back the way a user loads it, against transformers running the source model.

1. **Greedy generation**: transformers' ``generate`` (greedy, the KV cache, ``new_tokens`` new tokens, no
   early stop) and the artifact's greedy loop (its prefill with an empty past, then one token at a time)
   must produce the same tokens. When they part at a step where the source's two best logits are closer
   than the tolerance below (a tie either token answers), the check passes and says so
   (``near_tie``); any other difference is a ParityError.
2. **Logits, teacher-forced**: the artifact fed transformers' tokens, its first token alone (a one-token
   prompt: sequence 1, no past), the rest of the prompt as one chunk after it (a continuation: several
   tokens over a past of 1), then each generated token one at a time, against the source's logits at the
   same positions (one forward pass, no cache): ``max|diff| <= atol + rtol * max|logits|`` and the worst
   position's cosine >= the precision's minimum (``ptopt.export.parity``). With the greedy loop's prefill
   (the whole prompt, no past) this runs every kind of call a generation makes.
3. **A padded batch** (when the export takes batch 2 or more): two prompts, the second left-padded, one
   prefill and one decode step, against the source called with the same attention mask and positions;
   the real tokens' logits are compared under the same rule.
"""

from __future__ import annotations

from typing import Any

from ptopt.core.errors import ParityError

#: left padding of the batched check's second row
PAD = 3


def greedy_reference(source: Any, prompt: Any, new_tokens: int) -> Any:
    """transformers' greedy generation of ``new_tokens`` tokens after ``prompt`` ([1, P]): [1, P + N].

    No token stops it and nothing bends the logits: it runs with a fresh generation config, not the
    model's (``generate`` fills what a given config leaves unset from the model's own, which may ship a
    repetition penalty, Qwen2.5-Instruct's, or suppressed tokens), with no end-of-sequence id
    (``min_new_tokens`` would instead forbid it, so a model whose greedy choice was its end-of-sequence
    token got another reference token than the artifact's greedy loop)."""
    import torch

    from ptopt.core.hf import import_transformers
    from ptopt.core.quiet import silenced

    fresh = import_transformers().GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, num_beams=1, eos_token_id=[], pad_token_id=_pad_id(source)
    )
    was = source.generation_config
    source.generation_config = fresh
    try:
        with torch.inference_mode(), silenced(["transformers"]):
            out = source.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=fresh)
    finally:
        source.generation_config = was
    if out.shape[1] != prompt.shape[1] + new_tokens:  # pragma: no cover - a transformers that stops anyway
        raise RuntimeError(f"transformers generated {out.shape[1] - prompt.shape[1]} of {new_tokens} tokens")
    return out


def _pad_id(source: Any) -> int:
    eos = getattr(source.generation_config, "eos_token_id", None) or getattr(
        source.config, "eos_token_id", None
    )
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    return int(eos) if isinstance(eos, int) else 0


def _teacher_forced(model: Any, ids: Any, prompt_len: int) -> Any:
    """The artifact's logits at every position of ``ids`` but the last (check 2 of the module docstring):
    the first token alone, the rest of the prompt as one chunk, then one token per step, each call from
    the previous one's cache."""
    import torch

    out = model(input_ids=ids[:, :1], use_cache=True)
    rows = [out.logits]
    out = model(input_ids=ids[:, 1:prompt_len], use_cache=True, past_key_values=out.past_key_values)
    rows.append(out.logits)
    for i in range(prompt_len, ids.shape[1] - 1):
        out = model(input_ids=ids[:, i : i + 1], use_cache=True, past_key_values=out.past_key_values)
        rows.append(out.logits)
    return torch.cat(rows, dim=1).float()


def _compare(ref: Any, got: Any, atol: float, rtol: float, min_cosine: float) -> dict[str, Any]:
    """The parity rule on two ``[..., vocab]`` logits tensors; cosine per position."""
    import torch

    ref, got = ref.reshape(-1, ref.shape[-1]).float(), got.reshape(-1, got.shape[-1]).float()
    diff = float((ref - got).abs().max())
    scale = float(ref.abs().max())
    cosine = float(torch.nn.functional.cosine_similarity(ref, got, dim=-1).min())
    passed = diff <= atol + rtol * scale and cosine >= min_cosine
    return {"max_abs_diff": diff, "rel_error": diff / scale if scale else 0.0, "cosine": cosine, "atol": atol,
            "rtol": rtol, "min_cosine": min_cosine, "passed": passed, "positions": int(ref.shape[0])}  # fmt: skip


def _padded_batch(source: Any, model: Any, prompt: Any, rule: tuple) -> dict[str, Any]:
    """Check 3 of the module docstring."""
    import torch

    from ptopt.core.lm import cache_keyword
    from ptopt.formats.lm_graph import cache_of

    key = cache_keyword(source)
    ids = torch.stack([prompt[0], torch.cat([prompt.new_zeros(PAD), prompt[0, PAD:]])])
    mask = torch.ones_like(ids)
    mask[1, :PAD] = 0
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    nxt = ids[:, -1:].flip(0)
    with torch.inference_mode():
        want = source(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        mask2 = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
        step = source(input_ids=nxt, attention_mask=mask2, position_ids=pos[:, -1:] + 1, use_cache=True,
                      **{key: cache_of(want)})  # fmt: skip
        got = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        got2 = model(input_ids=nxt, attention_mask=mask2, use_cache=True, past_key_values=got.past_key_values)
    real = mask.bool()
    ref = torch.cat([want.logits[real], step.logits[:, -1]])
    mine = torch.cat([got.logits[real], got2.logits[:, -1]])
    return _compare(ref, mine, *rule)


def check_lm(
    source: Any, model: Any, prompt: Any, new_tokens: int, rule: tuple, batched: bool
) -> dict[str, Any]:
    """The checks of the module docstring: ``source`` (transformers) against ``model`` (the folder read
    back), ``prompt`` 1-D ids, ``rule`` (atol, rtol, min cosine). Returns ``{"greedy": ..., "parity": ...,
    "batch": ...}``; ParityError when a check fails."""
    import torch

    prompt = prompt.reshape(1, -1)
    ref_ids = greedy_reference(source, prompt, new_tokens)
    with torch.inference_mode():
        got_ids = model.generate(prompt, new_tokens)
        ref_logits = source(input_ids=ref_ids, use_cache=False).logits[:, :-1].float()
        got_logits = _teacher_forced(model, ref_ids, prompt.shape[1])
    parity = _compare(ref_logits, got_logits, *rule)
    greedy = _greedy(ref_ids, got_ids, ref_logits[:, prompt.shape[1] - 1 :], prompt.shape[1], parity)
    out = {"greedy": greedy, "parity": parity}
    if batched and prompt.shape[1] > PAD + 1:
        out["batch"] = _padded_batch(source, model, prompt, rule)
    _judge(out)
    return out


def _greedy(ref_ids: Any, got_ids: Any, ref_logits: Any, prompt_len: int, parity: dict) -> dict[str, Any]:
    new_ref, new_got = ref_ids[0, prompt_len:], got_ids[0, prompt_len:]
    same = new_ref == new_got
    first = None if bool(same.all()) else int((~same).nonzero()[0, 0])
    record = {"new_tokens": int(new_ref.numel()), "prompt_tokens": prompt_len, "equal": first is None,
              "first_difference": first, "tokens": new_ref.tolist()}  # fmt: skip
    if first is not None:
        top2 = ref_logits[0, first].topk(2).values
        gap = float(top2[0] - top2[1])
        record |= {
            "top2_gap": gap,
            "near_tie": gap <= parity["atol"] + parity["rtol"] * float(ref_logits.abs().max()),
        }
    return record


def _judge(out: dict[str, Any]) -> None:
    p, g = out["parity"], out["greedy"]
    if not p["passed"]:
        raise ParityError(
            f"the exported decoder's logits drift from transformers': max abs diff {p['max_abs_diff']:.3g} "
            f"(rel {p['rel_error']:.3g}), worst cosine {p['cosine']:.6f} over {p['positions']} positions "
            f"(rule: atol {p['atol']:g} + rtol {p['rtol']:g} x max|logits|, cosine >= {p['min_cosine']:g})"
        )
    if not g["equal"] and not g.get("near_tie"):
        raise ParityError(
            f"greedy generation differs from transformers' at new token {g['first_difference']} of "
            f"{g['new_tokens']} (the source's two best logits {g['top2_gap']:.3g} apart)"
        )
    b = out.get("batch")
    if b is not None and not b["passed"]:
        raise ParityError(
            f"the exported decoder differs from transformers on a left-padded batch of 2: max abs diff "
            f"{b['max_abs_diff']:.3g}, worst cosine {b['cosine']:.6f} (rule: atol {b['atol']:g} + rtol "
            f"{b['rtol']:g} x max|logits|): check the attention mask and position handling"
        )
