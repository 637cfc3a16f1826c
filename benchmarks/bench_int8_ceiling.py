"""What int8 can reach on this CPU at all: raw torch.ao (FX, x86 engine) and raw ONNX Runtime static
int8 against fp32, on four ResNet-style CNNs for 1×32×32 inputs, with no ptopt code in the loop.

The issues' int8 speed targets (static int8 ≥ 3× eager at batch 32, int8 ONNX ≥ 2.5× fp32 ONNX at
batch 32) are stated as "what raw torch / raw ORT reaches on this machine". This script checks that
claim on several architectures, so a shortfall can be told apart from ptopt overhead:

- ``zoo``: the zoo ResNet (widths 32/64/128, one basic block per stage);
- ``resnet20`` / ``resnet14``: the CIFAR ResNets of He et al. (widths 16/32/64, 3 or 2 blocks per stage);
- ``wide2``: widths 32/64/128 with 2 blocks per stage.

Weights are random with randomized BatchNorm statistics (speed does not depend on trained values);
calibration uses 8 batches of builtin:digits32:train. Every candidate is timed in interleaved rounds
(``ptopt.core.timing.measure_interleaved``) at 2 intra-op threads. A per-layer table shows the
kernel-level ratio: each conv of the zoo ResNet timed alone, fp32 (oneDNN) vs int8 (fbgemm).

    python benchmarks/bench_int8_ceiling.py [--threads 2] [--seconds 1.5] [--rounds 6]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, setup, write_result  # noqa: E402

ARCHS = {
    "zoo": dict(),
    "resnet20": dict(widths=(16, 32, 64), blocks=(3, 3, 3)),
    "resnet14": dict(widths=(16, 32, 64), blocks=(2, 2, 2)),
    "wide2": dict(widths=(32, 64, 128), blocks=(2, 2, 2)),
}


def build(kw):
    import torch

    from ptopt.models.resnet import ResNet

    torch.manual_seed(0)
    m = ResNet(**kw).eval()
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    return m


def fx_int8(m, x, calib):
    """Raw FX graph mode, x86 engine: prepare, calibrate, convert (a GraphModule)."""
    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "x86"
    p = prepare_fx(copy.deepcopy(m), get_default_qconfig_mapping("x86"), (x,))
    with torch.inference_mode():
        for b in calib:
            p(b)
    return convert_fx(p)


def torch_int8(m, x, calib):
    import torch

    return torch.jit.freeze(torch.jit.trace(fx_int8(m, x, calib), x).eval())


def ort_sessions(m, x, calib, work: Path, name: str, threads: int):
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32, pre, int8 = (str(work / f"{name}{s}") for s in (".onnx", ".pre.onnx", ".int8.onnx"))
    torch.onnx.export(
        m,
        (x,),
        fp32,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    quant_pre_process(fp32, pre)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input": b.numpy()} for b in calib])

        def get_next(self):
            return next(self.it, None)

    quantize_static(
        pre,
        int8,
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        reduce_range=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return (
        ort.InferenceSession(fp32, opts, providers=["CPUExecutionProvider"]),
        ort.InferenceSession(int8, opts, providers=["CPUExecutionProvider"]),
    )


def per_layer(m, x, int8_module_fx, rounds, seconds):
    """Each conv of ``m`` alone at its real input shape: fp32 module vs the int8 module FX made of it."""
    import torch

    from ptopt.core.timing import measure_interleaved

    def conv_inputs(model, is_conv):
        """{name: the input tensor} of every module ``is_conv`` accepts, from one forward pass."""
        seen = {}
        hooks = [
            mod.register_forward_hook(lambda mod, i, o, n=n: (seen.setdefault(n, i[0]), None)[1])
            for n, mod in model.named_modules()
            if n and is_conv(mod)
        ]
        with torch.inference_mode():
            model(x)
        for h in hooks:
            h.remove()
        return seen

    fp_in = conv_inputs(m, lambda mod: isinstance(mod, torch.nn.Conv2d))
    q_in = conv_inputs(int8_module_fx, lambda mod: "Conv" in type(mod).__name__)
    qmods = {n: mod for n, mod in int8_module_fx.named_modules() if n in q_in}
    convs = dict(m.named_modules())
    fns = {}
    for n in qmods:
        if n in fp_in:
            fns[(n, "fp32")] = lambda c=convs[n], t=fp_in[n]: c(t)
            fns[(n, "int8")] = lambda c=qmods[n], t=q_in[n]: c(t)
    with torch.inference_mode():
        st = measure_interleaved(fns, rounds=rounds, min_seconds=seconds)
    rows = []
    for n in qmods:
        if n not in fp_in:
            continue
        c = convs[n]
        a, b = st[(n, "fp32")]["p50_ms"], st[(n, "int8")]["p50_ms"]
        shape = (
            f"{c.in_channels}→{c.out_channels}, {c.kernel_size[0]}×{c.kernel_size[1]}, stride {c.stride[0]}"
        )
        rows.append(
            [n, shape, "×".join(map(str, fp_in[n].shape[1:])), f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}x"]
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=1.5, help="timed seconds per candidate and batch size")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    threads = setup(args.threads)
    import torch

    from ptopt.core.data import load_data
    from ptopt.core.timing import measure_interleaved

    warnings.simplefilter("ignore")
    train, test = load_data("builtin:digits32:train"), load_data("builtin:digits32:test")
    calib = [b.x for _, b in zip(range(8), train.batches(32, shuffle=True, seed=0), strict=False)]
    xs = {1: test.first_batch(1).x, 32: test.first_batch(32).x}
    tmp = tempfile.TemporaryDirectory(prefix="bench-ceiling-")
    work = Path(tmp.name)
    cwd = os.getcwd()
    os.chdir(work)  # ORT's quantization tools write temp files into the working directory
    fns, params = {}, {}
    try:
        for name, kw in ARCHS.items():
            m = build(kw)
            params[name] = sum(t.numel() for t in m.parameters())
            q = torch_int8(m, xs[32], calib)
            s32, s8 = ort_sessions(m, xs[32], calib, work, name, threads)
            for bs, x in xs.items():
                xn = x.numpy()
                fns[(name, bs, "eager")] = lambda m=m, x=x: m(x)
                fns[(name, bs, "int8")] = lambda q=q, x=x: q(x)
                fns[(name, bs, "ort32")] = lambda s=s32, x=xn: s.run(None, {"input": x})
                fns[(name, bs, "ort8")] = lambda s=s8, x=xn: s.run(None, {"input": x})
        with torch.inference_mode():
            st = measure_interleaved(fns, rounds=args.rounds, min_seconds=args.seconds)
        zoo = build(ARCHS["zoo"])
        layers = per_layer(zoo, xs[32], fx_int8(zoo, xs[32], calib), args.rounds, args.seconds / 2)
    finally:
        os.chdir(cwd)
        tmp.cleanup()
    rows, data = [], {}
    for name in ARCHS:
        for bs in (1, 32):
            g = {k: st[(name, bs, k)]["p50_ms"] for k in ("eager", "int8", "ort32", "ort8")}
            rows.append(
                [
                    name,
                    f"{params[name] / 1e6:.2f} M",
                    bs,
                    f"{g['eager']:.2f}",
                    f"{g['int8']:.2f}",
                    f"{g['eager'] / g['int8']:.2f}x",
                    f"{g['ort32']:.2f}",
                    f"{g['ort8']:.2f}",
                    f"{g['ort32'] / g['ort8']:.2f}x",
                ]
            )
            data[f"{name}@{bs}"] = g
    md = md_table(
        [
            "model",
            "params",
            "batch",
            "fp32 eager ms",
            "torch int8 ms",
            "torch int8 speedup",
            "ORT fp32 ms",
            "ORT int8 ms",
            "ORT int8 speedup",
        ],
        rows,
    )
    md += (
        "\n\nPer conv of the zoo ResNet at batch 32, each timed alone at its real input: fp32 (oneDNN) vs "
        "int8 (x86 engine, fbgemm on this CPU):\n\n"
    )
    md += md_table(["conv", "shape", "input", "fp32 ms", "int8 ms", "int8 speedup"], layers)
    best32 = max(data[f"{n}@32"]["eager"] / data[f"{n}@32"]["int8"] for n in ARCHS)
    best_ort = max(data[f"{n}@32"]["ort32"] / data[f"{n}@32"]["ort8"] for n in ARCHS)
    md += (
        f"\n\nBest raw torch int8 speedup at batch 32 over these models: {best32:.2f}x (issue target for ptopt: "
        f">= 3x). Best raw ORT int8 over ORT fp32 at batch 32: {best_ort:.2f}x (issue target: >= 2.5x)."
    )
    cmd = "python benchmarks/bench_int8_ceiling.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    write_result(
        "int8_ceiling",
        "What raw int8 reaches on this CPU (no ptopt code)",
        md,
        {"p50_ms": data, "per_layer": layers, "best_torch_bs32": best32, "best_ort_bs32": best_ort},
        threads,
        command=cmd,
    )


if __name__ == "__main__":
    main()
