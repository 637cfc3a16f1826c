"""``validate --isa LEVELS``: every model judged again at each CPU level, each level in a child process.

A level (``ptopt.core.isa``) caps the instruction sets the kernel libraries may use. They read their
caps once, when they load, so each level runs in a child process (``ptopt.validate.isa_child``) started
with the level's variables set: the same samples (sent as a file), the same models (their files, or the
in-memory ones pickled into the job's private folder), the same thread count. The child runs each
model's accuracy pass whole and compares its outputs with the reference's outputs of this process's
native run; then it times every model that ran, interleaved as here, on its share of the timing budget
(``child_latency``: ``min_seconds``, ``min_iters`` and ``rounds`` divided by the number of children,
recorded as the report's ``isa.child_timing``). Its latency is *emulated*: this CPU running the lower
level's code, not that CPU.

What each entry's ``by_isa[level]`` holds: ``metric``, ``accuracy_drop`` (against the reference's
native metric, validate's definition), ``agreement``, ``latency`` and ``speedup`` (against the
reference timed at the same level), ``emulated``, the ``coverage`` of the level for the entry's runtime
(``follows`` / ``partly`` / ``ignores``, ``ptopt.core.isa.coverage``) and its ``note``, and ``error``
where it could not run there. A runtime that ignores the caps (ONNX Runtime) is not run at a capped
level: its figures would be this CPU's, so the entry says so instead. An AOTInductor package whose
kernels were compiled for an instruction set above the level is not run either: a CPU at that level
cannot execute them (``error``, a failed ``runs@LEVEL`` gate). The level this CPU runs natively is
measured in this process (no child): its figures are the entry's own.

A child that dies (a crash in a kernel library) costs that level what was not finished: the models it
had done keep their figures; the others get one line naming the level and how the process ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ptopt.core import isa as _isa
from ptopt.core.formats import find_format

#: how long one level's child process may run (a hung kernel library must not hang validate)
CHILD_TIMEOUT_S = 3600.0


def coverage_for(entry: Any, level: str) -> _isa.Coverage:
    """How far the runtime of ``entry`` follows ``level`` on this CPU (FBGEMM counts for int8 only: it
    runs torch's int8 Linear)."""
    from ptopt.core.system import cpu_info

    row = find_format(entry.format)
    libraries = row.isa_libraries if row is not None else ("aten", "onednn", "mkl", "fbgemm")
    if entry.precision != "int8":
        libraries = tuple(lib for lib in libraries if lib != "fbgemm")
    return _isa.coverage(libraries, level, cpu_info().get("vendor"))


def _cannot_run(entry: Any, level: str) -> str | None:
    """Why a CPU at ``level`` cannot run the entry at all (its AOTInductor kernels), or None."""
    compiled_for = (entry.info or {}).get("cpu_isa")
    if entry.format == "aoti_package" and not _isa.vec_isa_reaches(compiled_for, level):
        return (
            f"its Inductor kernels were compiled for {_isa.vec_isa_level(compiled_for)} ({compiled_for}), which a "
            f"CPU at {level} cannot execute (illegal instruction); build the package on such a CPU, or with "
            f"ATEN_CPU_CAPABILITY set to that level's"
        )
    return None


def _send(obj: Any, path: Path) -> str | None:
    """Pickle an in-memory model for the child; the reason it cannot be sent, or None."""
    import torch

    try:
        if isinstance(obj, torch.jit.ScriptModule):
            torch.jit.save(obj, str(path))
        else:
            torch.save(obj, path)
    except (pickle.PicklingError, TypeError, AttributeError, RuntimeError) as e:
        path.unlink(missing_ok=True)
        return (
            f"an in-memory model that cannot be sent to a child process ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:160]}); save it to a file and validate the file"
        )
    return None


class Job:
    """The files every level's child reads, in a private temporary folder (removed by ``close``).

    ``models``: (role, ref, weights, name) each; ``ds``: the samples (a Dataset); ``ref_outputs``: the
    reference's native outputs on them; ``metric``: a validate Metric or None; ``latency``: a
    LatencyOptions (None: no timing); ``cosines``: also send back each sample's cosine."""

    def __init__(self, models: Sequence[tuple[str, Any, Any, str]], ds: Any, ref_outputs: Any, *,
                 metric: Any, threads: int, eval_batch_size: int, batch_sizes: Sequence[int], latency: Any,
                 allow_pickle: bool = False, providers: Sequence[str] | None = None, cosines: bool = False,
                 class_scores: bool = True):  # fmt: skip
        import torch

        self.dir = Path(tempfile.mkdtemp(prefix="ptopt-isa-"))
        self.unsendable: dict[str, str] = {}
        torch.save(ds, self.dir / "data.pt")
        torch.save(ref_outputs, self.dir / "ref_outputs.pt")
        sent = None
        if metric is not None:
            with contextlib.suppress(pickle.PicklingError, TypeError, AttributeError):
                torch.save(metric, self.dir / "metric.pt")
                sent = str(self.dir / "metric.pt")
        self.spec: dict[str, Any] = {
            "data": str(self.dir / "data.pt"),
            "ref_outputs": str(self.dir / "ref_outputs.pt"),
            "metric": sent,
            "threads": int(threads),
            "allow_pickle": bool(allow_pickle),
            "providers": list(providers) if providers else None,
            "eval_batch_size": int(eval_batch_size),
            "batch_sizes": list(batch_sizes),
            "latency": None if latency is None else _as_dict(latency),
            "cosines": cosines,
            "class_scores": bool(class_scores),
        }
        self.models = [self._model(i, *m) for i, m in enumerate(models)]

    @classmethod
    def of_run(cls, run: Any, ref_outputs: Any, children: int = 1) -> Job:
        """The job of a validate run (``ptopt.validate.api._Run``) whose timing is shared by ``children``
        child processes (``child_latency``)."""
        models = [
            (role, ref, w, name)
            for (role, ref, w), name in zip(run.models.refs, run.models.names, strict=True)
        ]
        return cls(
            models, run.ds, ref_outputs, metric=run.metric if run.metric_measured else None, threads=run.threads,
            eval_batch_size=run.eval_batch_size, batch_sizes=run.sizes,
            latency=None if run.latency is None else child_latency(run.latency, children),
            allow_pickle=run.models.allow_pickle, providers=run.models.providers, class_scores=run.class_scores,
        )  # fmt: skip

    def _model(self, i: int, role: str, ref: Any, weights: Any, name: str) -> dict[str, Any]:
        spec = {"name": name, "role": role, "weights": None if weights is None else str(weights)}
        if isinstance(ref, (str, os.PathLike)):
            spec["ref"] = str(ref)
            return spec
        path = self.dir / f"model{i}.pt"
        why = _send(ref, path)
        if why:
            self.unsendable[name] = why
        spec["pickle"] = str(path)
        return spec

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def child_latency(latency: Any, children: int) -> Any:
    """The timing each of ``children`` child processes does: the parent's budget split between them.

    ``min_seconds`` and ``min_iters`` (totals per model and batch size) are divided by the number of
    children, and so are the interleaved ``rounds`` (at least 3, so the spread is still measured); the
    warm-up stays whole (a child starts cold). Every level's medians then rest on about 1/children of
    the samples of the native figures: ``validate --isa`` over three levels costs about two plain
    validates plus the children's start and accuracy passes, not three full timings."""
    import dataclasses

    n = max(1, int(children))
    if n == 1:
        return latency
    return dataclasses.replace(
        latency,
        min_seconds=latency.min_seconds / n,
        min_iters=max(1, -(-latency.min_iters // n)),
        rounds=max(min(3, latency.rounds), latency.rounds // n),
    )


def _as_dict(latency: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(latency)


def run_level(job: Job, level: str, skip: dict[str, str], timeout: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """Run the job's models (but ``skip``: name -> why) in a child process capped at ``level``; returns
    ``{"models": {name: figures}, "aten_capability": ..., "crash": None | why}``. A child that dies is
    started again without the model it died on (that one gets the line): nothing else is lost."""
    names = [m["name"] for m in job.models if m["name"] not in skip and m["name"] not in job.unsendable]
    models: dict[str, Any] = {}
    data: dict[str, Any] = {"models": models, "crash": None}
    for attempt in range(len(names) + 1):
        if not names:
            break
        got = _child(job, level, names, attempt, timeout)
        data["aten_capability"] = got.get("aten_capability", data.get("aten_capability"))
        models.update(got["models"])
        if got["crash"] is None:
            break
        data["crash"] = got["crash"]
        undone = [
            n
            for n in names
            if "seconds" not in got["models"].get(n, {}) and "error" not in got["models"].get(n, {})
        ]
        if not undone:  # it died while timing: the accuracy figures stand
            for n in names:
                models[n]["latency_error"] = got["crash"]
            break
        models[undone[0]] = {"error": f"{got['crash']} while running it at {level}"}
        names = [n for n in names if n != undone[0]]
    return data


def _child(job: Job, level: str, names: list[str], attempt: int, timeout: float) -> dict[str, Any]:
    """One child process at ``level`` over the models ``names``."""
    out = job.dir / f"result-{level}-{attempt}.json"
    spec = dict(job.spec, level=level, out=str(out), models=[m for m in job.models if m["name"] in names])
    job_path = job.dir / f"job-{level}-{attempt}.json"
    job_path.write_text(json.dumps(spec), encoding="utf-8")
    env = _isa.child_env(level)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # what this process imports, the child does
    crash = None
    try:
        p = subprocess.run(
            [sys.executable, "-m", "ptopt.validate.isa_child", str(job_path)],
            env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if p.returncode != 0:
            crash = _ended(p.returncode, p.stderr)
    except subprocess.TimeoutExpired:
        crash = f"the child process ran past {timeout:.0f} s and was stopped"
    got = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {"models": {}}
    got["crash"] = crash
    return got


def _ended(code: int, stderr: str) -> str:
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        return f"the child process died ({sig})"
    tail = [ln for ln in (stderr or "").strip().splitlines() if ln.strip()]
    return f"the child process exited {code}" + (f": {tail[-1][:200]}" if tail else "")


def measure_levels(run: Any, entries: list[Any], ref_outputs: Any, levels: Sequence[str],
                   say: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """Fill every entry's ``by_isa`` at each level; returns the report's ``isa`` section."""
    for e in entries:
        e.by_isa = {}
    section: dict[str, Any] = {"levels": list(levels), "native_level": _isa.top_level(),
                               "inherited_caps": _isa.inherited_caps(), "children": {}}  # fmt: skip
    job = None
    try:
        for level in levels:
            if _isa.is_native(level):
                for e in entries:
                    e.by_isa[level] = _native_figures(e, level)
                continue
            if job is None:
                job = Job.of_run(run, ref_outputs, children=sum(not _isa.is_native(lv) for lv in levels))
                if job.spec["latency"] is not None:
                    section["child_timing"] = {k: job.spec["latency"][k] for k in ("min_seconds", "min_iters",
                                                                                   "rounds")}  # fmt: skip
                if run.metric_measured and job.spec["metric"] is None:
                    section["notes"] = [f"the metric {run.metric.name} cannot be sent to a child process (not "
                                        "picklable): not measured at the emulated levels; agreement is"]  # fmt: skip
            t0 = time.perf_counter()
            skip = _skipped(entries, level)
            say(f"--isa {level}: {len(entries) - len(skip)} model(s) in a child process capped at {level}"
                + (f" ({len(skip)} not run there)" if skip else ""))  # fmt: skip
            data = run_level(job, level, skip)
            for e in entries:
                e.by_isa[level] = _level_figures(e, level, data, skip, job.unsendable)
            section["children"][level] = {"seconds": round(time.perf_counter() - t0, 2), "crash": data["crash"],
                                          "aten_capability": data.get("aten_capability")}  # fmt: skip
            if data["crash"]:
                say(f"--isa {level}: {data['crash']}")
    finally:
        if job is not None:
            job.close()
    return section


def _skipped(entries: list[Any], level: str) -> dict[str, str]:
    out = {}
    for e in entries:
        cov = coverage_for(e, level)
        why = _cannot_run(e, level) or (cov.note(e.runtime, level) if cov.verdict == "ignores" else None)
        if why:
            out[e.name] = why
    return out


def _native_figures(entry: Any, level: str) -> dict[str, Any]:
    return {
        "emulated": False,
        "coverage": {"verdict": "native"},
        "note": "" if level == _isa.NATIVE else f"this CPU's own level ({level}): measured in this process",
        "metric": entry.metric,
        "accuracy_drop": entry.accuracy_drop,
        "agreement": entry.agreement,
        "latency": {bs: _lat(st) for bs, st in entry.latency.items()},
        "speedup": dict(entry.speedup),
        "error": None,
    }


def _f32_at(entry: Any, level: str) -> str:
    """What a bf16 OpenVINO IR runs in at a level without AVX-512: f32, as OpenVINO's CPU plugin runs it
    on such a CPU (``ptopt.formats.openvino.inference_hint``)."""
    if entry.format != "openvino" or entry.precision != "bf16" or level == _isa.NATIVE:
        return ""
    if not _isa.onednn_capped_without(_isa.OPENVINO_BF16_FLAGS, _isa.LEVELS[level].caps["onednn"]):
        return ""
    return (
        f"{entry.name} is a bf16 IR: at {level} it runs in f32 (OpenVINO has no bf16 kernels below AVX-512)"
    )


def _lat(st: dict[str, Any]) -> dict[str, Any]:
    keep = ("p50_ms", "p90_ms", "p99_ms", "samples_per_s", "round_spread_pct", "rounds", "skipped")
    return {k: st[k] for k in keep if k in st}


def _level_figures(entry: Any, level: str, data: dict[str, Any], skip: dict[str, str],
                   unsendable: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    cov = coverage_for(entry, level)
    got = data["models"].get(entry.name, {})
    note = "; ".join(n for n in (cov.note(entry.runtime, level), _f32_at(entry, level)) if n)
    fig: dict[str, Any] = {"emulated": True, "coverage": cov.to_dict(), "note": note,
                           "metric": got.get("metric"), "accuracy_drop": None, "agreement": got.get("agreement"),
                           "latency": {bs: _lat(st) for bs, st in (got.get("latency") or {}).items()},
                           "speedup": {}, "error": None}  # fmt: skip
    cannot = _cannot_run(entry, level)
    if cannot:
        fig["error"] = cannot
    elif entry.name in unsendable:
        fig["error"] = unsendable[entry.name]
    elif entry.name in skip:
        fig["ignored"] = True
    elif "error" in got:
        fig["error"] = got["error"]
    elif "seconds" not in got:  # its accuracy pass never finished: the child died first
        fig["error"] = f"{data['crash'] or 'no result'} (at level {level})"
    if got.get("latency_error"):
        fig["latency_error"] = got["latency_error"]
    return fig


def apply_metrics(entries: list[Any], metric: Any, relative: bool) -> None:
    """Each level's accuracy drop (against the reference's native metric) and speedup (against the
    reference timed at the same level); a level measured natively takes the entry's own."""
    from ptopt.validate.gates import accuracy_drop

    ref = entries[0]
    for e in entries[1:]:
        for level, fig in (e.by_isa or {}).items():
            if not fig.get("emulated"):
                fig.update(accuracy_drop=e.accuracy_drop, speedup=dict(e.speedup))
                continue
            if fig.get("emulated") and fig.get("metric") is not None and ref.metric is not None:
                fig["accuracy_drop"] = accuracy_drop(ref.metric, fig["metric"], metric.higher_is_better,
                                                     metric.scale(), relative)  # fmt: skip
            base = (ref.by_isa or {}).get(level, {}).get("latency", {})
            if fig.get("emulated"):
                fig["speedup"] = {bs: base[bs]["p50_ms"] / st["p50_ms"] for bs, st in fig["latency"].items()
                                  if "p50_ms" in st and "p50_ms" in base.get(bs, {})}  # fmt: skip


def level_gates(gates: Any, entry: Any, reference: Any, metric_info: dict[str, Any],
                baseline_entry: dict[str, Any] | None) -> list[Any]:  # fmt: skip
    """The accuracy and latency gates at every emulated level of ``entry`` (named ``GATE@LEVEL``; a
    regression gate compares with the baseline's ``by_isa`` at that level when it has one); a level it
    cannot run at fails ``runs@LEVEL``; a runtime that ignores the cap gets no gate there."""
    import dataclasses

    from ptopt.validate.gates import GateResult, Gates, evaluate

    out = []
    level_only = dataclasses.replace(gates, max_size_mb=None)
    for level, fig in (entry.by_isa or {}).items():
        if not fig.get("emulated") or fig.get("ignored"):
            continue
        if fig.get("error"):
            out.append(GateResult(entry.name, f"runs@{level}", 0.0, None, False, f"at {level}: {fig['error']}",
                                  isa=level))  # fmt: skip
            continue
        mine = dict(
            entry.to_dict(), **{k: fig[k] for k in ("metric", "accuracy_drop", "agreement", "speedup")}
        )
        mine["latency"] = fig["latency"]
        ref = dict(reference.to_dict(), latency=(reference.by_isa or {}).get(level, {}).get("latency", {}))
        old = ((baseline_entry or {}).get("by_isa") or {}).get(level)
        use = level_only if old is not None else dataclasses.replace(level_only, max_regression=None)
        if (
            fig.get("metric") is None
        ):  # a metric function that cannot be sent to a child: agreement gates stay
            use = dataclasses.replace(use, max_accuracy_drop=None)
        if not isinstance(use, Gates) or not use.active():
            continue
        for r in evaluate(use, mine, ref, metric_info, old):
            out.append(dataclasses.replace(r, gate=f"{r.gate}@{level}", message=f"at {level}: {r.message}",
                                           isa=level))  # fmt: skip
    return out
