"""``ptopt.optimize`` against the raw library calls a user would otherwise make (issue 20's Numbers).

On zoo:resnet and on a user-style residual CNN (bench_aoti's ``UserCNN``: functional ``F.relu``, ``x + y``
residuals, trained 3 epochs here), both on builtin:digits32, 2 threads:

1. ``ptopt.optimize(model, calib_data=train, eval_data=test, accuracy_budget=1.0, batch_sizes=(1, 32),
   output=DIR)``, no train data; its wall time is the whole search, saving included.
2. The raw baselines, written by hand as in bench_overhead / bench_quantize: fp32 eager; raw torch.ao FX
   int8 (``prepare_fx`` with ``get_default_qconfig_mapping("x86")``, 32 calibration batches,
   ``convert_fx``, traced + frozen); raw onnxruntime.quantization QDQ int8 (``quantize_static``,
   per-channel, reduce_range, on the fp32 ONNX export); ORT fp32 (that export).
3. The chosen artifact, loaded back from ``DIR/best.<ext>`` with the same raw loaders and the same
   thread settings as the baselines, timed with them in the same interleaved rounds at batch 32;
   accuracy of every one on builtin:digits32:test.

Targets: chosen speed / fastest raw baseline >= 0.95, the chosen artifact within the budget, the search
under 10 minutes.

    PTOPT_CACHE_DIR=/work/notes/zoo-cache python benchmarks/bench_optimize.py
    python benchmarks/bench_optimize.py --baselines-only   # the raw baselines alone: prints, writes nothing
    python benchmarks/bench_optimize.py --smoke --models resnet --rounds 2 --seconds 0.2   # does it run?
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_aoti import user_cnn  # noqa: E402
from bench_overhead import raw_fx_int8  # noqa: E402
from bench_quantize import _accuracy, _load_ts, _ort_sessions  # noqa: E402
from common import md_table, setup, write_result  # noqa: E402

CALIB, TEST = "builtin:digits32:train", "builtin:digits32:test"
BATCH = 32
MAX_DROP = 1.0
TARGET_SPEED = 0.95
TARGET_SEARCH_S = 600.0
RAW = ("fp32 eager", "raw torch.ao FX int8", "raw ORT int8 (QDQ)", "ORT fp32")


def load_models(which: list[str]) -> dict[str, Any]:
    from ptopt.core.modelref import load_model

    out = {}
    if "resnet" in which:
        out["zoo:resnet"] = load_model("zoo:resnet").module.eval()
    if "user" in which:
        out["user residual CNN"] = user_cnn()
    return out


def baselines(model, calib, x, work: Path, threads: int) -> tuple[dict, dict]:
    """{name: callable(x)} and {name: bytes} of the four raw baselines."""
    work.mkdir(parents=True, exist_ok=True)
    fns = {"fp32 eager": model}
    sizes: dict[str, int | None] = {"fp32 eager": None}
    fns["raw torch.ao FX int8"] = raw_fx_int8(model, calib, x, work / "raw_fx.int8.pt")
    sizes["raw torch.ao FX int8"] = os.path.getsize(work / "raw_fx.int8.pt")
    ort = _ort_sessions(model, calib, x, work, threads)
    for name in ("raw ORT int8 (QDQ)", "ORT fp32"):
        key = "ORT int8 (QDQ)" if name.startswith("raw ") else name
        fns[name], sizes[name] = ort[key], ort[key + ":bytes"]
    return fns, sizes


def load_chosen(path: Path, threads: int, fallback: Any) -> Any:
    """The saved best artifact, loaded the way the baselines are (TorchScript, or an ORT session with the
    same threads); any other format through the search's own in-memory model."""
    if path.suffix == ".pt":
        return _load_ts(path)
    if path.suffix == ".onnx":
        import numpy as np
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return lambda a: sess.run(None, {name: np.asarray(a)})[0]
    return fallback


def run_optimize(model, work: Path, args) -> tuple[Any, float]:
    import ptopt

    quick = dict(rounds=3, min_seconds=0.2) if args.smoke else {}
    t0 = time.perf_counter()
    res = ptopt.optimize(
        model,
        calib_data=CALIB,
        eval_data=TEST,
        accuracy_budget=MAX_DROP,
        batch_sizes=(1, BATCH),
        time_budget=TARGET_SEARCH_S,
        output=work / "optimize",
        threads=args.threads,
        skip=args.skip.split(",") if args.skip else None,
        **quick,
    )
    return res, time.perf_counter() - t0


def time_batch32(fns: dict, x, rounds: int, seconds: float) -> dict[str, dict]:
    """Every callable at batch 32 in the same interleaved rounds."""
    import torch

    from ptopt.core.timing import measure_interleaved

    calls = {n: (lambda f=f: f(x)) for n, f in fns.items()}
    with torch.inference_mode():
        return measure_interleaved(
            calls, {n: BATCH for n in calls}, rounds=rounds, min_iters=10, min_seconds=seconds * rounds
        )


def bench_model(label: str, model, args, work: Path) -> tuple[list[list], dict]:
    from ptopt.core.data import load_data

    calib, test = load_data(CALIB), load_data(TEST)
    x = test.first_batch(BATCH).x
    fns, sizes = baselines(model, calib, test.first_batch(2).x, work / "raw", args.threads)
    data: dict[str, Any] = {}
    chosen = None
    if not args.baselines_only:
        res, wall = run_optimize(model, work, args)
        report = res.report
        data.update(search_seconds=wall, exit_code=res.exit_code, report=report)
        if report.get("best") and report.get("best_path"):
            chosen = f"ptopt optimize → {report['best']}"
            best_file = work / "optimize" / report["best_path"]
            fns[chosen] = load_chosen(best_file, args.threads, res.model)
            sizes[chosen] = os.path.getsize(best_file)
    stats = time_batch32(fns, x, args.rounds, args.seconds)
    acc = {n: _accuracy(f, test) for n, f in fns.items()}
    eager = stats["fp32 eager"]["p50_ms"]
    rows = [
        [
            label,
            n,
            f"{stats[n]['p50_ms']:.2f}",
            f"{stats[n]['round_spread_pct']:.0f}%",
            f"{eager / stats[n]['p50_ms']:.2f}x",
            f"{100 * acc[n]:.2f}",
            f"{100 * (acc['fp32 eager'] - acc[n]):+.2f}",
            "-" if sizes.get(n) is None else f"{sizes[n]:,}",
        ]
        for n in fns
    ]
    data.update(
        p50_ms={n: s["p50_ms"] for n, s in stats.items()},
        min_ms={n: s["min_ms"] for n, s in stats.items()},
        spread_pct={n: s["round_spread_pct"] for n, s in stats.items()},
        accuracy=acc,
        bytes=sizes,
        chosen=chosen,
    )
    return rows, data


def verdict(label: str, data: dict) -> str:
    """The issue's three targets for one model, each with its figure."""
    if "search_seconds" not in data:
        return f"- {label}: baselines only (no `ptopt.optimize` run)"
    p50, chosen = data["p50_ms"], data["chosen"]
    search = f"search {data['search_seconds']:.0f} s (target < {TARGET_SEARCH_S:.0f} s)"
    if chosen is None:
        return f"- {label}: NO ARTIFACT CHOSEN (exit {data['exit_code']}); {search}"
    fastest = min(RAW, key=lambda n: p50[n])
    ratio = p50[fastest] / p50[chosen]
    drop = 100 * (data["accuracy"]["fp32 eager"] - data["accuracy"][chosen])
    best = next(c for c in data["report"]["candidates"] if c["name"] == data["report"]["best"])
    return (
        f"- {label}: chose `{best['name']}` ({best['label']}); speed vs the fastest raw baseline "
        f"({fastest}) {ratio:.2f}x (target >= {TARGET_SPEED}: {'met' if ratio >= TARGET_SPEED else 'NOT met'}); "
        f"accuracy drop {drop:+.2f} pts (budget {MAX_DROP:g}: {'met' if drop <= MAX_DROP else 'NOT met'}); "
        f"{search}: {'met' if data['search_seconds'] < TARGET_SEARCH_S else 'NOT met'}; exit {data['exit_code']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=0.5, help="seconds per candidate and round")
    ap.add_argument("--models", default="resnet,user", help="comma-separated: resnet, user")
    ap.add_argument("--baselines-only", action="store_true", help="skip ptopt.optimize; print, write nothing")
    ap.add_argument("--skip", default="", help="candidates the search leaves out, e.g. fp32-aoti,int8-pt2e")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="a check that the script runs: short timings; print, write nothing",
    )
    args = ap.parse_args()
    setup(args.threads)
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="ptopt-bench-optimize-"))
    rows, data, lines = [], {}, []
    for i, (label, model) in enumerate(load_models(args.models.split(",")).items()):
        r, d = bench_model(label, model, args, work / f"m{i}")
        rows += r
        data[label] = d
        lines.append(verdict(label, d))
    end = os.getloadavg()
    head = [
        "model",
        "artifact",
        "p50 ms @32",
        "round spread",
        "vs fp32 eager",
        "top-1 %",
        "drop (pts)",
        "bytes",
    ]
    md = (
        "### The chosen artifact vs the raw-library baselines, batch 32, timed interleaved in one process\n\n"
        + md_table(head, rows)
        + "\n\nAgainst the issue's targets:\n\n"
        + "\n".join(lines)
        + f"\n\nLoad average at the start: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, at the end: "
        f"{end[0]:.1f} / {end[1]:.1f} / {end[2]:.1f} (the CPU may be shared with other work: the ratios come "
        "from the same interleaved rounds, the absolute milliseconds do not transfer).\n"
    )
    if args.baselines_only or args.smoke:
        print(md)
        return
    write_result("optimize", "ptopt optimize vs the raw-library baselines", md, data, args.threads)


if __name__ == "__main__":
    main()
