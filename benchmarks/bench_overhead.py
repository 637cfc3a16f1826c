"""ptopt against the raw library calls it wraps, on the same model and data (2 threads).

- static int8: ``ptopt.quantize(..., "static")`` vs hand-written torch.ao FX (prepare_fx with
  get_default_qconfig_mapping("x86"), 32 calibration batches, convert_fx, trace + freeze);
- int8 ONNX: ``ptopt.export(int8 artifact, "onnx")`` vs hand-written onnxruntime.quantization
  (quant_pre_process + quantize_static, QDQ, per-channel, reduce_range);
- validation: wall time of ``ptopt.validate`` for one artifact vs the bare timing loop it runs.

Ratios near 1.0 mean ptopt costs nothing over doing it by hand.

    python benchmarks/bench_overhead.py [--threads 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quantize import _accuracy, _latency, _load_ts, _ort_sessions  # noqa: E402
from common import md_table, setup, write_result  # noqa: E402


def raw_fx_int8(model, calib, x, path):
    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.quantized.engine = "x86"
        import copy

        prepared = prepare_fx(copy.deepcopy(model).eval(), get_default_qconfig_mapping("x86"), (x,))
        with torch.inference_mode():
            for i, b in enumerate(calib.batches(32, shuffle=True, seed=0)):
                if i == 32:
                    break
                prepared(b.x)
        q = convert_fx(prepared)
        with torch.no_grad():
            ts = torch.jit.freeze(torch.jit.trace(q, x).eval())
        torch.jit.save(ts, str(path))
    return _load_ts(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    threads = setup(args.threads)
    import numpy as np

    from ptopt.compress.quantize import quantize
    from ptopt.core.data import load_data
    from ptopt.core.modelref import load_model
    from ptopt.export.api import export
    from ptopt.validate.api import validate

    train, test = load_data("builtin:digits32:train"), load_data("builtin:digits32:test")
    model = load_model("zoo:resnet").module.eval()
    x = test.first_batch(2).x
    work = Path(tempfile.mkdtemp(prefix="ptopt-bench-overhead-"))
    t0 = time.perf_counter()
    raw_ts = raw_fx_int8(model, train, x, work / "raw.int8.pt")
    t_raw = time.perf_counter() - t0
    t0 = time.perf_counter()
    art = quantize(
        "zoo:resnet", "static", work / "ptopt.int8.pt", calib_data="builtin:digits32:train", progress=False
    )
    t_ptopt = time.perf_counter() - t0
    ptopt_ts = _load_ts(art.path)
    ort = _ort_sessions(model, train, x, work, threads)
    t0 = time.perf_counter()
    onnx_art = export(art.path, "onnx", work / "ptopt.int8.onnx", data="builtin:digits32:train")
    t_export = time.perf_counter() - t0
    import onnxruntime as ort_mod

    opts = ort_mod.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort_mod.InferenceSession(str(onnx_art.path), opts, providers=["CPUExecutionProvider"])
    in_name = sess.get_inputs()[0].name
    ptopt_onnx = lambda a: sess.run(None, {in_name: np.asarray(a)})[0]  # noqa: E731

    cands = {
        "raw torch.ao FX int8": raw_ts,
        "ptopt static int8": ptopt_ts,
        "raw ORT int8 (QDQ)": ort["ORT int8 (QDQ)"],
        "ptopt int8 ONNX": ptopt_onnx,
    }
    inputs = {1: test.first_batch(1).x, 32: test.first_batch(32).x}
    lat = _latency(cands, inputs, args.rounds, args.seconds)
    acc = {n: _accuracy(fn, test) for n, fn in cands.items()}
    size = {
        "raw torch.ao FX int8": os.path.getsize(work / "raw.int8.pt"),
        "ptopt static int8": art.size_bytes,
        "raw ORT int8 (QDQ)": ort["ORT int8 (QDQ):bytes"],
        "ptopt int8 ONNX": onnx_art.size_bytes,
    }
    rows = []
    for raw, mine in (
        ("raw torch.ao FX int8", "ptopt static int8"),
        ("raw ORT int8 (QDQ)", "ptopt int8 ONNX"),
    ):
        for n in (raw, mine):
            rows.append([n, f"{lat[n][1]:.3f}", f"{lat[n][32]:.2f}", f"{size[n]:,}", f"{acc[n] * 100:.2f}"])
        rows.append(
            [
                "**ratio ptopt / raw**",
                f"{lat[mine][1] / lat[raw][1]:.2f}",
                f"{lat[mine][32] / lat[raw][32]:.2f}",
                f"{size[mine] / size[raw]:.2f}",
                f"{(acc[mine] - acc[raw]) * 100:+.2f} pts",
            ]
        )

    # validation overhead: ptopt.validate on one artifact vs the bare loops it runs
    t0 = time.perf_counter()
    validate(
        "zoo:resnet", [str(art.path)], test, batch_sizes=(1, 32), threads=threads, min_seconds=args.seconds
    )
    t_validate = time.perf_counter() - t0
    from ptopt.core.timing import measure_latency

    t0 = time.perf_counter()
    import torch

    with torch.inference_mode():
        for m in (model, ptopt_ts):
            _accuracy(m, test)
            for bs, xb in inputs.items():
                measure_latency(lambda m=m, xb=xb: m(xb), bs, min_seconds=args.seconds)
    t_bare = time.perf_counter() - t0

    md = md_table(["zoo:resnet, 2 threads", "p50 ms @1", "p50 ms @32", "bytes", "top-1 % / drop"], rows)
    md += (
        f"\n\nWall time: raw FX quantization {t_raw:.1f} s vs `ptopt quantize` {t_ptopt:.1f} s (which also "
        f"traces, reloads and checks the TorchScript and writes the sidecar); `ptopt export` to int8 ONNX "
        f"{t_export:.1f} s (ORT quantization of the fp32 parent plus the parity check).\n\n"
        f"Validation overhead: `ptopt.validate` of the reference + 1 artifact at batch 1 and 32 took "
        f"{t_validate:.1f} s; the bare accuracy + timing loops it runs took {t_bare:.1f} s "
        f"(ratio {t_validate / t_bare:.2f}: loading, input checks, agreement metrics, peak memory, reports)."
    )
    write_result(
        "overhead",
        "ptopt vs the raw library calls",
        md,
        {
            "latency_ms": lat,
            "accuracy": acc,
            "bytes": size,
            "seconds": {
                "raw_fx": t_raw,
                "ptopt_quantize": t_ptopt,
                "ptopt_export": t_export,
                "validate": t_validate,
                "bare_loops": t_bare,
            },
        },
        threads,
    )


if __name__ == "__main__":
    main()
