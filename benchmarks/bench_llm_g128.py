"""int4 with groups of 128 on a language model trained here (issue 28's g128 targets): TinyGPT.

Issue 28 asks for int4 g128 within +10% perplexity with round-to-nearest, and a method that at least
halves RTN's increase, "on the real LM". SmolLM2-135M (``bench_llm.py``) cannot answer it: hidden 576
is not a multiple of 128 (g128 is refused) and its weights come from a Q4_1 GGUF (already 4-bit,
groups of 32), which distorts every int4 figure at other group sizes. No LM with 128-divisible
widths and real float weights ships in a package here, so, as the issue allows, this benchmark
**trains one** (``benchmarks/tinygpt.py``: a 4-layer Llama-style model, hidden 256, MLP 768, byte-level
BPE of 2,048 tokens, trained from random initialization for 1,000 AdamW steps (2M tokens) on the Python
standard library's docstrings, on this CPU, seeded and cached; not a pretrained model). Its fp32
perplexity is printed first: the int4 comparisons are relative to it.

Text: perplexity on all of ``builtin:pydoc-text:eval`` (context 256, the model's own, stride 128);
AWQ/GPTQ calibrated on ``builtin:pydoc-text:calib``. Neither split shares a 12-word run with the
training text (``tinygpt.training_text`` drops the few docstrings that did).

In one process: fp32 and bf16 eager; ptopt through its public API, as the CLI runs it
(``ptopt.quantize("hf:DIR", "weight-only", out, bits=..., group_size=128, method=...)``, then
``ptopt.load_model(out)``): int8 (per channel), int4 g128 rtn, hqq, awq, gptq. Each is built and
its perplexity measured (nice 5), then all are timed in the same interleaved rounds as
``bench_llm.py`` (its ``time_all``: one greedy generation per candidate and round at batch 1 with
the KV cache, a 64-token prefill then NEW decoded tokens), under the benchmark lock.

    python benchmarks/bench_llm_g128.py --lock /tmp/ptopt-bench.lock           # results/llm_g128.md + .json
    python benchmarks/bench_llm_g128.py --lock /tmp/ptopt-bench.lock --quick   # fewer rounds
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
#: OpenMP threads sleep while waiting (before torch starts them): on 2 shared cores, spinning threads made
#: this model's forward pass 10-30x slower; every candidate runs under the same policy
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bench_llm import _dir_bytes, time_all, timing_lock  # noqa: E402
from bench_llm import summarize as bench_llm_summarize  # noqa: E402
from common import md_table, setup, write_result  # noqa: E402
from tinygpt import PPL_CONTEXT, PPL_STRIDE, info, tinygpt_dir, unigram_perplexity  # noqa: E402

CALIB = "builtin:pydoc-text:calib"
EVAL = "builtin:pydoc-text:eval"
TARGETS = {"int8_ppl_pct": 1.0, "int4_g128_rtn_ppl_pct": 10.0, "halves": 0.5}
PTOPT = {
    "ptopt int8": {"bits": 8},
    "ptopt int4 g128 rtn": {"bits": 4, "group_size": 128, "method": "rtn"},
    "ptopt int4 g128 hqq": {"bits": 4, "group_size": 128, "method": "hqq"},
    "ptopt int4 g128 awq": {"bits": 4, "group_size": 128, "method": "awq"},
    "ptopt int4 g128 gptq": {"bits": 4, "group_size": 128, "method": "gptq"},
}
RTN = "ptopt int4 g128 rtn"


def build(model_dir: Path, work: Path, names: list[str]) -> dict[str, dict]:
    """Each ptopt candidate through the public API, written to a folder and loaded back."""
    import ptopt

    out: dict[str, dict] = {}
    for name in names:
        opts = PTOPT[name]
        folder = work / name.replace(" ", "-")
        calib = CALIB if opts.get("method") in ("awq", "gptq") else None
        t0 = time.perf_counter()
        res = ptopt.quantize(f"hf:{model_dir}", "weight-only", folder, calib_data=calib, **opts)
        build_s = time.perf_counter() - t0
        rec = res.extra["weight_only"]
        out[name] = {"module": ptopt.load_model(folder).module, "file_bytes": _dir_bytes(folder),
                     "build_s": build_s, "calibration": rec.get("calibration"),
                     "quantized": len(rec["quantized_layers"]), "float_layers": rec["float_layers"]}  # fmt: skip
        print(f"{name}: built in {build_s:.0f} s", flush=True)
    return out


def measure(entries: dict[str, dict], ids: Any) -> None:
    from ptopt.core.lm import perplexity, weight_bytes

    for name, e in entries.items():
        p = perplexity(e["module"], ids, PPL_CONTEXT, PPL_STRIDE)
        e["perplexity"], e["nll"], e["weight_bytes"] = p["perplexity"], p["nll"], weight_bytes(e["module"])
        print(f"{name}: perplexity {e['perplexity']:.3f}", flush=True)


def summarize(entries: dict[str, dict]) -> list[dict]:
    """bench_llm's rows (ratios against fp32 eager in the same rounds), with each build's time and
    calibration."""
    rows = bench_llm_summarize(entries)
    for r in rows:
        r["build_s"], r["calibration"] = (
            entries[r["name"]].get("build_s"),
            entries[r["name"]].get("calibration"),
        )
    return rows


def verdicts(rows: list[dict]) -> list[dict]:
    """Issue 28's targets at g128, computed from the rows (never written by hand)."""
    by = {r["name"]: r for r in rows}
    t = TARGETS
    out = []

    def add(target: str, value: str | None, ok: bool | None) -> None:
        out.append({"target": target, "measured": value,
                    "verdict": {True: "met", False: "NOT met", None: "not measured"}[ok]})  # fmt: skip

    i8 = by.get("ptopt int8")
    add(f"int8 perplexity within +{t['int8_ppl_pct']:g}%", i8 and f"{i8['increase_pct']:+.2f}%",
        i8 and i8["increase_pct"] <= t["int8_ppl_pct"])  # fmt: skip
    rtn = by.get(RTN)
    add(f"int4 g128 rtn within +{t['int4_g128_rtn_ppl_pct']:g}%", rtn and f"{rtn['increase_pct']:+.2f}%",
        rtn and rtn["increase_pct"] <= t["int4_g128_rtn_ppl_pct"])  # fmt: skip
    others = [r for n, r in by.items() if n.startswith("ptopt int4 g128") and n != RTN]
    best = min(others, key=lambda r: r["increase_pct"], default=None)
    ok = None if best is None or rtn is None else best["increase_pct"] <= rtn["increase_pct"] * t["halves"]
    add("a g128 method that at least halves rtn's increase",
        best and rtn and f"{best['name']}: {best['increase_pct']:+.2f}% vs rtn {rtn['increase_pct']:+.2f}%", ok)  # fmt: skip
    return out


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render(rows: list[dict], verdict_rows: list[dict], meta: dict) -> str:
    m = meta["model"]
    r = m["recipe"]
    table = [
        [x["name"], _f(x["perplexity"], ".3f"), _f(x["increase_pct"], "+.2f"), _f(x["weight_ratio"], ".2f"),
         _f(x["file_ratio"], ".2f"), _f(x["build_s"], ".0f"), _f(x["prefill_tps"], ".0f"), _f(x["prefill_x"], ".2f"),
         _f(x["decode_tps"], ".1f"), _f(x["decode_x"], ".2f"), _f(x["decode_spread_pct"], ".0f")]
        for x in rows
    ]  # fmt: skip
    heads = ["candidate", "perplexity", "increase %", "weights vs fp32", "file vs fp32", "build s",
             "prefill tok/s", "prefill x", "decode tok/s", "decode x", "decode spread %"]  # fmt: skip
    text = [
        f"Model: **TinyGPT, trained here** (`benchmarks/tinygpt.py`; not a pretrained model): a Llama-style causal "
        f"LM, {m['parameters'] / 1e6:.2f}M parameters, hidden {r['hidden']}, MLP {r['intermediate']}, {r['layers']} "
        f"layers, {r['heads']} heads ({r['kv_heads']} KV heads), context {r['context']}, tied embeddings, byte-level "
        f"BPE of {r['vocab']} tokens; trained from random initialization for {r['steps']} AdamW steps of "
        f"{r['batch']}x{r['context']} tokens ({m['tokens_seen'] / 1e3:.0f}k tokens, "
        f"{m['tokens_seen'] / m['train_tokens']:.1f} passes) on the docstrings of Python {m['text']['python']}'s "
        f"standard library ({m['text']['chars'] / 1e6:.2f}M characters, {m['train_tokens'] / 1e3:.0f}k tokens), "
        f"seed {r['seed']}, {r['threads']} threads: {m['train_s'] / 60:.1f} minutes on {m['cpu']} "
        f"(ISA: {', '.join(m['isa'])}; the cores may have run other work too). Held-out docstring perplexity "
        f"{math.exp(m['heldout_loss']):.1f}. Every Linear's inputs (256, 768) are multiples of 128: "
        f"{meta['quantized']} layers quantized; the tied embedding / output matrix stays fp32 (as for SmolLM2).",
        f"Perplexity: all of `{EVAL}` ({meta['eval_tokens']} tokens), context {PPL_CONTEXT}, stride {PPL_STRIDE}; "
        f"AWQ/GPTQ calibrated on `{CALIB}` ({meta['calibration']}); neither split shares a 12-word run with the "
        f"training text. Speed: batch 1, KV cache, {meta['prompt']}-token prompt, {meta['new']} greedy tokens, "
        f"{meta['rounds']} interleaved rounds in one process (`bench_llm.time_all`; median; spread = (max - min) "
        "/ median of decode), ratios against fp32 eager in the same rounds. A model this small is launch-bound "
        "at batch 1: its decode speeds say little about a large model's.",
        md_table(heads, table),
        "### Targets (computed)",
        md_table(["target", "measured", "verdict"],
                 [[v["target"], v["measured"] or "-", v["verdict"]] for v in verdict_rows]),
        caveat(rows, meta),
    ]  # fmt: skip
    return "\n\n".join(text)


def caveat(rows: list[dict], meta: dict) -> str:
    """What the targets mean on this model, from its numbers."""
    by = {r["name"]: r for r in rows}
    int4 = [r for n, r in by.items() if n.startswith("ptopt int4 g128")]
    lo, hi = min(r["increase_pct"] for r in int4), max(r["increase_pct"] for r in int4)
    return (
        f"**Read with care.** fp32 perplexity {by['fp32 eager']['perplexity']:.1f} against "
        f"{meta['unigram_perplexity']:.0f} for the training text's token frequencies alone: the model uses its "
        f"context, but it is a {meta['model']['parameters'] / 1e6:.1f}M-parameter model trained for minutes, its "
        f"predictions are spread wide, and every int4 g128 method moves its perplexity by {lo:+.2f}% to {hi:+.2f}%. "
        "The targets above are computed on a model with real float weights and 128-divisible widths, as the issue "
        "asks; how much int4 g128 costs a large pretrained LM is not shown by them (on SmolLM2-135M, "
        "`bench_llm.py`, int4 g64 costs tens of percent on its GGUF-derived reference)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds of 16 tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lock", help="take this file lock (flock) only for the timed rounds")
    args = ap.parse_args()
    threads = setup(args.threads)
    if args.lock:
        os.nice(5)
    import torch

    from ptopt.core.lm import token_ids
    from ptopt.core.modelref import load_model

    rounds, new = (2, 16) if args.quick else (5, 32)
    model_dir = tinygpt_dir(progress=lambda m: print("tinygpt:", m, flush=True))
    torch.set_num_threads(threads)
    fp32 = load_model(f"hf:{model_dir}").module
    ids = token_ids(EVAL, fp32.config.vocab_size, model_dir, "evaluation text")
    entries: dict[str, dict] = {
        "fp32 eager": {"module": fp32, "file_bytes": (model_dir / "model.safetensors").stat().st_size},
        "bf16 eager": {"module": load_model(f"hf:{model_dir}").module.to(torch.bfloat16)},
    }
    with tempfile.TemporaryDirectory() as tmp:
        entries |= build(model_dir, Path(tmp), list(PTOPT))
        measure(entries, ids)
        with timing_lock(args.lock):
            time_all(entries, ids[:64], new, rounds)
    rows = summarize(entries)
    v = verdicts(rows)
    calib = next((e["calibration"] for e in entries.values() if e.get("calibration")), None)
    meta = {"model": info(model_dir), "model_dir": model_dir.name, "eval_tokens": int(ids.numel()),
            "prompt": 64, "new": new, "rounds": rounds, "quantized": entries[RTN]["quantized"],
            "calibration": calib and f"{calib['windows']} windows of {calib['tokens_per_window']} tokens",
            "unigram_perplexity": unigram_perplexity(model_dir, ids)}  # fmt: skip
    meta["model"].pop("log", None)
    data = {"rows": rows, "verdicts": v, "meta": meta, "torch": torch.__version__}
    command = "python benchmarks/bench_llm_g128.py --lock /tmp/ptopt-bench.lock" + (
        " --quick" if args.quick else ""
    )
    title = "int4 g128 on a small LM trained here (TinyGPT, issue 28)"
    write_result("llm_g128", title, render(rows, v, meta), data, threads, command)


if __name__ == "__main__":
    main()
