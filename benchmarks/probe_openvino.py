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
    from ptopt.formats.openvino import _bound_inputs, _convert_via_onnx

    threads = 2
    br._common().setup(threads)
    case = br.minilm_case(True)
    d = Path(tempfile.mkdtemp(prefix="ptopt-ovprobe-"))
    onnx = br.fp32_onnx(case, d)
    from ptopt.core.inputspec import InputSpec

    x2 = case.tune.first_batch(2).x
    specs = [InputSpec(n, (1, 32), (8, 32), (64, 32), "int64") for n in x2]
    core = ov.Core()
    from ptopt.formats.capture import export_program

    ep_ir = ov.convert_model(export_program(case.model, specs, "keyword"))  # the IR ptopt wrote before
    _bound_inputs(ep_ir, specs)
    variants = {}
    base = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}

    def add(name, model, cfg):
        c = core.compile_model(model, "CPU", cfg)
        names = [p.get_any_name() for p in model.inputs]
        print(
            name,
            {
                k: str(c.get_property(k))
                for k in (
                    "INFERENCE_PRECISION_HINT",
                    "NUM_STREAMS",
                    "INFERENCE_NUM_THREADS",
                    "PERFORMANCE_HINT",
                    "EXECUTION_MODE_HINT",
                )
            },
        )
        variants[name] = (c, names)

    onnx_model = core.read_model(str(onnx))
    add("onnx default", onnx_model, base)
    add("ExportedProgram IR, bf16 hint (ptopt before)", ep_ir, {**base, "INFERENCE_PRECISION_HINT": "bf16"})
    via = _convert_via_onnx(case.model, specs, "keyword", "probe")
    _bound_inputs(via, specs)
    add("ptopt onnx path, bounded", via, base)
    import ptopt

    art = ptopt.export(case.model, "openvino", d / "ptopt.xml", precision="bf16", data=case.tune)
    print("ptopt export bf16:", art.extra["converted_from"])
    from ptopt.validate.runners import open_runner

    runner = open_runner(str(d / "ptopt.xml"), "ptopt")
    runner.prepare(threads)
    xs = {1: case.unseen.first_batch(1).x, 64: case.unseen.first_batch(64).x}
    fns, sizes = {}, {}
    for name, (c, names) in variants.items():
        for bs, x in xs.items():
            feed = {n: x[n].numpy() for n in names}
            fns[(name, bs)] = lambda c=c, f=feed: c(f)
            sizes[(name, bs)] = bs
    variants["ptopt export bf16, its runner"] = None
    for bs, x in xs.items():
        fns[("ptopt export bf16, its runner", bs)] = runner.timed_call(x)
        sizes[("ptopt export bf16, its runner", bs)] = bs
    with torch.inference_mode():
        st = measure_interleaved(fns, sizes, rounds=9, min_iters=5, min_seconds=9 * 0.3)
    for name in variants:
        print(f"{name:46s} @1 {st[(name, 1)]['p50_ms']:7.2f} ms   @64 {st[(name, 64)]['p50_ms']:8.2f} ms")
    ops = lambda m: sorted({o.get_type_name() for o in m.get_ops()})  # noqa: E731
    print("ep ops", len(ep_ir.get_ops()), ops(ep_ir))
    print("onnx ops", len(onnx_model.get_ops()), ops(onnx_model))


if __name__ == "__main__":
    from ptopt.formats.openvino import telemetry_off

    with telemetry_off():  # the peers' OpenVINO / NNCF calls send no telemetry either, as ptopt's do not
        main()
