"""Export: fp32 parity of TorchScript/ONNX vs eager, and the int8 ONNX of a static int8 zoo:resnet.

1. zoo:resnet and zoo:transformer exported (dynamic batch 1..64) to TorchScript and ONNX; the max
   abs difference of their outputs vs eager at batch 1, 7 and 64.
2. zoo:resnet statically quantized (FX, x86 qconfig, calibration builtin:digits32:train) and saved
   as an int8 TorchScript artifact with its sidecar (what ``ptopt quantize`` writes); then exported
   to ONNX both ways (``ort_static``: ORT quantizes the fp32 parent; ``qdq_export``: the FX int8
   model through the TorchScript exporter). Size, ORT latency at batch 32 (2 intra-op threads,
   rounds interleaved so load on the machine hits every variant alike) and accuracy on
   builtin:digits32:test, against the fp32 ONNX.

Run: python benchmarks/bench_export.py
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, setup, write_result  # noqa: E402

THREADS = setup(2)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ptopt.core.artifact import Artifact  # noqa: E402
from ptopt.core.data import load_data  # noqa: E402
from ptopt.core.inputspec import make_inputs  # noqa: E402
from ptopt.core.modelref import load_model  # noqa: E402
from ptopt.core.tensors import flatten_outputs  # noqa: E402
from ptopt.core.timing import measure_interleaved  # noqa: E402
from ptopt.export.api import export  # noqa: E402
from ptopt.export.parity import artifact_runner, compare, torch_runner  # noqa: E402
from ptopt.formats.onnx_session import onnx_session  # noqa: E402

BATCHES = (1, 7, 64)


def fp32_parity(work: Path) -> tuple[list[list], dict]:
    rows, data = [], {}
    for ref in ("zoo:resnet", "zoo:transformer"):
        loaded = load_model(ref)
        eager = torch_runner(loaded.module)
        for target, suffix in (("torchscript", ".pt"), ("onnx", ".onnx")):
            out = work / f"{ref[4:]}{suffix}"
            art = export(ref, target, out, dynamic_batch="1:8:64")
            run = artifact_runner(out, art.format, art.inputs)
            diffs = {}
            for b in BATCHES:
                x = make_inputs(art.inputs, art.input_style, which="opt", batch=b, seed=b)
                diffs[b] = compare(flatten_outputs(eager(x)), flatten_outputs(run(x)))["max_abs_diff"]
            data[f"{ref}/{target}"] = diffs
            rows.append(
                [ref, target]
                + [f"{diffs[b]:.2e}" for b in BATCHES]
                + ["yes" if max(diffs.values()) <= 1e-4 else "**no**"]
            )
    return rows, data


def make_int8_artifact(work: Path) -> tuple[Path, torch.nn.Module]:
    """What `ptopt quantize zoo:resnet --mode static --calib-data builtin:digits32:train` writes."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    loaded = load_model("zoo:resnet")
    calib = load_data("builtin:digits32:train")
    ex = calib.x[:32]
    torch.backends.quantized.engine = "x86"
    prepared = prepare_fx(copy.deepcopy(loaded.module).eval(), get_default_qconfig_mapping("x86"), (ex,))
    with torch.no_grad():
        for b in calib.batches(64):
            prepared(b.x)
    q = convert_fx(prepared)
    path = work / "resnet.int8.pt"
    with torch.no_grad():
        ts = torch.jit.freeze(torch.jit.trace(q, ex))
    torch.jit.save(ts, str(path))
    Artifact(
        path=path,
        format="torchscript",
        inputs=loaded.input_specs,
        input_style="positional",
        config={"type": "static", "mode": "static", "backend": "x86", "calib_data": "builtin:digits32:train"},
        parent=loaded.parent_record(),
        precision="int8",
    ).finalize()
    return path, q


def accuracy(run, test) -> float:
    correct = 0
    for b in test.batches(256):
        correct += int((torch.as_tensor(np.asarray(flatten_outputs(run(b.x))[0])).argmax(1) == b.y).sum())
    return 100.0 * correct / len(test)


def int8_onnx(work: Path) -> tuple[list[list], dict]:
    test = load_data("builtin:digits32:test")
    int8_pt, fx_int8 = make_int8_artifact(work)
    arts = {
        "fp32 ONNX": export("zoo:resnet", "onnx", work / "resnet.fp32.onnx"),
        "int8 ONNX, ort_static (default)": export(int8_pt, "onnx", work / "resnet.int8.ort.onnx"),
        "int8 ONNX, qdq_export (FX int8)": export(
            fx_int8, "onnx", work / "resnet.int8.qdq.onnx", input_specs=load_model("zoo:resnet").input_specs
        ),
    }
    sessions = {k: onnx_session(a.path, THREADS) for k, a in arts.items()}
    x = make_inputs(arts["fp32 ONNX"].inputs, "positional", which="opt", batch=32).numpy()
    names = {k: s.get_inputs()[0].name for k, s in sessions.items()}
    fns = {k: (lambda s=s, name=names[k]: s.run(None, {name: x})) for k, s in sessions.items()}
    st = measure_interleaved(
        fns, {k: 32 for k in fns}, rounds=5, min_seconds=3.0
    )  # load hits every variant alike
    p50 = {k: v["p50_ms"] for k, v in st.items()}
    best = {k: v["min_ms"] for k, v in st.items()}
    acc = {k: accuracy(artifact_runner(a.path, "onnx", a.inputs), test) for k, a in arts.items()}
    eager_acc = accuracy(torch_runner(load_model("zoo:resnet").module), test)
    torch_int8_acc = accuracy(torch_runner(torch.jit.load(str(int8_pt))), test)
    base = arts["fp32 ONNX"]
    rows, data = [], {"eager_fp32_accuracy": eager_acc, "torch_int8_accuracy": torch_int8_acc, "variants": {}}
    for k, a in arts.items():
        size_ratio = a.size_bytes / base.size_bytes
        speedup = p50["fp32 ONNX"] / p50[k]
        drop = acc["fp32 ONNX"] - acc[k]
        speedup_min = best["fp32 ONNX"] / best[k]
        rows.append(
            [
                k,
                f"{a.size_bytes:,}",
                f"{size_ratio:.2f}×",
                f"{p50[k]:.2f}",
                f"{speedup:.2f}×",
                f"{best[k]:.2f}",
                f"{speedup_min:.2f}×",
                f"{acc[k]:.2f}",
                f"{drop:+.2f}" if k != "fp32 ONNX" else "—",
            ]
        )
        data["variants"][k] = {
            "size_bytes": a.size_bytes,
            "size_ratio": size_ratio,
            "p50_ms_bs32": p50[k],
            "p50_rounds": st[k]["round_p50_ms"],
            "speedup": speedup,
            "min_ms_bs32": best[k],
            "speedup_min": speedup_min,
            "accuracy": acc[k],
            "accuracy_drop": drop,
            "parity": a.metrics["parity"]["max_abs_diff"],
        }
    return rows, data


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        rows1, data1 = fp32_parity(work)
        rows2, data2 = int8_onnx(work)
    md = (
        "### fp32: max |artifact − eager| (dynamic batch 1..64)\n\n"
        + md_table(["model", "target"] + [f"batch {b}" for b in BATCHES] + ["≤ 1e-4"], rows1)
        + "\n\n### static int8 zoo:resnet in ONNX Runtime (batch 32, accuracy on builtin:digits32:test)\n\n"
        + md_table(
            [
                "artifact",
                "bytes",
                "size vs fp32",
                "p50 ms",
                "speedup (p50)",
                "min ms",
                "speedup (min)",
                "accuracy %",
                "drop (pts)",
            ],
            rows2,
        )
        + "\n\n(min: the fastest batch seen; on a shared machine it is closer to the uncontended speed.)"
        + f" Eager fp32 accuracy {data2['eager_fp32_accuracy']:.2f} %, torch int8 (the TorchScript source) "
        f"{data2['torch_int8_accuracy']:.2f} %. Targets: int8 ONNX ≤ 0.32× the fp32 size, ≥ 2.5× faster, "
        f"drop ≤ 0.5 points.\n"
    )
    write_result(
        "export", "Export: parity and int8 ONNX", md, {"fp32_parity": data1, "int8_onnx": data2}, THREADS
    )


if __name__ == "__main__":
    main()
