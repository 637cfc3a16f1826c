"""GPU: what ``ptopt optimize --device cuda`` finds, against ``torch.compile`` of the fp16 model, fp16 and
fp32 eager, on one CUDA GPU.

Models (random weights: speed does not depend on them, and each output is compared with fp32 eager's on
the same inputs):

- the zoo ResNet (``ptopt.models.resnet:resnet``, 1×32×32) at batch 1, 32 and 256;
- a MiniLM-shaped BERT encoder (``transformers.BertConfig``: 6 layers, hidden 384, 12 heads,
  intermediate 1536, 128 tokens) at batch 1 and 64, returning ``last_hidden_state``.

For each model:

1. ``ptopt optimize FACTORY --device cuda --min-cosine 0.99`` runs as a subprocess (what a user runs; a
   compiler crash costs that search, which is then run again without the AOTInductor rows) over the GPU
   catalogue: fp16/bf16 TorchScript and ExportedProgram, the fp16 ExportedProgram through
   ``torch.compile(mode="reduce-overhead")`` (Inductor + CUDA graphs), fp16 AOTInductor with and without
   CUDA graphs. Its report says what was kept, rejected or failed, and why.
2. Every kept artifact (opened from the output folder by validate's runners, as ``ptopt validate`` runs
   it) is timed in interleaved rounds with CUDA events together with the baselines: fp32 eager, fp16
   eager, ``torch.compile`` of the fp16 model (default mode) and with ``mode="reduce-overhead"``.
3. The headline: at each batch size, ptopt's fastest artifact (and its fastest packageable one) over
   ``torch.compile`` fp16 (target >= 1.0).

Then ``ptopt validate --device cuda``'s p50 for the ResNet's best packageable artifact at batch 32 is
compared with a bare loop of CUDA events around each call of the same artifact (target: within 10%).

    python benchmarks/bench_gpu.py [--work DIR] [--rounds 5] [--seconds 0.3] [--budget 300]
    python benchmarks/bench_gpu.py --device cpu --quick      # a dry run of every step on the CPU (bf16)
    bash benchmarks/gpu_session.sh     # the CUDA tests and the AOTInductor probe, then this bench

Needs a CUDA GPU (``--device cpu`` is a dry run of the steps: bf16 instead of fp16, the CPU rows);
exits with a message elsewhere. Install ptopt on the GPU machine without touching its torch:
``pip install --no-deps --no-build-isolation ./`` (``transformers`` is needed for the BERT encoder).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_header, md_table, write_result  # noqa: E402

THREADS = 2
COMMAND = "bash benchmarks/gpu_session.sh"
RESNET_BATCHES = (1, 32, 256)
BERT_BATCHES = (1, 64)
SEQ = 128
#: the GPU catalogue rows the searches try (AOTINDUCTOR: dropped when a search crashed in the compiler)
GPU_CANDIDATES = (
    "fp16-torchscript", "bf16-torchscript", "fp16-exported-program", "bf16-exported-program",
    "fp16-compiled-graphs", "fp16-aoti", "fp16-aoti-graphs",
)  # fmt: skip
AOTINDUCTOR = ("fp16-aoti", "fp16-aoti-graphs", "bf16-aoti")
#: the dry run's (--device cpu): what runs on a CPU
CPU_CANDIDATES = ("fp32-torchscript", "fp32-exported-program")
#: the baseline ptopt's best is held against
TARGET = "torch.compile"


def bert_encoder():
    """The MiniLM-shaped BERT encoder, random weights (seed 0): keyword inputs, last_hidden_state out.
    Also the factory ``bench_gpu:bert_encoder`` the optimize subprocess loads."""
    import torch
    from transformers import BertConfig, BertModel

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            cfg = BertConfig(
                num_hidden_layers=6,
                hidden_size=384,
                num_attention_heads=12,
                intermediate_size=1536,
                max_position_embeddings=512,
            )
            self.bert = BertModel(cfg, add_pooling_layer=False)

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        def example_inputs(self, batch: int = 2):
            g = torch.Generator().manual_seed(batch)
            ids = torch.randint(0, 30522, (batch, SEQ), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones(batch, SEQ, dtype=torch.int64)}

    torch.manual_seed(0)
    return Encoder().eval()


def resnet():
    """The zoo ResNet with random weights (seed 0); also the factory ``bench_gpu:resnet``."""
    import torch

    from ptopt.models.resnet import resnet as build

    torch.manual_seed(0)
    return build().eval()


def gpu_facts(device: str) -> dict:
    import torch

    if not device.startswith("cuda"):
        return {"gpu": "none (dry run on the CPU)", "driver": "-", "cuda": "-", "torch": torch.__version__}
    driver = ""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {
        "gpu": torch.cuda.get_device_name(0),
        "driver": driver or "unknown (no nvidia-smi)",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
    }


def failure_reason(text: str, code: int | None) -> str:
    """One line for a failed subprocess: Python's last error line, or, for a crash, faulthandler's "Fatal
    Python error" with the innermost frame of the crashing thread (its report ends in a list of modules)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    fatal = next((ln for ln in lines if ln.startswith("Fatal Python error:")), None)
    if fatal or (lines and lines[-1].startswith("Extension modules:")):
        at = next((i for i, ln in enumerate(lines) if ln.startswith("Current thread")), None)
        frame = lines[at + 1] if at is not None and at + 1 < len(lines) else ""
        return f"{fatal or 'crashed (faulthandler report)'}{f' at {frame}' if frame else ''}"[:300]
    return (lines or [f"exit {code}"])[-1][:300]


# -- the models, their data, their searches ------------------------------------------------------------


def models(quick: bool) -> list[dict]:
    """name, factory, label, batch sizes, and a function giving (calib, eval) data written to a folder."""
    rb, bb = ((1, 4), (1, 2)) if quick else (RESNET_BATCHES, BERT_BATCHES)
    return [
        {"name": "resnet", "factory": "bench_gpu:resnet", "label": "zoo ResNet", "batches": rb,
         "data": _resnet_data, "input": lambda b: __import__("torch").randn(b, 1, 32, 32)},
        {"name": "bert", "factory": "bench_gpu:bert_encoder", "label": "BERT 6x384, 128 tokens", "batches": bb,
         "data": _bert_data, "input": lambda b: bert_encoder().example_inputs(b)},
    ]  # fmt: skip


def _resnet_data(work: Path) -> tuple[str, str]:
    return "builtin:digits32:train", "builtin:digits32:test"


def _bert_data(work: Path) -> tuple[str, str]:
    """Token ids (a fixed seed): 64 to calibrate on, 256 to judge on."""
    import torch

    from ptopt.core.data import Dataset

    out = []
    for name, n, seed in (("bert-calib", 64, 1), ("bert-eval", 256, 2)):
        g = torch.Generator().manual_seed(seed)
        x = {
            "input_ids": torch.randint(0, 30522, (n, SEQ), generator=g),
            "attention_mask": torch.ones(n, SEQ, dtype=torch.int64),
        }
        Dataset(x, name=name).save(work / f"{name}.pt")
        out.append(str(work / f"{name}.pt"))
    return out[0], out[1]


def optimize_cmd(m: dict, work: Path, device: str, budget: float, names: tuple[str, ...]) -> list[str]:
    calib, evald = m["data"](work)
    return [
        sys.executable, "-X", "faulthandler", "-m", "ptopt.cli.main", "optimize", m["factory"],
        "--calib-data", calib, "--eval-data", evald, "--min-cosine", "0.99", "--device", device,
        "--candidates", ",".join(names), "--batch-size", ",".join(map(str, m["batches"])),
        "--threads", str(THREADS), "--rounds", "5", "--min-seconds", "0.5", "--time-budget", f"{budget:.0f}",
        "-o", str(work / f"opt-{m['name']}"),
    ]  # fmt: skip


def start_search(m: dict, work: Path, device: str, budget: float, names: tuple[str, ...]) -> subprocess.Popen:
    """``ptopt optimize`` of one model in a subprocess, its output in ``work/opt-NAME.log``."""
    here = str(Path(__file__).resolve().parent)  # bench_gpu:resnet must import in the subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    log = open(work / f"opt-{m['name']}.log", "a")  # noqa: SIM115 - the child writes it; closed by wait
    log.write(f"$ {' '.join(optimize_cmd(m, work, device, budget, names))}\n")
    log.flush()
    cmd = optimize_cmd(m, work, device, budget, names)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def finish_search(m: dict, proc: subprocess.Popen, work: Path, device: str, deadline: float) -> dict:
    """The search's report.json (``{"error": ...}`` when none was written). A search that crashed (a
    signal: seen in torch 2.11's AOTInductor on that image) is run again without the AOTInductor rows."""
    out = work / f"opt-{m['name']}"
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.log.close()
    text = (work / f"opt-{m['name']}.log").read_text()
    if (out / "report.json").exists():
        return json.loads((out / "report.json").read_text())
    why = failure_reason(text, proc.returncode)
    left = deadline - time.monotonic()
    names = tuple(n for n in GPU_CANDIDATES if n not in AOTINDUCTOR)
    if proc.returncode is not None and proc.returncode < 0 and left > 120 and device.startswith("cuda"):
        name = (
            signal.Signals(-proc.returncode).name
            if -proc.returncode in signal.valid_signals()
            else proc.returncode
        )
        again = start_search(m, work, device, min(left - 60, 200), names)
        report = finish_search(m, again, work, device, deadline)
        report["first_try"] = f"the search with the AOTInductor rows died ({name}): {why}"
        return report
    return {"error": why}


# -- timing everything together -------------------------------------------------------------------------


def baselines(module, device: str, half) -> dict:
    """fp32 eager, half eager, torch.compile of the half model (default mode and reduce-overhead)."""
    import torch

    fp32 = copy.deepcopy(module).to(device).eval()
    half_model = copy.deepcopy(module).to(device=device, dtype=half).eval()
    graphed = torch.compile(copy.deepcopy(half_model), mode="reduce-overhead")
    return {
        "fp32 eager": (fp32, None),
        f"{_name(half)} eager": (half_model, half),
        f"{_name(half)} torch.compile": (torch.compile(half_model), half),
        f"{_name(half)} torch.compile reduce-overhead": (graphed, half),
    }  # fmt: skip


def _name(dtype) -> str:
    return {"float16": "fp16", "bfloat16": "bf16"}[str(dtype).split(".")[-1]]


def open_kept(report: dict, work: Path, name: str, device: str) -> tuple[dict, dict]:
    """{label: runner} of every kept candidate of the search (validate's runners, on ``device``), and
    {label: why not timed} of the others (the search's own reason)."""
    from ptopt.optimize.candidates import SPECS, Candidate
    from ptopt.optimize.search import open_candidate

    runners, missing = {}, {}
    for c in report.get("candidates", [])[1:]:
        if c["status"] != "kept" or not c.get("path"):
            missing[c["name"]] = f"{c['status']}: {c.get('reason')}"
            continue
        cand = Candidate(SPECS[c["name"]])
        cand.work_path = work / f"opt-{name}" / c["path"]
        try:
            runners[c["name"]] = open_candidate(cand, THREADS, device)
        except Exception as e:  # noqa: BLE001 - a runtime that fails here costs its row, named
            missing[c["name"]] = f"could not be opened again: {type(e).__name__}: {str(e)[:200]}"
    return runners, missing


def measure(m: dict, module, runners: dict, device: str, half, rounds: int, seconds: float) -> list[dict]:
    """Latency per (runtime, batch), interleaved, CUDA events on a GPU; each output vs fp32 eager."""
    import torch

    from ptopt.core.device import to_device
    from ptopt.core.inputspec import call_model
    from ptopt.core.tensors import flatten_outputs
    from ptopt.core.timing import measure_interleaved
    from ptopt.export.parity import compare
    from ptopt.optimize.candidates import SPECS

    calls, sizes = {}, {}
    base = baselines(module, device, half)
    for bs in m["batches"]:
        x = m["input"](bs)
        for rt, (fn, dtype) in base.items():
            xd = to_device(x, device, dtype)

            def run(fn=fn, xd=xd):
                with torch.inference_mode():
                    return call_model(fn, xd)

            calls[(rt, bs)], sizes[(rt, bs)] = run, bs
        for rt, runner in runners.items():
            if runner.accepts_batch(bs):
                calls[(rt, bs)], sizes[(rt, bs)] = runner.timed_call(x), bs
    stats = measure_interleaved(
        calls, sizes, rounds=rounds, min_iters=20, min_seconds=seconds, warmup_iters=10, warmup_seconds=0.5,
        devices={k: device for k in calls},
    )  # fmt: skip
    rows = []
    for rt, bs in calls:
        ref = flatten_outputs(calls[("fp32 eager", bs)]())
        diff = None if rt == "fp32 eager" else compare(ref, flatten_outputs(calls[(rt, bs)]()))
        st, base = stats[(rt, bs)], stats[("fp32 eager", bs)]
        rows.append({
            "model": m["label"], "runtime": rt, "batch": bs, "p50_ms": st["p50_ms"],
            "spread_pct": st["round_spread_pct"], "speedup": base["p50_ms"] / st["p50_ms"],
            "ptopt": rt in runners, "packageable": SPECS[rt].packageable if rt in runners else None,
            "max_abs_diff": None if diff is None else diff["max_abs_diff"],
            "rel_error": None if diff is None else diff["rel_error"],
            "cosine": None if diff is None else diff["cosine"],
        })  # fmt: skip
    return rows


def versus_target(rows: list[dict], half: str, packageable: set[str]) -> list[dict]:
    """At each (model, batch): ptopt's fastest artifact, and its fastest packageable one, over
    ``torch.compile`` of the half model."""
    out = []
    for key in dict.fromkeys((r["model"], r["batch"]) for r in rows):
        here = [r for r in rows if (r["model"], r["batch"]) == key]
        target = next(r for r in here if r["runtime"] == f"{half} {TARGET}")
        ours = sorted((r for r in here if r["ptopt"]), key=lambda r: r["p50_ms"])
        pack = [r for r in ours if r["runtime"] in packageable]
        entry = {"model": key[0], "batch": key[1], "target_ms": target["p50_ms"]}
        for tag, pick in (("best", ours[:1]), ("best_packageable", pack[:1])):
            for r in pick:
                entry[tag] = {
                    "name": r["runtime"],
                    "p50_ms": r["p50_ms"],
                    "vs_target": target["p50_ms"] / r["p50_ms"],
                }
        out.append(entry)
    return out


def validate_vs_bare(path: Path | None, name: str, device: str, batch: int = 32, calls: int = 200) -> dict:
    """``ptopt validate --device cuda``'s p50 for the artifact at ``batch`` against a bare loop of CUDA
    events around each call of the same artifact, loaded the same way (median of ``calls``)."""
    import statistics

    import torch

    from ptopt.core.errors import PtoptError
    from ptopt.validate.api import validate
    from ptopt.validate.runners import open_runner

    if path is None:
        return {"skipped": "the ResNet search kept no packageable artifact"}
    try:
        res = validate(resnet(), [path], "builtin:digits32:test", batch_sizes=(batch,), threads=THREADS,
                       device=device, max_samples=512, allow_pickle=True)  # fmt: skip
        runner = open_runner(str(path), allow_pickle=True)
        runner.place(device)
        runner.prepare(THREADS)
    except PtoptError as e:
        return {"skipped": str(e)[:300]}
    lat = res.entries[0]["latency"][str(batch)]
    call = runner.timed_call(torch.randn(batch, 1, 32, 32))
    times = []
    for i in range(calls + 20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        if i >= 20:
            times.append(start.elapsed_time(end))
    bare = statistics.median(times)
    return {"artifact": name, "batch": batch, "validate_p50_ms": lat["p50_ms"], "timer": lat.get("timer"),
            "bare_p50_ms": bare, "ratio": lat["p50_ms"] / bare}  # fmt: skip


# -- the report -------------------------------------------------------------------------------------------


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def _pick(v: dict, tag: str) -> list[str]:
    p = v.get(tag)
    return ["-", "", ""] if p is None else [p["name"], f"{p['p50_ms']:.3f}", f"{p['vs_target']:.2f}"]


def report(data: dict, machine: str | None = None) -> None:
    """benchmarks/results/gpu.md and .json from the run's data (also what ``--render`` writes again)."""
    facts, rows = data["facts"], data["rows"]
    table = md_table(
        ["model", "runtime", "batch", "p50 ms", "spread %", "× fp32 eager", "max |diff| vs fp32", "rel", "cosine"],
        [
            [r["model"], f"**{r['runtime']}**" if r.get("ptopt") else r["runtime"], r["batch"], f"{r['p50_ms']:.3f}",
             f"{r['spread_pct']:.1f}", f"{r['speedup']:.2f}", _fmt(r["max_abs_diff"], ".3g"), _fmt(r["rel_error"], ".3g"),
             _fmt(r["cosine"], ".5f")]
            for r in rows
        ],
    )  # fmt: skip
    versus = md_table(
        ["model", "batch", f"{TARGET} ms", "ptopt's fastest", "ms", "× target", "fastest packageable", "ms", "× target"],
        [[v["model"], v["batch"], f"{v['target_ms']:.3f}", *_pick(v, "best"), *_pick(v, "best_packageable")]
         for v in data.get("versus", [])],
    )  # fmt: skip
    head = (
        f"GPU: {facts['gpu']}, driver {facts['driver']}, CUDA {facts['cuda']}, torch {facts['torch']}. "
        "Random weights; latency from CUDA events, interleaved rounds, inputs already on the device. "
        "**Bold**: artifacts `ptopt optimize --device cuda` kept (named by catalogue row)."
    )
    notes = "".join(f"\n- {k}: {v}" for k, v in data.get("searches", {}).items())
    notes += "".join(f"\n- not measured: {k}: {v}" for k, v in data.get("missing", {}).items())
    check = data.get("validate_vs_bare", {})
    if "ratio" in check:
        notes += (
            f"\n- `ptopt validate --device cuda` on the ResNet's {check.get('artifact', 'artifact')} at batch "
            f"{check['batch']}: p50 {check['validate_p50_ms']:.3f} ms ({check['timer']}); a bare loop of CUDA "
            f"events around each call of the same artifact: {check['bare_p50_ms']:.3f} ms; ratio {check['ratio']:.3f}"
        )
    if "skipped" in check:
        notes += f"\n- not measured: `ptopt validate --device cuda` against a bare CUDA-event loop: {check['skipped']}"
    md = f"{head}\n\n{versus}\n\n{table}\n{notes}" if data.get("versus") else f"{head}\n\n{table}\n{notes}"
    machine = machine or data.get("machine") or machine_header(THREADS)
    data = dict(data, machine=machine)
    title = "GPU: ptopt optimize --device cuda vs torch.compile fp16 vs eager"
    write_result("gpu", title, md, data, THREADS, command=COMMAND, machine=machine)


def render(path: Path) -> None:
    """The tables again from a results JSON (e.g. one brought back from the GPU machine), with the machine
    header of that run: from the JSON, or the ``Machine:`` line of the .md beside it."""
    data = json.loads(path.read_text())
    machine = data.get("machine")
    if not machine and path.with_suffix(".md").exists():
        lines = path.with_suffix(".md").read_text().splitlines()
        machine = next((ln for ln in lines if ln.startswith("Machine:")), None)
    data["missing"] = {k: failure_reason(v, None) for k, v in data.get("missing", {}).items()}
    report(data, machine)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="the searches' output folders and logs go here")
    ap.add_argument("--device", default="cuda", help="cuda (default) | cpu: a dry run of every step")
    ap.add_argument("--quick", action="store_true", help="small batches (a dry run)")
    ap.add_argument("--models", default="resnet,bert", help="which models (default resnet,bert)")
    ap.add_argument("--budget", type=float, default=300, help="--time-budget of each search, seconds")
    ap.add_argument("--deadline", type=float, default=420, help="seconds the whole bench may take")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    ap.add_argument("--seconds", type=float, default=0.3, help="timed seconds per runtime and batch")
    ap.add_argument(
        "--render", type=Path, help="only write the tables again from a results JSON of this script"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import tempfile

    import torch

    from ptopt.core.device import cuda_status

    args = parse_args(argv)
    if args.render:
        return render(args.render)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"bench_gpu: needs a CUDA GPU, and {cuda_status()}; run it on a machine with one")
    torch.set_num_threads(THREADS)
    deadline = time.monotonic() + args.deadline
    work = args.work or Path(tempfile.mkdtemp(prefix="ptopt-bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    on_gpu = args.device.startswith("cuda")
    half = torch.float16 if on_gpu else torch.bfloat16
    names = GPU_CANDIDATES if on_gpu else CPU_CANDIDATES
    todo = [m for m in models(args.quick) if m["name"] in args.models.split(",")]
    procs = {m["name"]: start_search(m, work, args.device, args.budget, names) for m in todo}  # at once
    data = {"facts": gpu_facts(args.device), "rows": [], "missing": {}, "searches": {}}
    for m in todo:
        rep = finish_search(m, procs[m["name"]], work, args.device, deadline - 120)
        data["searches"][f"{m['name']}: optimize --device {args.device}"] = _search_line(rep)
        runners, missing = open_kept(rep, work, m["name"], args.device)
        data["missing"] |= {f"{m['name']}: {k}": v for k, v in missing.items()}
        module = resnet() if m["name"] == "resnet" else bert_encoder()
        left = max(0.05, min(args.seconds, (deadline - time.monotonic() - 60) / (8 * len(m["batches"]) * 2)))
        try:
            data["rows"] += measure(m, module, runners, args.device, half, args.rounds, left)
        finally:
            for r in runners.values():
                r.close()
        if m["name"] == "resnet":
            data["best_resnet"] = _best_packageable(rep, work)
    from ptopt.optimize.candidates import SPECS

    data["versus"] = versus_target(data["rows"], _name(half), {n for n in SPECS if SPECS[n].packageable})
    best = data.pop("best_resnet", None)
    data["validate_vs_bare"] = (
        validate_vs_bare(best[1] if best else None, best[0] if best else "", args.device, batch=min(32, max(m["batches"])))
        if on_gpu else {"skipped": "a dry run on the CPU (CUDA events need a GPU)"}
    )  # fmt: skip
    report(data)


def _search_line(rep: dict) -> str:
    if "error" in rep:
        return f"failed: {rep['error']}"
    kept = [c["name"] for c in rep["candidates"][1:] if c["status"] == "kept"]
    by_batch = ", ".join(f"batch {b}: {v['name']}" for b, v in (rep.get("best_by_batch") or {}).items())
    first = f"; {rep['first_try']}" if rep.get("first_try") else ""
    return (
        f"best {rep.get('best')} ({by_batch or 'none within the budget'}); kept {', '.join(kept) or 'none'}; "
        f"{rep.get('elapsed_s')} s of a {rep.get('time_budget_s')} s budget{first}"
    )


def _best_packageable(rep: dict, work: Path) -> tuple[str, Path] | None:
    """The search's best (packageable by construction) and its file, or None."""
    if rep.get("best") and rep.get("best_path"):
        return rep["best"], work / "opt-resnet" / rep["best_path"]
    return None


if __name__ == "__main__":
    main()
