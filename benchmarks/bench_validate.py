"""Validation: is ``ptopt validate``'s accuracy the artifact's own, are its latency medians stable,
and is it fast enough for CI?

Four artifacts of the zoo ResNet-style CNN (TorchScript fp32, ExportedProgram, ONNX, TorchScript of
a dynamic-int8 model) are validated against the eager model on the digits32 test split, at batch
sizes 1 and 32, with validate's default timing (3 s per artifact and batch size, in 15 interleaved
rounds), ``--runs`` times in a row (default 3). Reported: each artifact's top-1 from validate next
to an independent evaluation with plain torch.jit / torch.export / onnxruntime (must be identical),
the p50 of every run and the spread of each pair of consecutive runs (target: within 10%), and the
wall time of one validation (target: < 60 s).

    python benchmarks/bench_validate.py [--threads N] [--runs N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

from common import md_table, setup, write_result


def build_artifacts(out: Path) -> dict[str, Path]:
    import torch

    from ptopt.core.artifact import Artifact
    from ptopt.core.inputspec import specs_from_example
    from ptopt.core.modelref import load_model

    lm = load_model("zoo:resnet")
    m = lm.module.eval()
    x = torch.randn(4, 1, 32, 32)
    specs = specs_from_example(x)
    parent = lm.parent_record()
    arts = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = out / "resnet.ts.pt"
        torch.jit.save(torch.jit.trace(m, x), str(p))
        arts["torchscript"] = Artifact(p, "torchscript", specs, parent=parent).finalize().path
        p = out / "resnet.pt2"
        ep = torch.export.export(m, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}})
        torch.export.save(ep, str(p))
        arts["exported_program"] = Artifact(p, "exported_program", specs, parent=parent).finalize().path
        p = out / "resnet.onnx"
        torch.onnx.export(m, (x,), str(p), dynamic_shapes={"x": {0: torch.export.Dim("batch")}}, verbose=False)
        files = [f.name for f in (p, out / "resnet.onnx.data") if f.exists()]
        arts["onnx"] = Artifact(p, "onnx", specs, parent=parent, files=files).finalize().path
        q = torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
        p = out / "resnet.dyn-int8.ts.pt"
        torch.jit.save(torch.jit.trace(q, x), str(p))
        arts["int8"] = Artifact(p, "torchscript", specs, parent=parent, precision="int8").finalize().path
    return arts


def _canary() -> int:
    """A fixed pure-Python workload: no torch, no memory traffic. Its speed is the machine's own drift."""
    s = 0
    for i in range(20000):
        s += i * i
    return s


def independent_top1(path: Path, data, batch_size: int = 64) -> float:
    """Plain runtime, no ptopt code in the loop."""
    import numpy as np
    import torch

    if path.suffix == ".onnx":
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        logits = np.concatenate([sess.run(None, {name: b.x.numpy()})[0] for b in data.batches(batch_size)])
        return float((logits.argmax(1) == data.y.numpy()).mean())
    model = torch.export.load(str(path)).module() if path.suffix == ".pt2" else torch.jit.load(str(path))
    with torch.inference_mode():
        logits = torch.cat([model(b.x) for b in data.batches(batch_size)])
    return float((logits.argmax(1) == data.y).double().mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="consecutive validations (>= 2)")
    args = ap.parse_args()
    threads = setup(args.threads)
    import torch

    from ptopt.core.data import load_data
    from ptopt.validate.api import validate

    data_ref = "builtin:digits32:test"
    data = load_data(data_ref)
    with tempfile.TemporaryDirectory() as tmp:
        arts = build_artifacts(Path(tmp))
        paths = list(arts.values())
        from ptopt.core.timing import measure_latency

        runs, walls, canary = [], [], []
        for _ in range(max(2, args.runs)):
            canary.append(measure_latency(_canary, min_seconds=2.0)["p50_ms"])
            t0 = time.perf_counter()
            runs.append(validate("zoo:resnet", paths, data_ref, batch_sizes=(1, 32), threads=threads))
            walls.append(time.perf_counter() - t0)
        indep = {p.name: independent_top1(p, data) for p in paths}
    torch.set_num_threads(threads)
    rows, spreads, identical = [], [], True
    n = len(runs)
    per_run = [[r.reference] + r.entries for r in runs]
    for entries in zip(*per_run):
        e1 = entries[0]
        ind = indep.get(e1["name"])
        same = ind is None or all(ind == e["metric"] for e in entries)
        identical &= same
        cells = [e1["name"], e1["runtime"], f"{100 * e1['metric']:.2f}", "—" if ind is None else f"{100 * ind:.2f}",
                 "—" if ind is None else ("yes" if same else "NO")]
        for bs in ("1", "32"):
            p50 = [e["latency"][bs]["p50_ms"] for e in entries]
            pair = [100 * abs(a - b) / min(a, b) for a, b in zip(p50, p50[1:])]
            spreads += pair
            cells += [" / ".join(f"{v:.3f}" for v in p50), " / ".join(f"{v:.1f}%" for v in pair)]
        rows.append(cells)
    table = md_table(["artifact", "runtime", "top-1 % (validate)", "top-1 % (independent)", "identical",
                      f"p50 ms @1, runs 1..{n}", "spread (consecutive)", f"p50 ms @32, runs 1..{n}",
                      "spread (consecutive)"], rows)
    opts = runs[0].data["latency_options"]
    summary = (f"\n\n{n} consecutive validations of 4 artifacts + the reference at batch sizes 1 and 32 "
               f"({len(data)} samples; {opts['min_seconds']:g} s per artifact and batch size in {opts['rounds']} "
               f"interleaved rounds): {', '.join(f'{w:.1f}' for w in walls)} s (target < 60 s). Accuracy identical "
               f"to the independent evaluation: {'yes, every artifact and run' if identical else 'NO'}. Latency "
               f"spread between consecutive runs ({len(spreads)} pairs): median "
               f"{sorted(spreads)[len(spreads) // 2]:.1f}%, max {max(spreads):.1f}% (target <= 10%).")
    cspread = [100 * abs(a - b) / min(a, b) for a, b in zip(canary, canary[1:])]
    summary += ("\n\nThe machine's own drift: a fixed pure-Python loop (no torch), timed for 2 s just before each "
                f"run: p50 {' / '.join(f'{v:.3f}' for v in canary)} ms, spread between consecutive runs "
                f"{' / '.join(f'{v:.1f}%' for v in cspread)}.")
    write_result("validate", "Validation: accuracy parity, latency stability, wall time", table + summary,
                 {"walls_s": walls, "spreads_pct": spreads, "identical": identical, "canary_p50_ms": canary,
                  "runs": [r.to_dict() for r in runs]}, threads)


if __name__ == "__main__":
    main()
