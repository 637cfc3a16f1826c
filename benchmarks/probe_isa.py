"""Which runtime follows which CPU-level cap, measured: each probe op runs natively and in a child process
at each lower level this CPU reaches (the environment ``ptopt.core.isa.child_env`` gives it), and the
report says whether its output bits changed (another kernel ran) and what the libraries' own logs say
(oneDNN's ``ONEDNN_VERBOSE`` ISA line, MKL's ``MKL_VERBOSE`` header, ATen's CPU capability, OpenVINO's
runtime-graph primitive types). Writes ``benchmarks/results/isa_caps.json`` and ``.md``.

    python benchmarks/probe_isa.py [--levels avx,sse41]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_header, write_result  # noqa: E402

#: each probe: what it exercises, and the library that would cap it
PROBES = {
    "torch conv2d fp32": "oneDNN",
    "torch linear fp32": "MKL",
    "torch softmax + layer_norm + gelu fp32": "ATen",
    "torch int8 dynamic linear (fbgemm)": "FBGEMM",
    "torch int8 static conv (x86 engine)": "oneDNN / FBGEMM",
    "openvino conv fp32": "oneDNN (OpenVINO's)",
    "openvino fully-connected fp32": "MLAS (OpenVINO's)",
    "openvino int8 conv + fully-connected": "oneDNN (OpenVINO's)",
    "onnxruntime conv + matmul fp32": "MLAS",
    "onnxruntime int8 QDQ conv + matmul": "MLAS",
}


def _digest(t) -> str:
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(t).tobytes()).hexdigest()[:16]


def _torch_probes(out: dict) -> None:
    import torch

    torch.set_num_threads(1)
    x, a = _randn(4, 16, 24, 24), _randn(64, 512)
    conv, lin = _seeded(torch.nn.Conv2d(16, 32, 3)), _seeded(torch.nn.Linear(512, 512))
    with torch.inference_mode():
        out["torch conv2d fp32"] = _digest(conv(x).numpy())
        out["torch linear fp32"] = _digest(lin(a).numpy())
        h = torch.nn.functional.gelu(torch.nn.functional.layer_norm(torch.softmax(a * 3, -1), (512,)))
        out["torch softmax + layer_norm + gelu fp32"] = _digest(h.numpy())
        q = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear})
        out["torch int8 dynamic linear (fbgemm)"] = _digest(q(a * 50).numpy())
        out["torch int8 static conv (x86 engine)"] = _digest(_static_int8_conv(conv, x))
    out["aten capability"] = torch.backends.cpu.get_cpu_capability()


def _randn(*shape: int, seed: int = 0):
    """Random inputs from numpy: torch.randn's own kernels follow ATEN_CPU_CAPABILITY, so its numbers
    would differ between levels and every output with them."""
    import numpy as np
    import torch

    return torch.from_numpy(
        np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)
    )


def _seeded(module):
    """``module`` with weights from numpy (the same at every level), in eval mode."""
    import torch

    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(_randn(*p.shape, seed=i) * 0.1)
    return module.eval()


def _static_int8_conv(conv, x):
    import warnings

    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = "x86"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = torch.nn.Sequential(conv, torch.nn.ReLU()).eval()
        p = prepare_fx(m, get_default_qconfig_mapping("x86"), example_inputs=(x,))
        p(x)
        q = convert_fx(p)
    return q(x).numpy()


def _ov_model(seed: int = 0):
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(seed)
    p = ops.parameter([4, 16, 24, 24], np.float32, name="x")
    conv = ops.convolution(p, ops.constant(rng.standard_normal((32, 16, 3, 3), dtype=np.float32)),
                           [1, 1], [0, 0], [0, 0], [1, 1])  # fmt: skip
    flat = ops.reshape(
        p, [4, -1], False
    )  # the input itself: the FullyConnected's kernel alone decides its bits
    fc = ops.matmul(
        flat, ops.constant(rng.standard_normal((16 * 24 * 24, 64), dtype=np.float32)), False, False
    )
    return ov.Model([conv, fc], [p]), rng.standard_normal((4, 16, 24, 24), dtype=np.float32)


def _openvino_probes(out: dict) -> None:
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"}
    model, x = _ov_model()
    cm = core.compile_model(model, "CPU", config)
    res = cm(x)
    out["openvino conv fp32"] = _digest(res[0])
    out["openvino fully-connected fp32"] = _digest(res[1])
    out["openvino primitives (fp32)"] = _primitives(cm)
    fresh, x = _ov_model()
    q = _nncf_int8(fresh, x)
    if q is not None:
        cq = core.compile_model(q, "CPU", config)
        out["openvino int8 conv + fully-connected"] = _digest(cq(x)[1])
        out["openvino primitives (int8)"] = _primitives(cq)


def _nncf_int8(model, x):
    try:
        import nncf
    except ImportError:
        return None
    import logging

    logging.getLogger("nncf").setLevel(logging.ERROR)
    return nncf.quantize(model, nncf.Dataset([x]), subset_size=1)


def _primitives(compiled) -> str:
    kinds = {}
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str)
        if layer in ("Convolution", "FullyConnected", "MatMul"):
            kinds.setdefault(layer, set()).add(info["primitiveType"].astype(str))
    return "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in sorted(kinds.items()))


def _onnxruntime_probes(out: dict, work: Path) -> None:
    import numpy as np
    import onnxruntime as ort
    import torch

    m = _seeded(torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.Linear(32 * 22 * 22, 64)))  # fmt: skip
    x = _randn(4, 16, 24, 24)
    path = work / "probe.onnx"
    if not path.exists():
        torch.onnx.export(m, (x,), str(path), dynamo=False, opset_version=17)
        from onnxruntime.quantization import CalibrationDataReader, quantize_static

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.items = iter([{"input.1": x.numpy()}])

            def get_next(self):
                return next(self.items, None)

        name = ort.InferenceSession(str(path)).get_inputs()[0].name
        Reader.__init__ = lambda self: setattr(self, "items", iter([{name: x.numpy()}]))
        quantize_static(str(path), str(work / "probe.int8.onnx"), Reader())
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    for key, f in (("onnxruntime conv + matmul fp32", path), ("onnxruntime int8 QDQ conv + matmul",
                                                               work / "probe.int8.onnx")):  # fmt: skip
        s = ort.InferenceSession(str(f), opts, providers=["CPUExecutionProvider"])
        out[key] = _digest(s.run(None, {s.get_inputs()[0].name: np.asarray(x.numpy())})[0])


def child(work: Path, verbose: bool) -> None:
    """Run every probe in this process (``verbose``: the torch ones only, under the libraries' verbose
    logs: OpenVINO's int8 convolution fails to compile with MKL_VERBOSE set); print one JSON object."""
    out: dict = {}
    _torch_probes(out)
    for fn in () if verbose else (_openvino_probes, lambda o: _onnxruntime_probes(o, work)):
        try:
            fn(out)
        except ImportError as e:
            out.setdefault("skipped", []).append(str(e))
    print("PROBE " + json.dumps(out), flush=True)


def _child_run(level: str, work: Path, verbose: bool) -> tuple[dict, list[str]]:
    from ptopt.core.isa import child_env

    env = child_env(level)
    if verbose:
        env.update(ONEDNN_VERBOSE="1", MKL_VERBOSE="1")
    cmd = [sys.executable, __file__, "--child", str(work)] + (["--verbose"] if verbose else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    lines = (p.stdout + p.stderr).splitlines()
    probe = next((json.loads(ln[6:]) for ln in lines if ln.startswith("PROBE ")), None)
    if probe is None:
        raise RuntimeError(f"level {level}: the probe failed: {(p.stderr or p.stdout)[-2000:]}")
    return probe, lines


def run_level(level: str, work: Path) -> dict:
    probe, _ = _child_run(level, work, verbose=False)
    _, lines = _child_run(level, work, verbose=True)
    probe["onednn isa"] = next((ln.split("isa:")[1] for ln in lines if ",info,cpu,isa:" in ln), "")
    head = next((ln for ln in lines if ln.startswith("MKL_VERBOSE oneMKL")), "")
    probe["mkl"] = head.split(" for ")[-1].split(",")[0] if head else ""
    return probe


def main() -> None:
    from ptopt.core.isa import LEVELS, reaches, top_level

    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--levels", default=None)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(Path(args.child), args.verbose)
    import tempfile

    top = top_level()
    levels = (args.levels or ",".join(n for n in LEVELS if reaches(n) and n != top)).split(",")
    work = Path(tempfile.mkdtemp(prefix="ptopt-probe-isa-"))
    results = {"native": run_level("native", work)}
    for lv in levels:
        results[lv] = run_level(lv, work)
    rows = []
    for probe, lib in PROBES.items():
        base = results["native"].get(probe)
        cells = {lv: ("" if base is None else ("changed" if r.get(probe) != base else "same"))
                 for lv, r in results.items() if lv != "native"}  # fmt: skip
        rows.append({"probe": probe, "library": lib, "output_bits": cells})
    evidence = {lv: {k: r.get(k) for k in ("aten capability", "onednn isa", "mkl", "openvino primitives (fp32)",
                                           "openvino primitives (int8)")} for lv, r in results.items()}  # fmt: skip
    data = {
        "machine": machine_header(1),
        "native_level": top,
        "levels": levels,
        "rows": rows,
        "evidence": evidence,
    }
    md = [f"Outputs compared bit for bit with the native run (native here: {top}); 'changed' = another kernel ran "
          "(fp32; int8 products are exact, so two int8 kernels agree unless saturation or the float steps "
          "around them differ).", "",
          "| probe | library | " + " | ".join(levels) + " |", "| --- | --- |" + " --- |" * len(levels)]  # fmt: skip
    md += [f"| {r['probe']} | {r['library']} | " + " | ".join(r["output_bits"].get(lv, "") for lv in levels) + " |"
           for r in rows]  # fmt: skip
    md += ["", "What the libraries say at each level:", ""]
    md += [f"- **{lv}**: ATen {e['aten capability']}; oneDNN {e['onednn isa']}; MKL path {e['mkl']}; OpenVINO fp32 "
           f"{e['openvino primitives (fp32)']}; int8 {e['openvino primitives (int8)']}"
           for lv, e in evidence.items()]  # fmt: skip
    write_result(
        "isa_caps",
        "Which runtime follows which CPU-level cap (benchmarks/probe_isa.py)",
        "\n".join(md),
        data,
        1,
        command="python benchmarks/probe_isa.py",
    )


if __name__ == "__main__":
    main()
