"""Why the fixed-batch AOTInductor package still trails ONNX Runtime at batch 1: Inductor's options
tried side by side, and the per-call floor.

zoo:resnet (builtin:digits32 shapes, 1×32×32) at batch 1 and 32. For each batch: fixed-batch packages
compiled with Inductor's defaults plus freezing (what ``ptopt export --target aoti --static-batch``
builds), with ``max_autotune``, without weight prepacking, and without the layout (channels-last)
optimization; beside them eager and ONNX Runtime (2 intra-op threads), all timed in the same
interleaved rounds. Last, the per-call floor: a one-convolution model as a package vs eager at batch 1.

Run: PTOPT_CACHE_DIR=/work/notes/zoo-cache python benchmarks/bench_aoti_options.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, setup, write_result  # noqa: E402

THREADS = setup(2)

import torch  # noqa: E402

import ptopt  # noqa: E402
from ptopt.core.inputspec import make_inputs  # noqa: E402
from ptopt.core.modelref import load_model  # noqa: E402
from ptopt.core.timing import measure_interleaved  # noqa: E402
from ptopt.export.writers import write_model  # noqa: E402
from ptopt.formats.aoti_files import load_package  # noqa: E402
from ptopt.formats.onnx_session import onnx_session  # noqa: E402

# the compile is what is timed here: never a package from ptopt's compile cache (formats/aoti_cache.py)
os.environ["PTOPT_AOTI_CACHE"] = "0"

ROUNDS, MIN_SECONDS = 9, 2.0
VARIANTS = {
    "defaults + freezing (ptopt)": {},
    "max_autotune": {"max_autotune": True},
    "no weight prepack": {"cpp.weight_prepack": False},
    "no layout optimization": {"layout_optimization": False},
}


def _call(model, x):
    def run():
        with torch.no_grad():
            return model(x)

    return run


def per_batch(module, specs, batch: int, work: Path) -> tuple[list[list], dict]:
    fixed = [s.with_batch(batch, batch, batch) for s in specs]
    fns, seconds = {}, {}
    x = make_inputs(fixed, "positional", which="opt", seed=batch)
    for name, cfg in VARIANTS.items():
        path = work / f"{len(fns)}-{batch}.pt2"
        facts = write_model(
            module, "aoti_package", path, specs=fixed, style="positional", inductor_configs=cfg
        )
        seconds[name] = facts["extra"]["compile_seconds"]
        fns[name] = _call(load_package(path), x)
    onnx = ptopt.export(module, "onnx", work / f"m{batch}.onnx", input_specs=specs)
    sess = onnx_session(onnx.path, THREADS)
    feed = {sess.get_inputs()[0].name: x.numpy()}
    fns["eager"] = _call(module, x)
    fns["ONNX Runtime"] = lambda: sess.run(None, feed)
    st = measure_interleaved(fns, {k: batch for k in fns}, rounds=ROUNDS, min_seconds=MIN_SECONDS)
    ort = st["ONNX Runtime"]
    rows = [
        [batch, k, f"{v['p50_ms']:.3f}", f"{ort['p50_ms'] / v['p50_ms']:.2f}× / {ort['min_ms'] / v['min_ms']:.2f}×",
         f"{seconds[k]:.0f}" if k in seconds else "", f"{v['round_spread_pct']:.0f} %"]
        for k, v in st.items()
    ]  # fmt: skip
    return rows, {"stats": st, "compile_seconds": seconds}


def floor(work: Path) -> tuple[str, dict]:
    """One 3×3 convolution (1 → 8 channels, 32×32) as a fixed-batch package vs eager, batch 1."""
    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3)).eval()
    ref = ptopt.export(conv, "aoti", work / "conv.pt2", input_shapes="1x1x32x32", dynamic_batch="1:1:1")
    x = torch.randn(1, 1, 32, 32)
    st = measure_interleaved({"package": _call(ref.model, x), "eager": _call(conv, x)}, {"package": 1, "eager": 1},
                             rounds=ROUNDS, min_seconds=1.0)  # fmt: skip
    p, e = st["package"]["p50_ms"], st["eager"]["p50_ms"]
    return f"one-convolution package {p * 1000:.0f} µs per call, eager {e * 1000:.0f} µs (p50)", st


def main() -> None:
    resnet = load_model("zoo:resnet")
    module, specs = resnet.module.eval(), resnet.input_specs
    rows, data = [], {"load_avg_at_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as d:
        for b in (1, 32):
            r, data[f"batch{b}"] = per_batch(module, specs, b, Path(d))
            rows += r
        line, data["floor"] = floor(Path(d))
    data["load_avg_at_end"] = os.getloadavg()
    headers = [
        "batch",
        "runtime / Inductor options",
        "p50 ms",
        "vs ORT (p50 / min)",
        "compile s",
        "round spread",
    ]
    md = (
        "### zoo:resnet, fixed-batch AOTInductor packages vs ONNX Runtime (same interleaved rounds)\n\n"
        + md_table(headers, rows)
        + f"\n\nPer-call floor at batch 1: {line}.\n\nLoad average at the start: "
        + " / ".join(f"{v:.1f}" for v in data["load_avg_at_start"])
        + ", at the end: "
        + " / ".join(f"{v:.1f}" for v in data["load_avg_at_end"])
        + "."
    )
    write_result("aoti_options", "AOTInductor options at a fixed batch vs ONNX Runtime", md, data, THREADS)


if __name__ == "__main__":
    main()
