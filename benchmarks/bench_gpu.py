"""GPU: fp16 AOTInductor (``ptopt export --target aoti --device cuda --precision fp16``, with and without
``--cuda-graphs``) vs plain ``torch.compile`` of the fp16 model vs fp32 eager, on one CUDA GPU.

Models (random weights: speed does not depend on them, and the fp32-vs-fp16 output difference is
reported for these weights):

- the zoo ResNet (``ptopt.models.resnet:resnet``, 1×32×32) at batch 1, 32 and 256;
- a MiniLM-shaped BERT encoder (``transformers.BertConfig``: 6 layers, hidden 384, 12 heads,
  intermediate 1536, 128 tokens) at batch 1 and 64, returning ``last_hidden_state``.

Each AOTInductor package is built by the ``ptopt export`` command in a subprocess (what a user runs;
a compiler crash costs that row, not the run), then loaded here. Latency: ptopt's interleaved rounds
with CUDA events (``ptopt.core.timing``, ``devices=``), inputs on the GPU before timing; speedups are
same-run ratios over fp32 eager. Output diff: each fp16 runtime against fp32 eager on the same
inputs (max |diff|, max |diff| / max |fp32|, worst-sample cosine). The GPU, driver, CUDA and torch
versions are recorded.

    python benchmarks/bench_gpu.py [--work DIR] [--build-only] [--rounds 5] [--seconds 0.5]
    bash benchmarks/gpu_session.sh     # the CUDA tests, a CLI validate on the GPU, then this bench

The four packages are built at once (concurrent ``ptopt export`` subprocesses); ``--work`` keeps them, so
a later run reuses them. It also compares ``ptopt validate --device cuda``'s p50 for the fp16 ResNet
package with a bare loop of CUDA events around each call of it. Needs a CUDA GPU; exits with a message
elsewhere.

Install ptopt on the GPU machine without touching its torch: ``pip install --no-deps
--no-build-isolation ./`` (``transformers`` is needed for the BERT encoder).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_header, md_table, write_result  # noqa: E402

THREADS = 2
COMMAND = "bash benchmarks/gpu_session.sh"
RESNET_BATCHES = (1, 32, 256)
BERT_BATCHES = (1, 64)
SEQ = 128


def bert_encoder():
    """The MiniLM-shaped BERT encoder, random weights (seed 0): keyword inputs, last_hidden_state out.
    Also the factory ``bench_gpu:bert_encoder`` the export subprocess loads."""
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
            g = torch.Generator().manual_seed(0)
            ids = torch.randint(0, 30522, (batch, SEQ), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones(batch, SEQ, dtype=torch.int64)}

    torch.manual_seed(0)
    return Encoder().eval()


def resnet():
    import torch

    from ptopt.models.resnet import resnet as build

    torch.manual_seed(0)
    return build().eval()


def gpu_facts() -> dict:
    import torch

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


PACKAGES = (  # (name, factory, --dynamic-batch)
    ("resnet", "ptopt.models.resnet:resnet", "1:32:256"),
    ("bert", "bench_gpu:bert_encoder", "1:8:64"),
)


def package_path(work: Path, name: str, graphs: bool) -> Path:
    return work / f"{name}{'.graphs' if graphs else ''}.pt2"


def export_cmd(factory: str, out: Path, batch: str, graphs: bool) -> list[str]:
    """``ptopt export FACTORY --target aoti --device cuda --precision fp16 [--cuda-graphs]``."""
    cmd = [
        sys.executable,
        "-X",
        "faulthandler",
        "-m",
        "ptopt.cli.main",
        "export",
        factory,
        "--target",
        "aoti",
        "--device",
        "cuda",
    ]
    return (
        cmd
        + ["--precision", "fp16", "--dynamic-batch", batch, "-o", str(out)]
        + (["--cuda-graphs"] if graphs else [])
    )


def failure_reason(text: str, code: int | None) -> str:
    """One line for a failed export: Python's last error line, or, for a crash, faulthandler's "Fatal
    Python error" with the innermost frame of the crashing thread (its report ends in a list of modules)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    fatal = next((ln for ln in lines if ln.startswith("Fatal Python error:")), None)
    if fatal or (lines and lines[-1].startswith("Extension modules:")):
        at = next((i for i, ln in enumerate(lines) if ln.startswith("Current thread")), None)
        frame = lines[at + 1] if at is not None and at + 1 < len(lines) else ""
        return f"{fatal or 'crashed (faulthandler report)'}{f' at {frame}' if frame else ''}"[:300]
    return (lines or [f"exit {code}"])[-1][:300]


def build_packages(work: Path, rebuild: bool = False, timeout_s: float = 900) -> dict[str, str]:
    """Every fp16 AOTInductor package not yet in ``work``, built at once by concurrent ``ptopt export``
    subprocesses (what a user runs; a compiler crash costs that row, not the run). {file: why it failed}.
    A package that failed before (its ``.failed.txt`` is there) is not tried again unless ``rebuild``; an
    export still running after ``timeout_s`` is stopped and counts as failed."""
    import time

    here = str(Path(__file__).resolve().parent)  # bench_gpu:bert_encoder must import in the subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    procs = {}
    for name, factory, batch in PACKAGES:
        for graphs in (False, True):
            out = package_path(work, name, graphs)
            log = work / f"{out.name}.failed.txt"
            if out.exists() or (log.exists() and not rebuild):
                continue
            with open(log, "w") as err:  # stderr to a file: no pipe to fill up; removed when it succeeds
                cmd = export_cmd(factory, out, batch, graphs)
                procs[out.name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env), log)
    failed, deadline = {}, time.monotonic() + timeout_s
    for file, (proc, log) in procs.items():
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            log.write_text(log.read_text() + f"\nstopped after {timeout_s:.0f} s\n")
        if proc.returncode == 0:
            log.unlink()
        else:
            failed[file] = failure_reason(log.read_text(), proc.returncode)
    return failed


def runtimes(name: str, module, work: Path) -> tuple[dict, dict]:
    """{runtime: callable on a device batch} and {runtime: why it is missing}."""
    import torch

    from ptopt.core.cudagraph import CudaGraphed
    from ptopt.core.errors import PtoptError
    from ptopt.formats.aoti_files import load_package

    fp32 = module.cuda().eval()
    half = torch.compile(copy.deepcopy(module).half().cuda().eval())
    fns = {"fp32 eager": fp32, "fp16 torch.compile": half}
    missing = {}
    for graphs in (False, True):
        label = "fp16 AOTInductor" + (" + CUDA graphs" if graphs else "")
        out = package_path(work, name, graphs)
        if not out.exists():
            failed = work / f"{out.name}.failed.txt"
            missing[label] = failure_reason(failed.read_text(), None) if failed.exists() else "not built"
            continue
        try:
            pkg = load_package(out, device="cuda:0")
        except PtoptError as e:  # e.g. a torch whose AOTInductor loader crashes (checked in a child process)
            missing[label] = str(e)[:300]
            continue
        fns[label] = CudaGraphed(pkg, "cuda:0") if graphs else pkg
    return fns, missing


def measure(name: str, fns: dict, inputs: dict, rounds: int, seconds: float) -> list[dict]:
    """Latency per (runtime, batch) interleaved with CUDA events, and each fp16 output vs fp32."""
    import torch

    from ptopt.core.device import to_device
    from ptopt.core.inputspec import call_model
    from ptopt.core.tensors import flatten_outputs
    from ptopt.core.timing import measure_interleaved
    from ptopt.export.parity import compare

    calls, sizes, rows = {}, {}, []
    for bs, x in inputs.items():
        for rt, fn in fns.items():
            xd = to_device(x, "cuda:0", None if rt == "fp32 eager" else torch.float16)

            def run(fn=fn, xd=xd):
                with torch.inference_mode():
                    return call_model(fn, xd)

            calls[(rt, bs)], sizes[(rt, bs)] = run, bs
    stats = measure_interleaved(
        calls, sizes, rounds=rounds, min_iters=50, min_seconds=seconds, warmup_iters=10, warmup_seconds=1.0,
        devices={k: "cuda:0" for k in calls},
    )  # fmt: skip
    for bs in inputs:
        ref = flatten_outputs(calls[("fp32 eager", bs)]())
        for rt in fns:
            st = stats[(rt, bs)]
            diff = compare(ref, flatten_outputs(calls[(rt, bs)]())) if rt != "fp32 eager" else None
            rows.append({
                "model": name, "runtime": rt, "batch": bs, "p50_ms": st["p50_ms"],
                "spread_pct": st["round_spread_pct"],
                "speedup": stats[("fp32 eager", bs)]["p50_ms"] / st["p50_ms"],
                "max_abs_diff": None if diff is None else diff["max_abs_diff"],
                "rel_error": None if diff is None else diff["rel_error"],
                "cosine": None if diff is None else diff["cosine"],
            })  # fmt: skip
    return rows


def validate_vs_bare(work: Path, batch: int = 32, calls: int = 200) -> dict:
    """``ptopt validate --device cuda``'s p50 for the fp16 ResNet package at ``batch`` against a bare
    loop of CUDA events around each call of the same package (median of ``calls``)."""
    import statistics

    import torch

    from ptopt.core.errors import PtoptError
    from ptopt.formats.aoti_files import load_package
    from ptopt.validate.api import validate

    path = package_path(work, "resnet", False)
    if not path.exists():
        return {"skipped": "the fp16 ResNet package was not built"}
    try:
        res = validate("ptopt.models.resnet:resnet", [path], "builtin:digits32:test", batch_sizes=(batch,),
                       threads=THREADS, device="cuda", max_samples=512, allow_pickle=True)  # fmt: skip
        pkg = load_package(path, device="cuda:0")
    except PtoptError as e:
        return {"skipped": str(e)[:300]}
    lat = res.entries[0]["latency"][str(batch)]
    x = torch.randn(batch, 1, 32, 32, device="cuda:0", dtype=torch.float16)
    times = []
    with torch.inference_mode():
        for i in range(calls + 20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            pkg(x)
            end.record()
            end.synchronize()
            if i >= 20:
                times.append(start.elapsed_time(end))
    bare = statistics.median(times)
    return {"batch": batch, "validate_p50_ms": lat["p50_ms"], "timer": lat.get("timer"), "bare_p50_ms": bare,
            "ratio": lat["p50_ms"] / bare}  # fmt: skip


def report(facts: dict, rows: list[dict], missing: dict, check: dict, machine: str | None = None) -> None:
    table = md_table(
        ["model", "runtime", "batch", "p50 ms", "spread %", "× fp32 eager", "max |diff| vs fp32", "rel", "cosine"],
        [
            [r["model"], r["runtime"], r["batch"], f"{r['p50_ms']:.3f}", f"{r['spread_pct']:.1f}",
             f"{r['speedup']:.2f}", *(("", "", "") if r["cosine"] is None else
             (f"{r['max_abs_diff']:.3g}", f"{r['rel_error']:.3g}", f"{r['cosine']:.5f}"))]
            for r in rows
        ],
    )  # fmt: skip
    head = (
        f"GPU: {facts['gpu']}, driver {facts['driver']}, CUDA {facts['cuda']}, torch {facts['torch']}. "
        "Random weights; latency from CUDA events, interleaved rounds, inputs already on the GPU."
    )
    notes = "".join(f"\n- not measured: {k}: {v}" for k, v in missing.items())
    if "ratio" in check:
        notes += (
            f"\n- `ptopt validate --device cuda` on the fp16 ResNet package at batch {check['batch']}: p50 "
            f"{check['validate_p50_ms']:.3f} ms ({check['timer']}); a bare loop of CUDA events around each call "
            f"of the same package: {check['bare_p50_ms']:.3f} ms; ratio {check['ratio']:.3f}"
        )
    if "skipped" in check:
        notes += f"\n- not measured: `ptopt validate --device cuda` against a bare CUDA-event loop: {check['skipped']}"
    md = f"{head}\n\n{table}\n{notes}"
    machine = machine or machine_header(THREADS)
    data = {"facts": facts, "rows": rows, "missing": missing, "validate_vs_bare": check, "machine": machine}
    title = "GPU: fp16 AOTInductor vs torch.compile fp16 vs fp32 eager"
    write_result("gpu", title, md, data, THREADS, command=COMMAND, machine=machine)


def render(path: Path) -> None:
    """The tables again from a results JSON (e.g. one brought back from the GPU machine), with the machine
    header of that run: from the JSON, or the ``Machine:`` line of the .md beside it."""
    data = json.loads(path.read_text())
    machine = data.get("machine")
    if not machine and path.with_suffix(".md").exists():
        lines = path.with_suffix(".md").read_text().splitlines()
        machine = next((ln for ln in lines if ln.startswith("Machine:")), None)
    missing = {k: failure_reason(v, None) for k, v in data["missing"].items()}
    report(data["facts"], data["rows"], missing, data["validate_vs_bare"], machine)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="keep the packages here (built ones are reused)")
    ap.add_argument("--build-only", action="store_true", help="build the packages into --work and stop")
    ap.add_argument(
        "--rebuild", action="store_true", help="try again the packages that failed to build before"
    )
    ap.add_argument("--build-timeout", type=float, default=900, help="seconds the exports get, all together")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    ap.add_argument(
        "--render", type=Path, help="only write the tables again from a results JSON of this script"
    )
    ap.add_argument(
        "--seconds", type=float, default=0.5, help="timed seconds per runtime and batch (default 0.5)"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import torch

    from ptopt.core.device import cuda_status

    args = parse_args(argv)
    if args.render:
        return render(args.render)
    if not torch.cuda.is_available():
        sys.exit(f"bench_gpu: needs a CUDA GPU, and {cuda_status()}; run it on a machine with one")
    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory(prefix="ptopt-bench-gpu-") as d:
        work = args.work or Path(d)
        work.mkdir(parents=True, exist_ok=True)
        failed = build_packages(
            work, rebuild=args.rebuild, timeout_s=args.build_timeout
        )  # each failure is named again by its row below
        if args.build_only:
            print("\n".join(f"{k}: {v}" for k, v in failed.items()) or f"built into {work}")
            return
        fns, miss = runtimes("resnet", resnet(), work)
        missing = {f"resnet: {k}": v for k, v in miss.items()}
        inputs = {b: torch.randn(b, 1, 32, 32) for b in RESNET_BATCHES}
        rows = measure("zoo ResNet", fns, inputs, args.rounds, args.seconds)
        enc = bert_encoder()
        fns, miss = runtimes("bert", enc, work)
        missing |= {f"bert: {k}": v for k, v in miss.items()}
        inputs = {b: enc.example_inputs(b) for b in BERT_BATCHES}
        rows += measure("BERT 6x384, 128 tokens", fns, inputs, args.rounds, args.seconds)
        check = validate_vs_bare(work)
    report(gpu_facts(), rows, missing, check)


if __name__ == "__main__":
    main()
