"""Why is ptopt's bf16 OpenVINO IR of MiniLM slower than the ONNX read with the plugin's defaults?

One process, interleaved rounds, 2 threads: the same model converted the ways ptopt and a user do, and
compiled with different properties. Prints p50 ms at batch 1 and 64 for each variant.

    flock /tmp/ptopt-bench.lock python benchmarks/probe_openvino.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    import openvino as ov
    import torch

    sys.path.insert(0, str(HERE))
    import bench_real as br

    from ptopt.core.timing import measure_interleaved
    from ptopt.formats.openvino import _convert

    threads = 2
    br._common().setup(threads)
    case = br.minilm_case(True)
    d = Path(tempfile.mkdtemp(prefix="ptopt-ovprobe-"))
    onnx = br.fp32_onnx(case, d)
    from ptopt.core.inputspec import InputSpec

    x2 = case.tune.first_batch(2).x
    specs = [InputSpec(n, (1, 32), (8, 32), (64, 32), "int64") for n in x2]
    core = ov.Core()
    ep_ir, how = _convert(case.model, specs, "keyword")
    print("ptopt IR from", how)
    variants = {}
    base = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}

    def add(name, model, cfg):
        c = core.compile_model(model, "CPU", cfg)
        names = [p.get_any_name() for p in model.inputs]
        print(name, {k: str(c.get_property(k)) for k in ("INFERENCE_PRECISION_HINT", "NUM_STREAMS",
              "INFERENCE_NUM_THREADS", "PERFORMANCE_HINT", "EXECUTION_MODE_HINT")})
        variants[name] = (c, names)

    onnx_model = core.read_model(str(onnx))
    add("onnx default", onnx_model, base)
    add("ep-ir bf16 hint (ptopt)", ep_ir, {**base, "INFERENCE_PRECISION_HINT": "bf16"})
    ep_dyn, _ = _convert(case.model, specs, "keyword")
    ep_dyn.reshape({p.get_any_name(): ov.PartialShape([-1, 32]) for p in ep_dyn.inputs})
    add("ep-ir unbounded default", ep_dyn, base)
    onnx_b = core.read_model(str(onnx))
    onnx_b.reshape({p.get_any_name(): ov.PartialShape([ov.Dimension(1, 64), 32]) for p in onnx_b.inputs})
    add("onnx bounded default", onnx_b, base)
    from ptopt.formats.openvino import _bound_inputs, _convert_via_onnx

    via = _convert_via_onnx(case.model, specs, "keyword", "probe")
    _bound_inputs(via, specs)
    add("ptopt onnx path, bounded", via, base)
    via2 = _convert_via_onnx(case.model, specs, "keyword", "probe")
    add("ptopt onnx path, unbounded", via2, base)
    xs = {1: case.unseen.first_batch(1).x, 64: case.unseen.first_batch(64).x}
    fns, sizes = {}, {}
    for name, (c, names) in variants.items():
        for bs, x in xs.items():
            feed = {n: x[n].numpy() for n in names}
            fns[(name, bs)] = lambda c=c, f=feed: c(f)
            sizes[(name, bs)] = bs
    with torch.inference_mode():
        st = measure_interleaved(fns, sizes, rounds=9, min_iters=5, min_seconds=9 * 0.3)
    for name in variants:
        print(f"{name:32s} @1 {st[(name, 1)]['p50_ms']:7.2f} ms   @64 {st[(name, 64)]['p50_ms']:8.2f} ms")
    ops = lambda m: sorted({o.get_type_name() for o in m.get_ops()})  # noqa: E731
    print("ep ops", len(ep_ir.get_ops()), ops(ep_ir))
    print("onnx ops", len(onnx_model.get_ops()), ops(onnx_model))


if __name__ == "__main__":
    main()
