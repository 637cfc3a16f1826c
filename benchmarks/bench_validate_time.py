"""How long ``ptopt validate`` takes on a real-size model (issue 18's target: under 90 s on 2 cores).

A torchvision ResNet-18 (random weights, BatchNorm statistics from random images) at 3x96x96 is the
reference; two artifacts are validated against it: its fp32 TorchScript and its fp32 ONNX (both
written by ``ptopt.export``, parity-checked). Data: 256 random images with random labels (the accuracy
is meaningless on random weights; what is timed is the work validate does). ``ptopt.validate`` runs
with its defaults at batch sizes 1 and 8 (accuracy once per artifact at the largest batch size,
interleaved timing rounds that stop early once each median is stable). Reported: the wall time of
the whole validation (loading, checking, evaluating, timing, the report), the rounds each batch size
took, and the speedups it measured.

    python benchmarks/bench_validate_time.py [--threads 2] [--runs 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import md_table, setup, write_result

TARGET_S = 90.0


def _resnet18():
    import torch

    from tests.compat.models import ensure_torchvision_ops

    ensure_torchvision_ops()
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    model.train()
    with torch.no_grad():  # BatchNorm statistics from random images, as training would set them
        for _ in range(4):
            model(torch.randn(16, 3, 96, 96))
    return model.eval()


def _artifacts(model, out: Path) -> list[Path]:
    import ptopt

    shapes = ("1x3x96x96",)
    paths = []
    for target, name in (("torchscript", "resnet18.pt"), ("onnx", "resnet18.onnx")):
        ptopt.export(model, target, out / name, input_shapes=shapes)
        paths.append(out / name)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    threads = setup(args.threads)
    import torch

    import ptopt

    model = _resnet18()
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(256, 3, 96, 96, generator=g), torch.randint(0, 10, (256,), generator=g))
    rows, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        arts = _artifacts(model, Path(tmp))
        for i in range(args.runs):
            t0 = time.perf_counter()
            res = ptopt.validate(model, arts, data, batch_sizes=(1, 8), threads=threads)
            wall = time.perf_counter() - t0
            entries = res.entries
            speed = {e["name"]: {bs: (e.get("speedup") or {}).get(str(bs)) for bs in (1, 8)} for e in entries}
            rounds = {bs: (entries[0]["latency"].get(str(bs)) or {}).get("rounds") for bs in (1, 8)}
            runs.append({"wall_s": wall, "speedups": speed, "rounds": rounds})
            rows.append(
                [
                    i + 1,
                    f"{wall:.1f}",
                    "yes" if wall < TARGET_S else "**no**",
                    f"{rounds[1]} / {rounds[8]}",
                    "; ".join(
                        f"{Path(n).name}: {s[1] or 0:.2f}x / {s[8] or 0:.2f}x"
                        for n, s in speed.items()
                        if s[8] is not None
                    ),
                ]
            )
    table = md_table(["run", "wall s", f"< {TARGET_S:.0f} s", "rounds bs1 / bs8", "speedups bs1 / bs8"], rows)
    text = (
        "torchvision ResNet-18 (random weights) at 3x96x96: the eager model and two artifacts (fp32 "
        "TorchScript, fp32 ONNX Runtime), 256 samples, batch sizes 1 and 8, validate's defaults.\n\n" + table
    )
    write_result("validate_time", "validate: wall time on ResNet-18 at 96x96 (issue 18)", text, runs, threads)


if __name__ == "__main__":
    main()
