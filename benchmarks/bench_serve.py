"""TorchServe serving cost: zoo:resnet (TorchScript fp32) in-process vs behind a local TorchServe.

Measures, with the same intra-op thread count everywhere:
- raw TorchScript in-process, batch 1 (the floor);
- TorchServe, one client, sequential requests: per-request latency (HTTP + JSON + worker);
- TorchServe, 8 concurrent clients: requests/s without and with server-side batching (batchSize 8).
Every served answer is checked against the model's own output.

    python benchmarks/bench_serve.py [--threads 2] [--requests 400]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import md_table, setup, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    threads = setup(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    try:
        run(args, threads, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, threads: int, work: Path) -> None:
    import numpy as np
    import torch

    from ptopt import Artifact, load_model
    from ptopt.core.timing import measure_latency, percentile
    from ptopt.serve.package import package
    from ptopt.serve.server import TorchServeServer

    loaded = load_model("zoo:resnet")
    x = loaded.example_inputs(batch=args.requests)
    ts_path = work / "resnet.pt"
    torch.jit.trace(loaded.module, x[:8]).save(str(ts_path))
    Artifact(ts_path, "torchscript", loaded.input_specs, loaded.input_style).finalize()
    model = torch.jit.load(str(ts_path)).eval()
    with torch.inference_mode():
        want = model(x).numpy()
        raw = measure_latency(lambda: model(x[:1]), batch_size=1)

    # one worker each; threads per worker = the thread count of the in-process baseline
    mar1 = package(ts_path, "mar", work / "resnet_b1.mar", batch_size=1, threads=threads).path
    mar8 = package(
        ts_path, "mar", work / "resnet_b8.mar", batch_size=8, max_batch_delay_ms=5, threads=threads
    ).path
    rows, data = (
        [
            [
                "TorchScript in-process (bs 1)",
                f"{raw['p50_ms']:.2f}",
                f"{raw['p90_ms']:.2f}",
                f"{raw['p99_ms']:.2f}",
                f"{raw['throughput_per_s']:.0f}",
            ]
        ],
        {"raw": raw},
    )
    with TorchServeServer([mar1, mar8]) as server:
        bodies = [json.dumps({"inputs": x[i].tolist()}).encode() for i in range(args.requests)]

        def post(model_name: str, i: int) -> tuple[float, np.ndarray]:
            req = urllib.request.Request(
                server.predict_url_for(model_name),
                data=bodies[i],
                headers={"Content-Type": "application/json"},
            )
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=60) as r:
                out = json.loads(r.read())["outputs"]
            return (time.perf_counter() - t0) * 1e3, np.asarray(out)

        for i in range(20):  # warm-up
            post("resnet_b1", i)
        lat = []
        for i in range(min(200, args.requests)):
            ms, out = post("resnet_b1", i)
            assert np.allclose(out, want[i], atol=1e-4), "served output differs from the model's"
            lat.append(ms)
        lat.sort()
        seq = {"p50_ms": percentile(lat, 50), "p90_ms": percentile(lat, 90), "p99_ms": percentile(lat, 99)}
        rows.append(
            [
                "TorchServe, 1 client, sequential",
                f"{seq['p50_ms']:.2f}",
                f"{seq['p90_ms']:.2f}",
                f"{seq['p99_ms']:.2f}",
                f"{1e3 / seq['p50_ms']:.0f}",
            ]
        )
        data["sequential"] = seq

        for name, label in (("resnet_b1", "no batching"), ("resnet_b8", "batchSize 8, 5 ms delay")):
            lats: list[float] = []
            lock = threading.Lock()

            def client(k: int, name: str = name, lats: list = lats, lock=lock) -> None:
                for i in range(k, args.requests, args.clients):
                    ms, out = post(name, i)
                    assert np.allclose(out, want[i], atol=1e-4), "served output differs from the model's"
                    with lock:
                        lats.append(ms)

            workers = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
            t0 = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            wall = time.perf_counter() - t0
            lats.sort()
            res = {
                "requests": len(lats),
                "wall_s": wall,
                "req_per_s": len(lats) / wall,
                "p50_ms": percentile(lats, 50),
                "p90_ms": percentile(lats, 90),
                "p99_ms": percentile(lats, 99),
            }
            data[f"concurrent_{name}"] = res
            rows.append(
                [
                    f"TorchServe, {args.clients} clients, {label}",
                    f"{res['p50_ms']:.2f}",
                    f"{res['p90_ms']:.2f}",
                    f"{res['p99_ms']:.2f}",
                    f"{res['req_per_s']:.0f}",
                ]
            )
    md = md_table(["setup", "p50 ms", "p90 ms", "p99 ms", "samples/s"], rows)
    md += (
        f"\n\nzoo:resnet (1×32×32 input), one sample per request, JSON bodies; {args.requests} requests per "
        "concurrent run, every answer checked against the model's own output. One TorchServe worker."
    )
    write_result(
        "serve",
        "Serving: TorchServe vs in-process TorchScript",
        md,
        data,
        threads,
        command=f"python benchmarks/bench_serve.py --threads {threads} --requests {args.requests}",
    )


if __name__ == "__main__":
    main()
