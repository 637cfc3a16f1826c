"""``optimize --isa LEVELS``: a candidate is within the budget only if it holds at every CPU level.

After the search (``ptopt.optimize.search``) has judged every candidate on this CPU, each one it kept
within the budget is judged again at each requested level, in a child process with the kernel libraries
capped there (``ptopt.validate.isa``): on the samples that decided its acceptance (the held-out ones),
against the fp32 reference's outputs of this process, with the same rule (``--min-cosine``: the worst
cosine projected to ``REFERENCE_SAMPLES`` samples; ``--accuracy-budget``: top-1 points below the fp32
model's). One that misses at a level leaves the budget, with the level in its reason, so the winner is
the fastest candidate that holds everywhere. The reference and the survivors are also timed there, in a
few short interleaved rounds: the per-level speedups are emulated (this CPU running the lower level's
code). A runtime that ignores the caps (ONNX Runtime) cannot be judged at a capped level: it keeps its
place, and the report says it was not checked there.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

from ptopt.core import isa as _isa
from ptopt.core import progress

# the time the level checks keep out of the search's budget is sized in ``ptopt.optimize.search``
# (``reserve_s``: the search asks it at every step; this module imports the search, not the reverse)
from ptopt.optimize.search import (
    CHILD_START_S,
    EXPECTED_SURVIVORS,
    RESERVE_SHARE,
    minimal,
    per_level_s,
    reserve_s,
)

__all__ = ["CHILD_START_S", "EXPECTED_SURVIVORS", "RESERVE_SHARE", "check_levels", "per_level_s", "reserve_s"]


def _as_entry(cand: Any) -> Any:
    """What ``ptopt.validate.isa`` reads of an entry, for a candidate."""
    art = getattr(cand.result, "artifact", None) if cand.result is not None else None
    extra = art.extra if art is not None else {}
    return types.SimpleNamespace(name=cand.name, format=cand.format, precision=cand.precision,
                                 runtime=cand.runtime, info={"cpu_isa": extra.get("cpu_isa")})  # fmt: skip


def check_levels(search: Any, levels: Sequence[str], say: Callable[[str], None]) -> dict[str, Any]:
    """Judge every candidate kept within the budget at each of ``levels`` (module docstring); fills each
    candidate's ``by_isa``; returns the report's ``isa`` section."""
    from ptopt.validate.isa import Job, run_level
    from ptopt.validate.metrics import resolve_metric

    ev, settings = search.evaluator, search.settings
    ds, ref_out = (ev.heldout, ev.held_ref) if ev.heldout is not None else (ev.evald, ev.ref_out)
    ref = search.candidates[0]
    judged = [c for c in search.candidates[1:] if c.status == "kept" and c.within_budget and c.work_path]
    emulated = [lv for lv in levels if not _isa.is_native(lv)]
    section = {"levels": list(levels), "native_level": _isa.top_level(), "samples": len(ds), "children": {},
               # this CPU's own level: the search's figures, not a child's
               "measured_here": [lv for lv in levels if lv not in emulated]}  # fmt: skip
    if not judged or not emulated:
        return section
    models = [("reference", search.ctx.module, None, ref.name)] + [
        ("artifact", str(c.work_path), None, c.name) for c in judged
    ]
    job = Job(models, ds, ref_out, metric=resolve_metric("top1") if ds.y is not None else None,
              threads=settings.threads, eval_batch_size=ev.eval_bs, batch_sizes=settings.batch_sizes,
              latency=minimal(settings.latency), allow_pickle=True, cosines=True)  # fmt: skip
    try:
        for level in emulated:
            skip = _skipped(judged, level)
            n = len(judged) - len(skip)
            say(f"--isa {level}: judging {n} candidate(s) in a child process capped at {level}")
            # named, so that the heartbeat of a child that runs a minute says what it waits for
            with progress.step(f"judging {n} candidate(s) at {level} in a child process", announce=False):
                data = run_level(job, level, skip)
            section["children"][level] = {
                "crash": data["crash"],
                "aten_capability": data.get("aten_capability"),
            }
            _judge(search, ref, judged, level, data, skip)
    finally:
        job.close()
    for c in judged:
        failed = [lv for lv, f in c.by_isa.items() if f.get("within_budget") is False]
        if failed:
            c.within_budget = False
            c.reason = f"at {failed[0]}: {c.by_isa[failed[0]]['why']}"
            say(f"  {c.name}: out of the budget {c.reason}")
    return section


def _skipped(cands: list[Any], level: str) -> dict[str, str]:
    from ptopt.validate.isa import _cannot_run, coverage_for

    out = {}
    for c in cands:
        entry = _as_entry(c)
        cov = coverage_for(entry, level)
        why = _cannot_run(entry, level) or (cov.note(c.runtime, level) if cov.verdict == "ignores" else None)
        if why:
            out[c.name] = why
    return out


def _judge(
    search: Any, ref: Any, cands: list[Any], level: str, data: dict[str, Any], skip: dict[str, str]
) -> None:
    """Each candidate's figures at ``level`` and whether they meet the budget."""
    from ptopt.validate.isa import _cannot_run, _f32_at, coverage_for

    got, ref_lat = data["models"], (data["models"].get(ref.name) or {}).get("latency") or {}
    ref.by_isa = ref.by_isa or {}
    ref.by_isa[level] = {"latency_ms": _ms(ref_lat)}
    ref_failed = _failure(got.get(ref.name) or {}, data, level, _ms(ref_lat))
    if ref_failed:  # the candidates' accuracy stands (against this process's outputs); no speedups
        ref.by_isa[level]["error"] = ref_failed
    for c in cands:
        entry, fig = _as_entry(c), got.get(c.name) or {}
        cov = coverage_for(entry, level)
        note = "; ".join(n for n in (cov.note(c.runtime, level), _f32_at(entry, level)) if n)
        out: dict[str, Any] = {"emulated": True, "coverage": cov.verdict, "note": note}
        c.by_isa = c.by_isa or {}
        c.by_isa[level] = out
        if _cannot_run(entry, level):
            out.update(within_budget=False, why=_cannot_run(entry, level))
        elif c.name in skip:
            out.update(within_budget=None, why="not checked: " + skip[c.name])
        elif "error" in fig or "cosines" not in fig:
            out.update(
                within_budget=False, why=fig.get("error") or f"{data['crash'] or 'no result'} (at {level})"
            )
        else:
            out.update(_figures(search, fig))
            lat = _ms(fig.get("latency") or {})
            out["latency_ms"] = lat
            out["speedup"] = {
                bs: round(ref_ms / lat[bs], 3) for bs, ref_ms in _ms(ref_lat).items() if lat.get(bs)
            }
            why_not = ref_failed and f"the reference {ref.name} did not run at {level}: {ref_failed}"
            why_not = why_not or _failure(fig, data, level, lat, timing_only=True)
            if why_not:
                out["no_speedup"] = why_not


def _failure(
    fig: dict[str, Any], data: dict[str, Any], level: str, lat: dict[str, float], timing_only: bool = False
) -> str | None:
    """Why a model of the child has no figures (or, ``timing_only``, no timing) at ``level``, or None."""
    if not timing_only and fig.get("error"):
        return fig["error"]
    if fig.get("latency_error"):
        return fig["latency_error"]
    if not lat:
        return f"{data.get('crash') or 'the child process returned no timing'} (at {level})"
    return None


def _ms(latency: dict[str, Any]) -> dict[str, float]:
    return {bs: round(st["p50_ms"], 4) for bs, st in latency.items() if "p50_ms" in st}


def _figures(search: Any, fig: dict[str, Any]) -> dict[str, Any]:
    """The budget's rule on a child's figures (``Evaluator._meets``' rule, the same samples)."""

    from ptopt.core.tail import project_worst_cosine
    from ptopt.validate.gates import accuracy_drop

    ev, s = search.evaluator, search.settings
    tail = project_worst_cosine(fig["cosines"])
    out: dict[str, Any] = {"cosine_min": tail.measured, "cosine_projected": tail.projected}
    if s.metric == "top1":
        ds = ev.heldout if ev.heldout is not None else ev.evald
        ref_acc = ev._top1(ev.held_ref if ev.heldout is not None else ev.ref_out, ds)
        drop = None if fig.get("metric") is None else accuracy_drop(ref_acc, fig["metric"])
        ok = drop is not None and drop <= s.max_accuracy_drop
        shown = "unmeasured" if drop is None else f"{drop:.2f} pts"
        out.update(accuracy=fig.get("metric"), accuracy_drop=drop, within_budget=ok,
                   why="" if ok else f"accuracy drop {shown} > {s.max_accuracy_drop:g}")  # fmt: skip
        return out
    ok = tail.projected >= s.min_cosine
    why = (
        f"worst cosine projected to {tail.reference} samples {tail.projected:.4f} < {s.min_cosine:g} "
        f"(measured {tail.measured:.4f})"
    )
    return out | {"within_budget": ok, "why": "" if ok else why}
