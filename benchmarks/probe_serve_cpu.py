"""Where each server's CPU goes per request at 64 clients: TorchServe (2 workers) and Ray Serve
(2 replicas) up together on the zoo ResNet int8 (as ``bench_serve.py`` builds it), each loaded in turn
with ``N`` requests from 64 keep-alive clients; every process's CPU (``/proc/PID/stat`` utime+stime,
all its threads) is read before and after, grouped by role (Ray: proxy, ingress, model replicas,
controller, GCS, raylet, agents; TorchServe: the Java frontend, the Python workers; the clients),
and divided by the requests answered.

    python benchmarks/probe_serve_cpu.py [--requests 1000] [--rounds 2] [--extra KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import bench_serve as bs
from common import md_table, setup, write_result

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def role(cmd: str) -> str | None:
    for key, name in (
        (":model_", "ray replica (model)"), (":ingress", "ray ingress"), ("ProxyActor", "ray proxy"),
        ("ServeController", "ray controller"), ("gcs_server", "ray gcs"), ("raylet", "ray raylet"),
        ("dashboard", "ray dashboard/agents"), ("agent", "ray dashboard/agents"), ("log_monitor", "ray log monitor"),
        ("ray::IDLE", "ray idle workers"), ("default_worker", "ray idle workers"),
        ("model_service_worker", "torchserve worker (python)"), ("org.pytorch.serve", "torchserve frontend (java)"),
    ):  # fmt: skip
        if key in cmd:
            return name
    return None


def snapshot(ray_pids: set[int] | None = None) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process with a role; Ray's only of ``ray_pids`` (this server's session)."""
    out = {}
    for pid, cmd in bs.cmdlines():
        name = "clients (this process)" if pid == os.getpid() else role(cmd)
        if name and name.startswith("ray") and ray_pids is not None and pid not in ray_pids:
            continue
        if name:
            out[pid] = (name, cpu_s(pid))
    return out


def diff(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, (name, t) in b.items():
        out[name] = out.get(name, 0.0) + t - a.get(pid, (name, 0.0))[1]
    return out


def pyspy(folder: str, procs: dict[int, tuple[str, float]], name: str, r: int) -> list:
    import subprocess

    Path(folder).mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--nonblocking",
                          "-o", f"{folder}/{role.split()[1]}-{pid}-{r}.txt"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        for pid, (role, _) in procs.items() if role in ("ray proxy", "ray ingress", "ray replica (model)")
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--model", default="resnet")
    ap.add_argument("--only", choices=("TorchServe", "Ray Serve"), help="load one server only")
    ap.add_argument("--pyspy", help="py-spy record every Ray Serve proxy/replica during the load into DIR")
    ap.add_argument("--extra", nargs="*", default=[], help="more Ray Serve config, KEY=VALUE (JSON values)")
    args = ap.parse_args()
    setup(1)
    import ptopt
    from ptopt.serve.ray_server import RayServer
    from ptopt.serve.server import TorchServeServer

    work = Path(tempfile.mkdtemp(prefix="probe-serve-"))
    try:
        m = {"resnet": bs.resnet_int8, "minilm": bs.minilm_int8}[args.model](work)
        bs.references(m)
        mar = ptopt.package(m["path"], "mar", work / f"{m['name']}.mar", batch_size=16, max_batch_delay_ms=5,
                            workers=2, threads=1).path  # fmt: skip
        cfg = {"replicas": 2, "cpus_per_replica": 0.5, "threads": 1, "max_batch_size": 16, "batch_wait_ms": 5}
        cfg.update({k: json.loads(v) for k, v in (e.split("=", 1) for e in args.extra)})
        rows: list[list] = []
        with TorchServeServer([mar]) as ts, RayServer([m["path"]], config=cfg) as rs:
            from ptopt.serve.ray_server import session_processes

            mine = set(session_processes(str(rs.ray_temp_dir)))
            route = f"/predictions/{m['name']}"
            servers = {"TorchServe": ts.port, "Ray Serve": rs.port}
            if args.only:
                servers = {args.only: servers[args.only]}
            for r in range(args.rounds):
                for name in list(servers) if r % 2 == 0 else list(servers)[::-1]:
                    time.sleep(2)
                    idle0 = snapshot(mine)
                    time.sleep(3)
                    idle = diff(idle0, snapshot(mine))
                    a, t0 = snapshot(mine), time.perf_counter()
                    spies = pyspy(args.pyspy, a, name, r) if args.pyspy and name == "Ray Serve" else []
                    res = bs.load(servers[name], route, m, args.clients, args.requests)
                    wall = time.perf_counter() - t0
                    for p in spies:
                        p.send_signal(2)
                        p.wait()
                    d = diff(a, snapshot(mine))
                    ok = res["codes"].get(200, 0)
                    print(f"\n{name} round {r}: {res['req_per_s']:.0f} req/s, wall {wall:.1f} s, "
                          f"codes {res['codes']}, wrong {res['wrong']}, load {os.getloadavg()}")  # fmt: skip
                    total = 0.0
                    head = (
                        f"{name} round {r + 1}: {res['req_per_s']:.0f} req/s, load {os.getloadavg()[0]:.0f}"
                    )
                    for k, v in sorted(d.items(), key=lambda kv: -kv[1]):
                        if v > 0.005:
                            total += v
                            rows.append([head, k, f"{1e3 * v / max(ok, 1):.2f}", f"{100 * v / wall:.0f}%"])
                            print(f"  {k:34s} {v:7.2f} s CPU  {1e3 * v / max(ok, 1):6.2f} ms/request  "
                                  f"{100 * v / wall:5.0f}% of a core   (idle 3 s: {idle.get(k, 0):.2f} s)")  # fmt: skip
                    print(f"  {'total':34s} {total:7.2f} s CPU  {1e3 * total / max(ok, 1):6.2f} ms/request")
                    rows.append([head, "**total**", f"**{1e3 * total / max(ok, 1):.2f}**", ""])
        md = md_table(["server, round", "process", "CPU ms per request", "of one core"], rows)
        md += (
            f"\n\n{m['label']}, {args.requests} requests per round from {args.clients} keep-alive clients, one "
            "sample each (JSON at `/predictions/NAME`); both servers up together, dynamic batching on both (16 "
            "rows, 5 ms), 1 thread per worker/replica. CPU: utime+stime of each process (all its threads) "
            f"from /proc before and after the round; Ray's counted for this server's session only. Ray config: {cfg}."
        )
        extra = "".join(f" {e}" for e in args.extra)
        write_result(f"serve_cpu_{m['name']}", f"Serving: where the CPU goes per request ({m['name']})", md,
                     {"rows": rows, "config": cfg}, 1,
                     command=f"python benchmarks/probe_serve_cpu.py --requests {args.requests} --rounds "
                     f"{args.rounds} --model {m['name']}" + (f" --extra{extra}" if extra else ""))  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
