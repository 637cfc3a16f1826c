"""Where the peak resident memory of ``bench_distill_lm.py memory`` is reached: the same runs (SmolLM2-135M
into its 14-block copy, windows of 64, global batch 2, 2 optimizer steps, ``MALLOC_MMAP_THRESHOLD_=131072``),
one process and FSDP on 2, each phase traced: resident memory at its end and its peak (``VmHWM``, reset
at every phase boundary by writing 5 to ``/proc/self/clear_refs``), and the step in flight at the peak
(a sampler thread reads ``VmRSS`` every 2 ms; module hooks and FSDP's unshard / post-backward name the
step). Prints one table per rank; writes nothing. Linux only.

    python benchmarks/probe_distill_memory.py [single|fsdp]...
    python benchmarks/probe_distill_memory.py trace SPEC   (one traced worker; what the runs above start)
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PHASES: list[tuple[str, int, int, str]] = []
_now = ["start"]
_top = ["", 0]


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    return 0


#: (step in flight, VmRSS as it starts) of every step of the run (PROBE_TIMELINE=1 prints the last backward's)
TIMELINE: list[list] = []


def _at(label: str) -> None:
    _now[0] = label
    if os.environ.get("PROBE_TIMELINE"):
        rss = _status("VmRSS")
        TIMELINE.append([label, rss, rss])


def _sample() -> None:
    while True:
        rss = _status("VmRSS")
        if rss > _top[1]:
            _top[:] = [_now[0], rss]
        if TIMELINE and rss > TIMELINE[-1][2]:
            TIMELINE[-1][2] = rss
        time.sleep(0.002)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


def _heap() -> str:
    """glibc's heaps (all arenas): MiB held from the system outside mappings / of it free (``mallinfo2``)."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return "?"
    fn.restype = _Mallinfo2
    m = fn()
    return f"{m.arena >> 20}/{m.fordblks >> 20}"


def mark(name: str) -> None:
    PHASES.append((name, _status("VmRSS"), _status("VmHWM"), f"{_top[0]} | {_heap()}"))
    _top[:] = ["", 0]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _wrap(owner, name: str) -> None:
    fn = getattr(owner, name)

    def traced(*a, **k):
        mark(f"before {name}")
        out = fn(*a, **k)
        mark(name)
        return out

    setattr(owner, name, traced)


def _label(module, tag: str) -> None:
    for path, m in module.named_modules():
        if path.count(".") <= 2:
            m.register_forward_pre_hook(lambda *a, p=path: _at(f"{tag} forward {p}"))
            m.register_full_backward_pre_hook(lambda *a, p=path: _at(f"{tag} backward {p}"))


def _instrument() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

    from ptopt.compress import distill_lm, trainer

    for name in ("load_lm_sharded", "load_lm", "_text_ids"):
        _wrap(distill_lm, name)
    T = trainer._Training
    for name in ("optimizer_step", "finish"):
        _wrap(T, name)
    init, step = T.__init__, T.optimizer_step

    def init_labelled(self, model, data, eval_data, config, loss_fn, *a, **k):
        _label(model, "student")
        _label(loss_fn._teacher[0], "teacher")
        init(self, model, data, eval_data, config, loss_fn, *a, **k)

    def forward_backward(self, batch, stepping, share):
        mark("before forward")
        with self.autocast:
            loss, logits = self.runner(batch)
        mark("forward (teacher, student, loss)")
        (loss.float() * share / self.config.grad_accum_steps).backward()
        _at("backward done")
        mark("backward")
        return loss, logits

    def optimizer_step(self):
        _at("optimizer step")
        return step(self)

    T.__init__, T.forward_backward, T.optimizer_step = init_labelled, forward_backward, optimizer_step
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

    for owner, name in ((coll, "foreach_reduce_scatter_copy_in"), (dist, "reduce_scatter")):
        fn = getattr(owner, name)

        def labelled(*a, _fn=fn, _name=name, **k):
            _at(f"FSDP {_name}")
            out = _fn(*a, **k)
            _at(f"FSDP {_name} done")
            return out

        setattr(owner, name, labelled)
    for name in ("unshard", "reshard", "post_backward"):
        fn = getattr(group.FSDPParamGroup, name)

        def named(self, *a, _fn=fn, _name=name, **k):
            _at(f"FSDP {_name} {self._module_fqn}")
            return _fn(self, *a, **k)

        setattr(group.FSDPParamGroup, name, named)


def trace(spec_path: str) -> None:
    threading.Thread(target=_sample, daemon=True).start()
    mark("start")
    import bench_distill_lm

    mark("imports")
    _instrument()
    try:
        bench_distill_lm.worker(spec_path)
    finally:
        mark("end")
        head = "phase | RSS at its end | peak in it | at the peak | glibc heap / free in it at its end"
        lines = [f"rank {os.environ.get('RANK', '0')}: {head}"]
        lines += [f"{n} | {rss} | {hwm} | {at}" for n, rss, hwm, at in PHASES]
        done = [i for i, (label, *_) in enumerate(TIMELINE) if label == "backward done"]
        if len(done) > 1:
            lines += ["", "the last step: step starting | VmRSS at its start | peak until the next"]
            lines += [f"{label} | {rss} | {top}" for label, rss, top in TIMELINE[done[-2] + 1 : done[-1] + 1]]
        Path(spec_path).with_suffix(f".rank{os.environ.get('RANK', '0')}.txt").write_text("\n".join(lines))


def run(kind: str, tmp: Path) -> None:
    import smollm
    from bench_distill_lm import MEMORY as m

    tcfg = dict(epochs=1, max_steps=m["steps"], batch_size=m["batch"], lr=m["lr"], device="cpu", seed=0)
    spec = dict(teacher=f"hf:{smollm.smollm_dir()}", student=f"hf:{smollm.student_dir(m['student_layers'])}",
                train="builtin:pydoc-text:calib", seq_len=m["seq_len"], result=str(tmp / f"{kind}.json"),
                train_config=dict(tcfg, strategy="fsdp" if kind == "fsdp" else "none"))  # fmt: skip
    path = tmp / f"{kind}.spec.json"
    path.write_text(json.dumps(spec))
    cmd = [sys.executable, __file__, "trace", str(path)]
    if kind == "fsdp":
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            *cmd[1:],
        ]
    threads = "1" if kind == "fsdp" else "2"
    env = dict(os.environ, OMP_NUM_THREADS=threads, BENCH_THREADS=threads, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-3000:]}")
    for rank_file in sorted(tmp.glob(f"{kind}.spec.rank*.txt")):
        print(f"\n{kind}, {rank_file.read_text()}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["trace"]:
        trace(sys.argv[2])
    else:
        with tempfile.TemporaryDirectory() as d:
            for kind in sys.argv[1:] or ["single", "fsdp"]:
                run(kind, Path(d))
