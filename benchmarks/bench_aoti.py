"""AOTInductor packages and the PT2E int8 engine vs eager, ONNX Runtime and the FX int8 engine.

Two models, both on builtin:digits32 (1×32×32, 10 classes), both trained:
- zoo:resnet (the reference zoo's small ResNet, BN, nn.ReLU modules);
- a user-style residual CNN written the way users write them: functional ``F.relu``, ``x + y``
  residuals, ``torch.flatten``, no QuantStubs (trained here for 3 epochs with the shared trainer).

1. fp32: eager vs the AOTInductor package (``ptopt.export(model, "aoti")``, dynamic batch 1..64,
   freezing), the same with fixed-batch models for 1 and 32 inside (``static_batches=(1, 32)``,
   ``--static-batch 1,32``) vs ONNX Runtime (``ptopt.export(model, "onnx")``), at batch 1 and 32, timed in the same
   interleaved rounds (2 threads everywhere; ORT intra-op 2). Compile time of the package.
2. int8 at batch 32: ``ptopt.quantize(..., "static", engine="fx")`` (int8 TorchScript) vs
   ``engine="pt2e"`` (torchao PT2E + X86InductorQuantizer compiled by AOTInductor), fp32 eager as
   the base, timed interleaved; accuracy on builtin:digits32:test (drop vs fp32 in points), time to
   quantize (and compile), and every batch size 1..64 run once through the PT2E package.

Run: PTOPT_CACHE_DIR=/work/notes/zoo-cache python benchmarks/bench_aoti.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, setup, write_result  # noqa: E402

THREADS = setup(2)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import ptopt  # noqa: E402
from ptopt.core.data import load_data  # noqa: E402
from ptopt.core.inputspec import make_inputs  # noqa: E402
from ptopt.core.modelref import load_model  # noqa: E402
from ptopt.core.timing import measure_interleaved  # noqa: E402
from ptopt.formats.onnx_session import onnx_session  # noqa: E402

# the compile is what is timed here: never a package from ptopt's compile cache (formats/aoti_cache.py)
os.environ["PTOPT_AOTI_CACHE"] = "0"

CALIB, TEST, TRAIN = "builtin:digits32:train", "builtin:digits32:test", "builtin:digits32:train"
ROUNDS, MIN_SECONDS = 9, 4.5


class Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = nn.Conv2d(c_in, c_out, 1, stride, bias=False) if (stride != 1 or c_in != c_out) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class UserCNN(nn.Module):
    """A residual CNN as users write it: functional relu, ``+`` residuals, flatten."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 32, 3, padding=1)
        self.b1, self.b2, self.b3 = Block(32, 32, 1), Block(32, 64, 2), Block(64, 64, 2)
        self.head = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        x = self.b3(self.b2(self.b1(x)))
        return self.head(torch.flatten(x, 1))


def user_cnn() -> nn.Module:
    from ptopt.compress.trainer import TrainConfig, train

    torch.manual_seed(0)
    model = UserCNN()
    train(model, load_data(TRAIN), TrainConfig(epochs=3, batch_size=64, lr=2e-3), progress=False)
    return model.eval()


def models() -> dict[str, tuple[nn.Module, list]]:
    resnet = load_model("zoo:resnet")
    specs = resnet.input_specs
    return {"zoo:resnet": (resnet.module.eval(), specs), "user residual CNN": (user_cnn(), specs)}


def _torch_fn(model, x):
    def run():
        with torch.no_grad():
            return model(x)

    return run


def fp32(name: str, module: nn.Module, specs: list, work: Path) -> tuple[list[list], dict]:
    t0 = time.perf_counter()
    aoti = ptopt.export(module, "aoti", work / "fp32.pt2", input_specs=specs, dynamic_batch="1:32:64")
    wall = time.perf_counter() - t0
    fixed = ptopt.export(
        module, "aoti", work / "fixed.pt2", input_specs=specs, dynamic_batch="1:32:64", static_batches=(1, 32)
    )
    onnx = ptopt.export(module, "onnx", work / "fp32.onnx", input_specs=specs, dynamic_batch="1:32:64")
    sess = onnx_session(onnx.path, THREADS)
    in_name = sess.get_inputs()[0].name
    rows, data = [], {"compile_seconds": aoti.extra["compile_seconds"], "export_wall_seconds": wall}
    data["fixed_batch_compile_seconds"] = fixed.extra["compile_seconds"]
    data["bytes"] = {"aoti": aoti.size_bytes, "aoti_fixed_1_32": fixed.size_bytes}
    for b in (1, 32):
        x = make_inputs(specs, "positional", which="opt", batch=b, seed=b)
        xn = x.numpy()
        fns = {
            "eager": _torch_fn(module, x),
            "aoti": _torch_fn(aoti.model, x),
            "aoti fixed": _torch_fn(fixed.model, x),
            "ort": lambda s=sess, xn=xn: s.run(None, {in_name: xn}),
        }
        st = measure_interleaved(fns, {k: b for k in fns}, rounds=ROUNDS, min_seconds=MIN_SECONDS)
        p50 = {k: v["p50_ms"] for k, v in st.items()}
        data[f"batch{b}"] = {k: {"p50_ms": v["p50_ms"], "min_ms": v["min_ms"], "spread_pct": v["round_spread_pct"]}
                             for k, v in st.items()}  # fmt: skip
        best = {k: v["min_ms"] for k, v in st.items()}
        rows.append(
            [name, b, f"{p50['eager']:.3f}", f"{p50['aoti']:.3f}", f"{p50['aoti fixed']:.3f}", f"{p50['ort']:.3f}",
             f"{p50['eager'] / p50['aoti']:.2f}× / {best['eager'] / best['aoti']:.2f}×",
             f"{p50['ort'] / p50['aoti']:.2f}× / {best['ort'] / best['aoti']:.2f}×",
             f"{p50['ort'] / p50['aoti fixed']:.2f}× / {best['ort'] / best['aoti fixed']:.2f}×",
             f"{max(st[k]['round_spread_pct'] for k in st):.0f} %"]
        )  # fmt: skip
    return rows, data


def int8(name: str, module: nn.Module, specs: list, work: Path) -> tuple[list[list], dict]:
    results, seconds = {}, {}
    for engine in ("fx", "pt2e"):
        t0 = time.perf_counter()
        results[engine] = ptopt.quantize(
            module, "static", calib_data=CALIB, eval_data=TEST, engine=engine, progress=False
        )
        seconds[engine] = time.perf_counter() - t0
    x = make_inputs(specs, "positional", which="opt", batch=32, seed=32)
    fns = {"fp32 eager": _torch_fn(module, x)} | {k: _torch_fn(r.model, x) for k, r in results.items()}
    st = measure_interleaved(fns, {k: 32 for k in fns}, rounds=ROUNDS, min_seconds=MIN_SECONDS)
    p50 = {k: v["p50_ms"] for k, v in st.items()}
    accepted = []
    for b in range(1, 65):
        try:
            with torch.no_grad():
                out = results["pt2e"].model(make_inputs(specs, "positional", which="opt", batch=b, seed=b))
            accepted.append(out.shape[0] == b)
        except Exception:  # noqa: BLE001 - a batch size the package refuses counts as not accepted
            accepted.append(False)
    data = {"p50_ms": p50, "min_ms": {k: v["min_ms"] for k, v in st.items()}, "quantize_seconds": seconds}
    data["pt2e_compile_seconds"] = results["pt2e"].extra["compile_seconds"]
    data["pt2e_batches_1_64_accepted"] = sum(accepted)
    rows = []
    for k, r in results.items():
        m = r.metrics
        data[k] = {"fp32_accuracy": m["fp32_accuracy"], "int8_accuracy": m["int8_accuracy"],
                   "drop_points": m["accuracy_drop_points"]}  # fmt: skip
        rows.append(
            [name, k, f"{p50[k]:.2f}", f"{p50['fp32 eager'] / p50[k]:.2f}×",
             f"{p50['fx'] / p50[k]:.2f}× / {data['min_ms']['fx'] / data['min_ms'][k]:.2f}×",
             f"{100 * m['fp32_accuracy']:.2f}", f"{100 * m['int8_accuracy']:.2f}", f"{m['accuracy_drop_points']:+.2f}",
             f"{seconds[k]:.0f}", f"{sum(accepted)}/64" if k == "pt2e" else "64/64 (TorchScript)"]
        )  # fmt: skip
    return rows, data


def main() -> None:
    load = os.getloadavg()
    fp_rows, i8_rows, data = [], [], {"load_avg_at_start": load}
    for name, (module, specs) in models().items():
        with tempfile.TemporaryDirectory() as d:
            r, dd = fp32(name, module, specs, Path(d))
            fp_rows += r
            r8, d8 = int8(name, module, specs, Path(d))
            i8_rows += r8
            data[name] = {"fp32": dd, "int8": d8}
    end = os.getloadavg()
    data["load_avg_at_end"] = end
    compile_s = ", ".join(
        f"{n}: {data[n]['fp32']['compile_seconds']:.0f} s dynamic batch only, "
        f"{data[n]['fp32']['fixed_batch_compile_seconds']:.0f} s with the two fixed-batch models "
        f"({data[n]['fp32']['bytes']['aoti'] / 1e6:.1f} MB → {data[n]['fp32']['bytes']['aoti_fixed_1_32'] / 1e6:.1f} MB)"
        for n in data
        if not n.startswith("load")
    )
    md = (
        "### fp32: AOTInductor package vs eager and ONNX Runtime (p50 ms, same interleaved rounds)\n\n"
        + md_table(
            [
                "model",
                "batch",
                "eager",
                "AOTInductor",
                "AOTI + --static-batch 1,32",
                "ORT",
                "AOTI vs eager (p50 / min)",
                "AOTI vs ORT (p50 / min)",
                "AOTI fixed batch vs ORT (p50 / min)",
                "round spread",
            ],
            fp_rows,
        )  # fmt: skip
        + f"\n\nAOTInductor compile time (fp32, freezing on): {compile_s}.\n\n"
        "### int8 at batch 32: PT2E (torchao → AOTInductor) vs FX (torch.ao → TorchScript)\n\n"
        + md_table(
            [
                "model",
                "engine",
                "p50 ms",
                "vs fp32 eager",
                "vs FX int8 (p50 / min)",
                "fp32 acc %",
                "int8 acc %",
                "drop (pts)",
                "quantize s",
                "batches 1..64",
            ],
            i8_rows,
        )  # fmt: skip
        + f"\n\nLoad average at the start: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, at the end: "
        f"{end[0]:.1f} / {end[1]:.1f} / {end[2]:.1f} (2 cores shared with other work). min: the fastest "
        "call seen, closer to the uncontended speed than p50 on a loaded machine.\n"
    )
    write_result("aoti", "AOTInductor packages and PT2E int8", md, data, THREADS)


if __name__ == "__main__":
    main()
