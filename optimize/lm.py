"""``ptopt optimize`` for causal language models: the fastest decode within a perplexity budget.

The candidates are the model as it is (fp32), bf16 (where the CPU has bf16 kernels), and the
weight-only rows of the quantization table (``quantize --mode weight-only``): int8, and int4 per
group size and method (rtn, hqq; awq and gptq when calibration text is given), run by torch; and
NNCF's int8 / int4 weights run by OpenVINO with the KV cache as plugin state (``--engine openvino``,
``ptopt.formats.openvino_lm``; with ``ptopt[openvino]`` installed). Each is built in memory, its
perplexity measured on the *choice* half of the evaluation text; those within
``max_perplexity_increase`` % of fp32's are timed in shared interleaved rounds (one greedy
generation at batch 1 with the KV cache per candidate and round: prefill and decode tokens/s); the
fastest decode among them wins (the median of its per-round decode speedup over fp32: paired
rounds). Every kept candidate's perplexity is then measured on the *unseen* half, which neither the
budget check nor the choice read: that is the headline figure. Calibration text must not overlap the
evaluation text.

``-o DIR`` gets ``report.json``, ``report.md`` and, when the winner is a quantized model,
``DIR/best`` (its weight-only folder, loadable by ``ptopt`` and, for torchao's int8,
``from_pretrained``; an OpenVINO folder by ``openvino.Core().read_model``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from ptopt.core.errors import UsageError
from ptopt.validate.noise import combined_spread

#: name -> the quantize options of the candidate (None: a float candidate); in the order tried
CATALOGUE: dict[str, dict[str, Any] | None] = {
    "fp32": None,
    "bf16": None,
    "int8-wo": {"bits": 8},
    "int8-wo-openvino": {"bits": 8, "engine": "openvino"},
    "int4-g128-openvino": {"bits": 4, "group_size": 128, "engine": "openvino"},
    "int4-g128-rtn": {"bits": 4, "group_size": 128, "method": "rtn"},
    "int4-g64-hqq": {"bits": 4, "group_size": 64, "method": "hqq"},
    "int4-g128-awq": {"bits": 4, "group_size": 128, "method": "awq"},
    "int4-g128-gptq": {"bits": 4, "group_size": 128, "method": "gptq"},
    "int4-g32-gptq": {"bits": 4, "group_size": 32, "method": "gptq"},
}
CALIBRATED = ("awq", "gptq")
#: why a row's group size is not the common 128 (printed under the table)
GROUP_WHY: dict[str, str] = {
    "int4-g64-hqq": "groups of 64, hqq's own default (its half-quadratic fit is tuned for them)",
    "int4-g32-gptq": "groups of 32, the finest and most accurate int4 row: the one left when g128 is past the "
    "budget or does not divide a layer's width (SmolLM2's 576)",
}


@dataclasses.dataclass
class LMCandidate:
    name: str
    status: str = "pending"  # kept | rejected | skipped | failed
    reason: str = ""
    build_s: float | None = None
    module: Any = None
    result: Any = None
    weight_bytes: int | None = None
    perplexity: float | None = None  # on the choice half
    perplexity_unseen: float | None = None
    decode: list[float] = dataclasses.field(default_factory=list)
    prefill: list[float] = dataclasses.field(default_factory=list)

    def row(self, base: LMCandidate) -> dict[str, Any]:
        from ptopt.core.lm import speed_summary

        med = statistics.median(self.decode) if self.decode else None
        base_med = statistics.median(base.decode) if base.decode else None
        pct = lambda p, b: None if p is None or b is None else 100 * (p / b - 1)  # noqa: E731
        speedup = paired_speedup(self.decode, base.decode) if med and base_med else None
        spread, base_spread = (
            speed_summary(self.decode)["spread_pct"],
            speed_summary(base.decode)["spread_pct"],
        )
        return {
            "name": self.name, "status": self.status, "reason": self.reason, "build_s": self.build_s,
            "weight_bytes": self.weight_bytes, "perplexity_choice": self.perplexity,
            "perplexity_unseen": self.perplexity_unseen,
            "increase_pct_choice": pct(self.perplexity, base.perplexity),
            "increase_pct_unseen": pct(self.perplexity_unseen, base.perplexity_unseen),
            "decode_tokens_per_s": med, "decode_spread_pct": spread,
            "prefill_tokens_per_s": statistics.median(self.prefill) if self.prefill else None,
            "decode_speedup": speedup,
            "decode_noise": decode_noise(speedup, spread, base_spread, self is base),
        }  # fmt: skip


def paired_speedup(decode: list[float], base: list[float]) -> float:
    """The median over rounds of a candidate's decode tokens/s divided by the reference's in the same
    round: each round times every candidate back to back, so the ratio cancels the machine's drift
    between rounds, which moves the absolute medians of near-tied candidates past each other."""
    return statistics.median(d / b for d, b in zip(decode, base, strict=True))


def decode_noise(
    speedup: float | None, spread: float | None, base_spread: float | None, ref: bool
) -> str | None:
    """The one timing verdict of a candidate's decode (``ptopt.validate.noise``, as validate's LM rows):
    ``"spread"`` when its rounds spread more than the rule allows, ``"within"`` when its speedup over
    fp32 is within the combined spread of the two (not for fp32 itself), else None (stable)."""
    from ptopt.validate.noise import latency_noisy, speedup_noisy

    if latency_noisy(spread):
        return "spread"
    if not ref and speedup is not None and speedup_noisy(speedup, spread, base_spread):
        return "within"
    return None


@dataclasses.dataclass
class LMOptimizeResult:
    """What the search found: ``report`` (JSON-ready), the winner's name and its model."""

    report: dict[str, Any]
    winner: LMCandidate | None
    directory: Path | None = None

    @property
    def model(self) -> Any:
        return self.winner.module if self.winner is not None else None

    @property
    def exit_code(self) -> int:
        return 0 if self.winner is not None else 1


def bf16_flags() -> list[str]:
    """The CPU flags that make bf16 matrix products fast (empty: none here)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]


def _texts(loaded: Any, eval_data: Any, calib_data: Any) -> tuple[Any, Any, Any]:
    """(choice ids, unseen ids, calibration ids or None): the evaluation text in two halves."""
    from ptopt.core.lm import token_ids

    vocab, folder = getattr(loaded.module.config, "vocab_size", None), loaded.info.get("hf_dir")
    evald = token_ids(eval_data, vocab, folder, "evaluation text")
    calib = token_ids(calib_data, vocab, folder, "calibration text")
    if evald.numel() < 64:
        raise UsageError(
            f"--eval-data holds {evald.numel()} tokens; the search needs at least 64 (two halves)"
        )
    half = evald.numel() // 2
    return evald[:half], evald[half:], calib


def _build(cand: LMCandidate, loaded: Any, calib: Any) -> None:
    """Make the candidate's model in memory (quantize rows through ``ptopt.quantize``)."""
    import torch

    from ptopt.compress.quantize import quantize

    options = CATALOGUE[cand.name]
    if cand.name == "fp32":
        cand.module = loaded.module
    elif cand.name == "bf16":
        cand.module = copy.deepcopy(loaded.module).to(torch.bfloat16)
    else:
        fitted = options.get("method") in CALIBRATED  # rtn and hqq read none: no "--calib-data unused" note
        calib_data = calib if fitted else None
        cand.result = quantize(loaded, "weight-only", calib_data=calib_data, progress=None, **options)
        cand.module = cand.result.model


def _skip_reason(name: str, calib: Any, bf16: list[str]) -> str:
    options = CATALOGUE[name]
    if name == "bf16" and not bf16:
        return "this CPU has no bf16 kernels (needs avx512_bf16 or amx_bf16)"
    if options and options.get("method") in CALIBRATED and calib is None:
        return f"{options['method']} is fitted on text: pass --calib-data"
    if options and options.get("engine") == "openvino":
        import importlib.util

        missing = [m for m in ("openvino", "nncf") if importlib.util.find_spec(m) is None]
        if missing:
            return f"needs {' and '.join(missing)}: pip install 'ptopt[openvino]'"
    return ""


def _evaluate(
    cands: list[LMCandidate], loaded: Any, texts: tuple, budget: float, clock: Any, say: Any
) -> None:
    """Build each candidate and judge it on the choice half (fp32 first: the reference)."""
    from ptopt.core.lm import perplexity, weight_bytes
    from ptopt.core.search import catalogue

    choice, _, calib = texts
    bf16 = bf16_flags()

    def skipped(cand: LMCandidate, why: str) -> None:
        cand.status, cand.reason = "skipped", why
        say(f"  {cand.name}: skipped: {why}")

    def run(cand: LMCandidate) -> None:
        start = time.perf_counter()
        try:
            _build(cand, loaded, calib)
        except UsageError as e:
            cand.status, cand.reason = "failed", str(e)
            say(f"  {cand.name}: failed: {e}")
            return
        cand.build_s = time.perf_counter() - start
        cand.weight_bytes = weight_bytes(cand.module)
        cand.perplexity = perplexity(cand.module, choice)["perplexity"]
        increase = 100 * (cand.perplexity / cands[0].perplexity - 1)
        ok = cand.name == "fp32" or increase <= budget
        cand.status = "kept" if ok else "rejected"
        cand.reason = "" if ok else f"perplexity +{increase:.2f}% > +{budget:g}% on the choice half"
        say(f"  {cand.name}: perplexity {cand.perplexity:.3f} ({increase:+.2f}%), {cand.status}")

    catalogue(cands, lambda c: _skip_reason(c.name, calib, bf16) or clock(c), run, skipped)


def _time(kept: list[LMCandidate], prompt: Any, new_tokens: int, rounds: int, say: Any) -> dict[str, Any]:
    """Interleaved rounds, one generation per candidate a round, timed again on a busy machine
    (``validate.lm.timed_generation``, validate's own); returns the report's ``timing`` entry."""
    from ptopt.validate.lm import timed_generation

    speeds, timing = timed_generation([c.module for c in kept], prompt, new_tokens, rounds, say)
    for cand, speed in zip(kept, speeds, strict=True):
        cand.decode, cand.prefill = speed["decode"], speed["prefill"]
    return timing


def optimize_lm(
    model: Any,
    *,
    eval_data: Any,
    max_perplexity_increase: float,
    calib_data: Any = None,
    output: Any = None,
    candidates: Any = None,
    skip: Any = None,
    time_budget: float = 600.0,
    rounds: int = 5,
    generation: tuple[int, int] = (128, 32),
    allow_pickle: bool = False,
    progress: Any = None,
) -> LMOptimizeResult:
    """The search of the module docstring; ``model``: a Hugging Face folder, ``hf:DIR`` or a causal LM;
    ``generation``: the timed generation's prompt tokens and new tokens."""
    from ptopt.core.lm import perplexity

    say = progress if callable(progress) else (lambda msg: None)
    prompt_tokens, new_tokens = generation
    if max_perplexity_increase is None or max_perplexity_increase < 0:
        raise UsageError("--max-perplexity-increase must be a percentage >= 0")
    loaded = _load(model, allow_pickle)
    texts = _texts(loaded, eval_data, calib_data)
    cands = [LMCandidate(n) for n in _names(candidates, skip)]
    deadline = time.monotonic() + time_budget
    clock = lambda c: "" if time.monotonic() < deadline else "time budget spent"  # noqa: E731
    _evaluate(cands, loaded, texts, max_perplexity_increase, clock, say)
    kept = [c for c in cands if c.status == "kept"]
    say(
        f"timing {len(kept)} candidates: {rounds} interleaved rounds, {prompt_tokens}-token prompt, {new_tokens} new"
    )
    timing = _time(kept, texts[1][:prompt_tokens], new_tokens, rounds, say)
    say(f"perplexity of the {len(kept)} kept candidates on the unseen half ({texts[1].numel()} tokens)")
    for cand in kept:
        cand.perplexity_unseen = perplexity(cand.module, texts[1])["perplexity"]
    winner = _accepted(cands, kept, max_perplexity_increase)
    report = _report(
        cands, winner, loaded, texts, locals_of(max_perplexity_increase, rounds, prompt_tokens, new_tokens)
    )
    report["timing_noise"] = timing  # validate's name for it
    result = LMOptimizeResult(report, winner)
    if output is not None:
        result.directory = _write(result, Path(output))
    return result


def _accepted(cands: list[LMCandidate], kept: list[LMCandidate], budget: float) -> LMCandidate | None:
    """The fastest decode within the budget on the choice half (``ptopt.core.choice``), accepted on the
    unseen half (``ptopt.core.search.accept``): one whose perplexity there is past the budget is rejected
    and the next fastest chosen (fp32, the reference, always holds)."""
    from ptopt.core.choice import fastest_within
    from ptopt.core.search import accept

    ref = kept[0]

    def choose() -> LMCandidate | None:
        return fastest_within(
            cands, lambda c: 1 / paired_speedup(c.decode, ref.decode), lambda c: c.status == "kept"
        )[0]

    def holds_unseen(c: LMCandidate) -> bool:
        return c is ref or 100 * (c.perplexity_unseen / ref.perplexity_unseen - 1) <= budget

    def reject(c: LMCandidate) -> None:
        increase = 100 * (c.perplexity_unseen / ref.perplexity_unseen - 1)
        c.status, c.reason = "rejected", f"perplexity +{increase:.2f}% > +{budget:g}% on the unseen half"

    return accept(choose, holds_unseen, reject)[0]


def locals_of(budget: float, rounds: int, prompt: int, new: int) -> dict[str, Any]:
    """The report's settings; ``threads``: the torch threads every candidate was timed with (the search
    runs under ``optimize``'s ``--threads``)."""
    import torch

    return {
        "max_perplexity_increase_pct": budget,
        "rounds": rounds,
        "prompt_tokens": prompt,
        "new_tokens": new,
        "threads": torch.get_num_threads(),
    }


def _names(candidates: Any, skip: Any) -> list[str]:
    split = lambda v: [s.strip() for s in (v.split(",") if isinstance(v, str) else v or []) if s.strip()]  # noqa: E731
    wanted, dropped = split(candidates), split(skip)
    unknown = [n for n in wanted + dropped if n not in CATALOGUE]
    if unknown:
        raise UsageError(f"unknown candidate(s) {', '.join(unknown)} (known: {', '.join(CATALOGUE)})")
    names = [n for n in CATALOGUE if (not wanted or n in wanted) and n not in dropped]
    return ["fp32"] + [n for n in names if n != "fp32"]  # the reference always runs


def _load(model: Any, allow_pickle: bool) -> Any:
    from ptopt.core.hf import is_causal_lm
    from ptopt.core.modelref import as_loaded

    loaded = as_loaded(model, None, allow_pickle)
    if not is_causal_lm(loaded.module):
        raise UsageError(
            f"{loaded.ref} is not a causal language model (a transformers model with generate): "
            "--max-perplexity-increase searches language models; use --max-accuracy-drop or --min-cosine"
        )
    return loaded


def _report(cands: list, winner: Any, loaded: Any, texts: tuple, settings: dict) -> dict[str, Any]:
    from ptopt.core.lm import CONTEXT, STRIDE
    from ptopt.core.system import machine_summary

    rows = [c.row(cands[0]) for c in cands]
    return {
        "schema": "ptopt.optimize-lm/1",
        "model": loaded.ref,
        "winner": winner.name if winner is not None else None,
        "settings": settings | {"perplexity_context": CONTEXT, "perplexity_stride": STRIDE},
        "tokens": {"choice": int(texts[0].numel()), "unseen": int(texts[1].numel()),
                   "calibration": int(texts[2].numel()) if texts[2] is not None else 0},
        "candidates": rows,
        "machine": machine_summary(),
    }  # fmt: skip


def _write(result: LMOptimizeResult, directory: Path) -> Path:
    from ptopt.core.atomic import write_text_atomic

    directory.mkdir(parents=True, exist_ok=True)
    if result.winner is not None and result.winner.result is not None:
        result.winner.result.save(directory / "best")
        result.report["best"] = str(directory / "best")
    write_text_atomic(directory / "report.json", json.dumps(result.report, indent=2, default=str) + "\n")
    write_text_atomic(directory / "report.md", render_lm(result.report) + "\n")
    return directory


def render_lm(report: dict[str, Any]) -> str:
    """The report as a Markdown table (also what the CLI prints)."""
    from ptopt.validate.reports.common import machine_line

    s = report["settings"]
    lines = [
        f"# ptopt optimize (language model): {report['model']}",
        "",
        f"Budget: perplexity +{s['max_perplexity_increase_pct']:g}% over fp32 on the choice half "
        f"({report['tokens']['choice']} tokens); headline on the unseen half ({report['tokens']['unseen']} "
        f"tokens); context {s['perplexity_context']}, stride {s['perplexity_stride']}. Decode: batch 1, "
        f"KV cache, greedy, {s['prompt_tokens']}-token prompt, {s['new_tokens']} new tokens, "
        f"{s['rounds']} interleaved rounds (median).",
        "",
        f"Machine: {machine_line(report['machine'], s.get('threads'))}",
        "",
        "| candidate | status | ppl choice (+%) | ppl unseen (+%) | weight MB | decode tok/s (spread) "
        "| vs fp32 | prefill tok/s | reason |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["candidates"]:
        lines.append(_md_row(r, r["name"] == report["winner"]))
    notes = _noise_notes(report["candidates"])
    lines += [""] + notes if notes else []
    groups = [
        f"{n}: {why}" for n, why in GROUP_WHY.items() if any(r["name"] == n for r in report["candidates"])
    ]
    lines += ["", "Group sizes: " + "; ".join(groups) + "."] if groups else []
    t = report.get("timing_noise") or {}
    if t.get("busy"):
        lines += ["", f"The machine was busy: {t['noisy_cells']} of {t['cells']} decode timings noisy after "
                      f"{t['retimed']} more timing(s); the speeds above are not to be trusted."]  # fmt: skip
    lines += ["", f"Winner: {report['winner'] or 'none within the budget'}{_winner_caveat(report)}"]
    return "\n".join(lines)


def _noise_notes(rows: list[dict[str, Any]]) -> list[str]:
    """A footnote per candidate whose decode is marked (the noise rule, as validate's)."""
    from ptopt.validate.reports import common

    out = []
    for r in rows:
        if r.get("decode_noise") == "spread":
            out.append(common.spread_note(r["name"], 1, r["decode_spread_pct"]))
        elif r.get("decode_noise") == "within":
            ref = next((x for x in rows if x["name"] == "fp32"), {})
            both = combined_spread(r["decode_spread_pct"], ref.get("decode_spread_pct"))
            out.append(common.within_note(r["name"], 1, r["decode_speedup"], both))
    return out


def _winner_caveat(report: dict[str, Any]) -> str:
    """Why the winner's lead cannot be trusted, when the timing says so."""
    from ptopt.validate.reports.common import NOISY_MARK

    rows = {r["name"]: r for r in report["candidates"]}
    w = rows.get(report.get("winner") or "")
    if w is None or w["name"] == "fp32" or not w.get("decode_noise"):
        return ""
    why = (
        f"its own decode rounds spread {w['decode_spread_pct']:.0f}%"
        if w["decode_noise"] == "spread"
        else "its decode lead over fp32 is within the timing noise"
    )
    return (
        f" ({why} ({NOISY_MARK.strip()}): it is the smaller model within the budget; time it again on a quiet "
        "machine before calling it faster)"
    )


def _md_row(r: dict[str, Any], best: bool) -> str:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    ppl = lambda p, inc: "-" if p is None else f"{p:.3f} ({inc:+.2f}%)"  # noqa: E731
    from ptopt.validate.reports import common

    name = f"**{r['name']}**" if best else r["name"]
    spread = f" ({r['decode_spread_pct']:.0f}%)" if r["decode_spread_pct"] is not None else ""
    mb = r["weight_bytes"] / 1e6 if r["weight_bytes"] else None
    noise = r.get("decode_noise")
    rate = common.fmt_rate(r["decode_tokens_per_s"], noise == "spread")
    speedup = common.fmt_speedup(r["decode_speedup"], noise is not None, reference=r["name"] == "fp32")
    return (
        f"| {name} | {r['status']} | {ppl(r['perplexity_choice'], r['increase_pct_choice'])} "
        f"| {ppl(r['perplexity_unseen'], r['increase_pct_unseen'])} | {f(mb, '.1f')} "
        f"| {rate}{spread} | {speedup} | {f(r['prefill_tokens_per_s'], '.0f')} | {r['reason']} |"
    )
