"""Validation: is ``ptopt validate``'s accuracy the artifact's own, are its latency medians stable,
and is it fast enough for CI?

Four artifacts of the zoo ResNet-style CNN (TorchScript fp32, ExportedProgram, ONNX, TorchScript of
a dynamic-int8 model) are validated against the eager model on the digits32 test split, at batch
sizes 1 and 32, with validate's default timing (3 s per artifact and batch size, in 15 interleaved
rounds), ``--runs`` times in a row (default 3). Reported: each artifact's top-1 from validate next
to an independent evaluation with plain torch.jit / torch.export / onnxruntime (must be identical),
the p50 of every run and the spread of each pair of consecutive runs (target: within 10%), the same
for the speedups over the reference, and the wall time of one validation (target: < 60 s).

Then the noise floor, ``--runs`` more validations: the TorchScript artifact as the reference against
an identical copy of itself, the ONNX artifact and its copy, and ``PythonLoopCanary``, a fixed
pure-Python loop with no tensor work. Identical copies timed in the same rounds should be 1.00x
apart; how far they stray is what a same-runner A/B latency gate (``examples/github-actions``)
must leave room for. The canary's p50 from run to run is the machine's own drift, timed by
validate's method.

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
        torch.onnx.export(
            m, (x,), str(p), dynamic_shapes={"x": {0: torch.export.Dim("batch")}}, verbose=False
        )
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


def canary_model():
    """An "artifact" whose forward is ``_canary`` (no tensor work; zeros out): validate evaluates and
    times it like the others, in the same rounds, so its spread between runs is the machine's own,
    measured by validate's method."""
    import torch

    class PythonLoopCanary(torch.nn.Module):
        def forward(self, x):
            _canary()
            return torch.zeros(x.shape[0], 10)

    return PythonLoopCanary().eval()


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


def copies(arts: dict[str, Path], out: Path) -> dict[str, Path]:
    """Byte-identical copies of the TorchScript and ONNX artifacts (files and sidecars) in ``out``."""
    import shutil

    out.mkdir()
    for p in arts["torchscript"].parent.iterdir():
        if p.name.startswith(("resnet.ts.pt", "resnet.onnx")):
            shutil.copy2(p, out / p.name)
    return {k: out / arts[k].name for k in ("torchscript", "onnx")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--runs", type=int, default=3, help="consecutive validations (>= 2), and as many noise-floor runs"
    )
    args = ap.parse_args()
    threads = setup(args.threads)
    import torch

    from ptopt.core.data import load_data
    from ptopt.validate.api import validate

    data_ref = "builtin:digits32:test"
    data = load_data(data_ref)
    n = max(2, args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        arts = build_artifacts(Path(tmp))
        paths = list(arts.values())
        from ptopt.core.timing import measure_latency

        runs, walls, canary = [], [], []
        for _ in range(n):
            canary.append(measure_latency(_canary, min_seconds=2.0)["p50_ms"])
            t0 = time.perf_counter()
            runs.append(validate("zoo:resnet", paths, data_ref, batch_sizes=(1, 32), threads=threads))
            walls.append(time.perf_counter() - t0)
        twin = copies(arts, Path(tmp) / "copy")
        floor = [
            validate(
                arts["torchscript"],
                [twin["torchscript"], arts["onnx"], twin["onnx"], canary_model()],
                data_ref,
                batch_sizes=(1, 32),
                threads=threads,
            )
            for _ in range(n)
        ]
        indep = {p.name: independent_top1(p, data) for p in paths}
    torch.set_num_threads(threads)

    def pairs(values: list[float]) -> list[float]:
        return [100 * abs(a - b) / min(a, b) for a, b in zip(values, values[1:], strict=False)]

    def cell(values: list[float], digits: int = 3) -> str:
        return " / ".join(f"{v:.{digits}f}" for v in values)

    def spread_cell(values: list[float]) -> str:
        return " / ".join(f"{v:.1f}%" for v in pairs(values))

    def med(v: list[float]) -> float:
        return sorted(v)[len(v) // 2]

    # -- the 4 artifacts and the reference, n consecutive runs
    rows, sp_rows, spreads, sp_spreads, identical = [], [], [], [], True
    per_run = [[r.reference] + r.entries for r in runs]
    for entries in zip(*per_run, strict=False):
        e1 = entries[0]
        ind = indep.get(e1["name"])
        same = ind is None or all(ind == e["metric"] for e in entries)
        identical &= same
        cells = [
            e1["name"],
            e1["runtime"],
            f"{100 * e1['metric']:.2f}",
            "—" if ind is None else f"{100 * ind:.2f}",
            "—" if ind is None else ("yes" if same else "NO"),
        ]
        sp_cells = [e1["name"]]
        for bs in ("1", "32"):
            p50 = [e["latency"][bs]["p50_ms"] for e in entries]
            spreads += pairs(p50)
            cells += [cell(p50), spread_cell(p50)]
            if e1["role"] != "reference":
                sp = [e["speedup"][bs] for e in entries]
                sp_spreads += pairs(sp)
                sp_cells += [cell(sp, 2), spread_cell(sp)]
        rows.append(cells)
        if len(sp_cells) > 1:
            sp_rows.append(sp_cells)
    table = md_table(
        [
            "artifact",
            "runtime",
            "top-1 % (validate)",
            "top-1 % (independent)",
            "identical",
            f"p50 ms @1, runs 1..{n}",
            "spread (consecutive)",
            f"p50 ms @32, runs 1..{n}",
            "spread (consecutive)",
        ],
        rows,
    )
    table += "\n\nSpeedup over the reference (reference p50 / artifact p50, same run):\n\n" + md_table(
        [
            "artifact",
            f"speedup @1, runs 1..{n}",
            "spread (consecutive)",
            f"speedup @32, runs 1..{n}",
            "spread (consecutive)",
        ],
        sp_rows,
    )
    opts = runs[0].data["latency_options"]
    round_spread = [
        max(st["round_spread_pct"] for e in [r.reference] + r.entries for st in e["latency"].values())
        for r in runs
    ]
    summary = (
        f"\n\n{n} consecutive validations of 4 artifacts + the reference at batch sizes 1 and 32 "
        f"({len(data)} samples; {opts['min_seconds']:g} s per artifact and batch size in {opts['rounds']} "
        f"interleaved rounds): {', '.join(f'{w:.1f}' for w in walls)} s (target < 60 s). Accuracy identical "
        f"to the independent evaluation: {'yes, every artifact and run' if identical else 'NO'}.\n\n"
        f"Spread of the p50 between consecutive runs ({len(spreads)} pairs): median {med(spreads):.1f}%, "
        f"max {max(spreads):.1f}% (target <= 10%). Of the speedups ({len(sp_spreads)} pairs): median "
        f"{med(sp_spreads):.1f}%, max {max(sp_spreads):.1f}%. Largest `round_spread_pct` in each run "
        f"(interquartile range of one model's 15 round medians at one batch size, in % of their median): "
        f"{' / '.join(f'{v:.0f}%' for v in round_spread)}."
    )
    summary += (
        "\n\nThe machine's own drift, outside validate: a fixed pure-Python loop timed for 2 s just before "
        f"each run: p50 {cell(canary)} ms, spread between consecutive runs {spread_cell(canary)}."
    )
    # -- the noise floor: identical copies, and the canary, timed by validate
    frows, ab = [], []
    for label, key in (
        ("resnet.ts.pt (copy) vs resnet.ts.pt (reference)", 0),
        ("resnet.onnx (copy) vs resnet.onnx", 2),
    ):
        cells = [label]
        for bs in ("1", "32"):
            if key == 0:
                ratio = [f.entries[0]["speedup"][bs] for f in floor]
            else:
                ratio = [
                    f.entries[1]["latency"][bs]["p50_ms"] / f.entries[2]["latency"][bs]["p50_ms"]
                    for f in floor
                ]
            ab += [abs(1 - r) * 100 for r in ratio]
            cells += [cell(ratio, 3)]
        frows.append(cells)
    canary_p50 = {bs: [f.entries[3]["latency"][bs]["p50_ms"] for f in floor] for bs in ("1", "32")}
    frows.append(["PythonLoopCanary p50 ms (no tensor work)"] + [cell(canary_p50[bs]) for bs in ("1", "32")])
    ftable = md_table(
        ["noise floor (one validation per run)", f"@1, runs 1..{n}", f"@32, runs 1..{n}"], frows
    )
    fsummary = (
        f"\n\nIdentical copies timed in the same rounds (speedup of the copy; 1.000 = no difference): "
        f"largest deviation {max(ab):.1f}% over {len(ab)} comparisons. The canary's p50 between consecutive "
        f"runs: {spread_cell(canary_p50['1'])} (batch 1 inputs), {spread_cell(canary_p50['32'])} "
        f"(batch 32 inputs; the loop ignores them)."
    )
    write_result(
        "validate",
        "Validation: accuracy parity, latency stability, wall time",
        table + summary + "\n\n" + ftable + fsummary,
        {
            "walls_s": walls,
            "spreads_pct": spreads,
            "speedup_spreads_pct": sp_spreads,
            "round_spread_pct": round_spread,
            "identical": identical,
            "canary_p50_ms": canary,
            "ab_deviation_pct": ab,
            "canary_in_validate_p50_ms": canary_p50,
            "runs": [r.to_dict() for r in runs],
            "noise_floor_runs": [f.to_dict() for f in floor],
        },
        threads,
    )


if __name__ == "__main__":
    main()
