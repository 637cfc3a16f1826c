"""CPU levels (issue 38): what ptopt's artifacts do at each level this CPU reaches, measured with
``validate --isa`` / ``optimize --isa`` (each level in a child process with the kernel libraries capped).

Parts (``--parts``, default all):

- ``nncf``: all-MiniLM-L6-v2 NNCF int8 IRs at SmoothQuant alphas 0.5 ... 0.95 (NNCF's default), 128
  tuning sentences; the worst and mean cosine on 256 unseen sentences at every level: the choice of
  ``ptopt.formats.openvino.SMOOTH_QUANT_ALPHA``.
- ``optimize``: ``optimize --isa`` on all-MiniLM-L6-v2 (``--min-cosine 0.98``, batch 64) and on the zoo
  ResNet (``--accuracy-budget 1``, batch 1 and 32): every candidate's figure and emulated speedup at
  each level, and whether it holds there.
- ``validate_time``: the demo's CNN artifacts validated plainly and with ``--isa`` over three levels,
  in turn (plain, --isa with every child timing the parent's whole budget (the way before), --isa with
  the budget split between the children (now), plain): the wall time ratios (the target: <= 3x).

    python benchmarks/bench_isa.py [--levels avx2,avx,sse41] [--parts nncf,optimize,validate_time]
        [--alphas 0.75,0.95]

Writes ``benchmarks/results/isa.json`` and ``isa.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, md_table, setup, write_result  # noqa: E402

THREADS = 2
ALPHAS = (0.5, 0.65, 0.75, 0.85, 0.95)
HELD_OUT = 256


def _levels(value: str | None) -> list[str]:
    """The levels asked for, else this CPU's own and every lower one down to sse41 (at most three)."""
    from ptopt.core.isa import LEVELS, check_levels, reaches, top_level

    if value:
        return check_levels(value)
    top = top_level()
    below = [n for n in LEVELS if reaches(n) and n != top and n in ("avx2", "avx", "sse41")]
    return [top, *sorted(below, key=list(LEVELS).index, reverse=True)][:3]


def part_nncf(levels: list[str], work: Path, alphas: tuple[float, ...] = ALPHAS) -> dict:
    import ptopt
    from ptopt.formats import openvino as fo
    from ptopt.models.minilm import heldout_sentences, minilm, tuning_sentences
    from ptopt.validate.latency import LatencyOptions

    model, calib, held = minilm().eval(), tuning_sentences().take(128), heldout_sentences().take(HELD_OUT)
    files, keep = [], fo.SMOOTH_QUANT_ALPHA
    for alpha in alphas:
        fo.SMOOTH_QUANT_ALPHA = alpha
        try:
            res = ptopt.export(model, "openvino", precision="int8", data=calib, min_cosine=0.0)
        finally:
            fo.SMOOTH_QUANT_ALPHA = keep
        files.append(res.save(work / f"minilm.sq{alpha}.xml").path)
    lat = LatencyOptions(min_iters=2, min_seconds=0.2, rounds=2)
    res = ptopt.validate(model, files, held, batch_sizes=(64,), threads=THREADS, latency=lat, isa=levels)
    rows = {}
    for alpha, f in zip(alphas, files, strict=True):
        e = res.entry(f.name)
        rows[str(alpha)] = {lv: {"worst": (fig.get("agreement") or {}).get("min_cosine"),
                                 "mean": (fig.get("agreement") or {}).get("cosine"), "error": fig.get("error")}
                            for lv, fig in e["by_isa"].items()}  # fmt: skip
    return {"alphas": rows, "held_out": HELD_OUT, "calibration": 128}


_KEYS = (
    "name",
    "status",
    "reason",
    "accuracy_drop",
    "cosine_projected",
    "speedup",
    "within_budget",
    "by_isa",
)


def _optimize(name: str, model, levels: list[str], **kw) -> dict:
    import ptopt

    t0 = time.perf_counter()
    res = ptopt.optimize(model, isa=levels, threads=THREADS, progress=True, **kw)
    rep = res.report
    return {"model": name, "best": rep["best"], "metric": rep["metric"], "batch_sizes": rep["batch_sizes"],
            "elapsed_s": round(time.perf_counter() - t0, 1), "isa": rep.get("isa"),
            "candidates": [{k: c.get(k) for k in _KEYS} for c in rep["candidates"]]}  # fmt: skip


def part_optimize(levels: list[str], work: Path) -> dict:
    from ptopt.models.minilm import heldout_sentences, minilm, tuning_sentences

    minilm_run = _optimize(
        "all-MiniLM-L6-v2", minilm(), levels, calib_data=tuning_sentences().take(128),
        eval_data=heldout_sentences().take(HELD_OUT), min_cosine=0.98, batch_sizes=(64,), time_budget="12m",
    )  # fmt: skip
    resnet_run = _optimize(
        "zoo:resnet", "zoo:resnet", levels, calib_data="builtin:digits32:train",
        eval_data="builtin:digits32:test", accuracy_budget=1.0, batch_sizes=(1, 32), time_budget="9m",
    )  # fmt: skip
    return {"runs": [minilm_run, resnet_run]}


def part_validate_time(levels: list[str], work: Path) -> dict:
    import ptopt
    from ptopt.demo import CNN, CNN_STEPS, TEST, demo
    from ptopt.validate import isa as visa

    out = work / "demo"
    demo(out, threads=THREADS, log=lambda m: None)
    arts = [out / s[3] for s in CNN_STEPS if s[0] not in ("lstm8", "trt") and (out / s[3]).exists()]
    opts = dict(batch_sizes=(1, 32), threads=THREADS, min_seconds=0.5, max_accuracy_drop=1.0)
    times, split, keep, runs = [], None, visa.child_latency, (None, "full", levels, None)
    for isa in runs:  # plain, --isa with every child timing the whole budget (before), --isa (now), plain
        visa.child_latency = (lambda lat, n: lat) if isa == "full" else keep
        try:
            t0 = time.perf_counter()
            res = ptopt.validate(CNN, arts, TEST, isa=levels if isa == "full" else isa, **opts)
            times.append(time.perf_counter() - t0)
        finally:
            visa.child_latency = keep
        split = res.data.get("isa") if isa is levels else split
    plain = (times[0] + times[3]) / 2
    return {"artifacts": [a.name for a in arts], "plain_s": [round(times[0], 1), round(times[3], 1)],
            "isa_s": round(times[2], 1), "ratio": round(times[2] / plain, 2), "levels": levels,
            "full_timing_isa_s": round(times[1], 1), "full_timing_ratio": round(times[1] / plain, 2),
            "child_timing": split.get("child_timing"), "children": split.get("children"),
            "load_average": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip


PARTS = {"nncf": part_nncf, "optimize": part_optimize, "validate_time": part_validate_time}


def _markdown(data: dict) -> str:
    out = [f"Levels: {', '.join(data['levels'])} (this CPU's own: {data['native_level']}; the others emulated in "
           "child processes with the kernel libraries capped; speedups at an emulated level are this CPU running "
           "that level's code).", ""]  # fmt: skip
    if "nncf" in data:
        d = data["nncf"]
        out += [f"**all-MiniLM-L6-v2 NNCF int8 by SmoothQuant alpha**: worst / mean cosine on {d['held_out']} "
                f"unseen sentences ({d['calibration']} calibration sentences; ptopt uses 0.75, NNCF's default is "
                "0.95):", ""]  # fmt: skip
        rows = [[a] + [(f"{f['worst']:.4f} / {f['mean']:.4f}" if f.get("worst") is not None else f.get("error"))
                       for f in by.values()] for a, by in d["alphas"].items()]  # fmt: skip
        out += [md_table(["alpha", *next(iter(d["alphas"].values())).keys()], rows), ""]
    for run in (data.get("optimize") or {}).get("runs", []):
        out += [
            f"**optimize --isa on {run['model']}** ({run['metric']}; best: {run['best']}; {run['elapsed_s']} s):",
            "",
        ]
        rows = []
        for c in run["candidates"]:
            native = c["cosine_projected"] if run["metric"] == "cosine" else c["accuracy_drop"]
            cells = [c["name"], c["status"], "" if native is None else f"{native:.4f}",
                     " / ".join(f"{v:.2f}x" for v in (c.get("speedup") or {}).values())]  # fmt: skip
            for lv in data["levels"][1:]:
                f = (c.get("by_isa") or {}).get(lv)
                if not f:
                    cells.append("—")
                    continue
                y = f.get("cosine_projected") if run["metric"] == "cosine" else f.get("accuracy_drop")
                sp = " / ".join(f"{v:.2f}x" for v in (f.get("speedup") or {}).values())
                held = {True: "holds", False: "FAILS", None: "not checked"}[f.get("within_budget")]
                cells.append(f"{'' if y is None else f'{y:.4f}'} {sp} {held}".strip())
            rows.append(cells)
        head = [
            "candidate",
            "status",
            "native figure",
            "native speedup",
            *[f"at {lv}" for lv in data["levels"][1:]],
        ]
        out += [md_table(head, rows), ""]
    if "validate_time" in data:
        v = data["validate_time"]
        out += [f"**validate --isa {','.join(v['levels'])} over the demo's {len(v['artifacts'])} CNN artifacts**: "
                f"{v['isa_s']} s against {v['plain_s'][0]} s and {v['plain_s'][1]} s plain (before and after): "
                f"**{v['ratio']}x** (target <= 3x). Each child times on its share of the budget "
                f"({v.get('child_timing')}); with every child timing the whole budget (as before): "
                f"{v.get('full_timing_isa_s')} s, {v.get('full_timing_ratio')}x. Load average at the end: "
                f"{v.get('load_average')}.", ""]  # fmt: skip
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--alphas", help="the nncf part's SmoothQuant alphas (default: %(default)s)",
                    default=",".join(map(str, ALPHAS)))  # fmt: skip
    args = ap.parse_args()
    setup(THREADS)
    from ptopt.core.isa import top_level

    levels = _levels(args.levels)
    data: dict = {"levels": levels, "native_level": top_level()}
    old = RESULTS / "isa.json"
    if old.exists():  # parts not rerun keep their figures
        data = {**json.loads(old.read_text()), **data}
    work = Path(tempfile.mkdtemp(prefix="ptopt-bench-isa-"))
    for part in args.parts.split(","):
        extra = {"alphas": tuple(float(a) for a in args.alphas.split(","))} if part == "nncf" else {}
        data[part] = PARTS[part](levels, work, **extra)
        print(json.dumps(data[part], indent=1, default=str)[:4000], flush=True)
    write_result("isa", "CPU levels: accuracy and speed at each level (issue 38)", _markdown(data), data, THREADS,
                 command=" ".join(["python benchmarks/bench_isa.py", *sys.argv[1:]]))  # fmt: skip


if __name__ == "__main__":
    main()
