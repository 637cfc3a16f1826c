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

    python benchmarks/bench_gpu.py            # needs a CUDA GPU; exits with a message elsewhere

Install ptopt on the GPU machine without touching its torch: ``pip install --no-deps
--no-build-isolation ./`` (``transformers`` is needed for the BERT encoder).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import md_table, write_result  # noqa: E402

THREADS = 2
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


def export_aoti(factory: str, out: Path, batch: str, graphs: bool) -> str | None:
    """``ptopt export FACTORY --target aoti --device cuda --precision fp16``; None, or why it failed."""
    cmd = [sys.executable, "-m", "ptopt.cli.main", "export", factory, "--target", "aoti", "--device", "cuda"]
    cmd += ["--precision", "fp16", "--dynamic-batch", batch, "-o", str(out)] + (
        ["--cuda-graphs"] if graphs else []
    )
    here = str(Path(__file__).resolve().parent)  # bench_gpu:bert_encoder must import in the subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if run.returncode != 0:
        return (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1][:300]
    return None


def runtimes(name: str, module, factory: str, batch_range: str, work: Path) -> tuple[dict, dict]:
    """{runtime: callable on a device batch} and {runtime: why it is missing}."""
    import torch

    from ptopt.core.cudagraph import CudaGraphed
    from ptopt.formats.aoti_files import load_package

    fp32 = module.cuda().eval()
    half = torch.compile(copy.deepcopy(module).half().cuda().eval())
    fns = {"fp32 eager": fp32, "fp16 torch.compile": half}
    missing = {}
    for graphs in (False, True):
        label = "fp16 AOTInductor" + (" + CUDA graphs" if graphs else "")
        out = work / f"{name}{'.graphs' if graphs else ''}.pt2"
        why = export_aoti(factory, out, batch_range, graphs)
        if why:
            missing[label] = why
            continue
        pkg = load_package(out, device="cuda:0")
        fns[label] = CudaGraphed(pkg, "cuda:0") if graphs else pkg
    return fns, missing


def measure(name: str, fns: dict, inputs: dict) -> list[dict]:
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
        calls, sizes, rounds=10, min_iters=50, min_seconds=2.0, warmup_iters=10, warmup_seconds=1.0,
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


def main() -> None:
    import torch

    from ptopt.core.device import cuda_status

    if not torch.cuda.is_available():
        sys.exit(f"bench_gpu: needs a CUDA GPU, and {cuda_status()}; run it on a machine with one")
    torch.set_num_threads(THREADS)
    facts = gpu_facts()
    rows, missing = [], {}
    with tempfile.TemporaryDirectory(prefix="ptopt-bench-gpu-") as d:
        work = Path(d)
        fns, miss = runtimes("resnet", resnet(), "ptopt.models.resnet:resnet", "1:32:256", work)
        missing |= {f"resnet: {k}": v for k, v in miss.items()}
        rows += measure("zoo ResNet", fns, {b: torch.randn(b, 1, 32, 32) for b in RESNET_BATCHES})
        enc = bert_encoder()
        fns, miss = runtimes("bert", enc, "bench_gpu:bert_encoder", "1:8:64", work)
        missing |= {f"bert: {k}": v for k, v in miss.items()}
        rows += measure("BERT 6x384, 128 tokens", fns, {b: enc.example_inputs(b) for b in BERT_BATCHES})
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
    md = f"{head}\n\n{table}\n{notes}"
    data = {"facts": facts, "rows": rows, "missing": missing}
    write_result("gpu", "GPU: fp16 AOTInductor vs torch.compile fp16 vs fp32 eager", md, data, THREADS)


if __name__ == "__main__":
    main()
