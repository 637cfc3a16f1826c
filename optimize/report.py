"""The reports of ``ptopt optimize``: ``report.json``, ``report.html`` (a Pareto plot and the candidates
table), ``summary.md`` and the terminal table, all from the one report dict (schema ``ptopt.optimize/2``,
docs/optimize.md; a ``ptopt.optimize/1`` report still renders).

A thin layer over validate's report stack (``ptopt.validate.reports``): every number is spelled by its
vocabulary (``common``), the machine and versions lines, the noise rule and its footnotes are validate's,
and the pages, tables and writers are its markdown / html / terminal / JSON primitives. What is optimize's
own is here: the candidates table's columns, the verdict and winner lines, the package command, and the
Pareto plot (``pareto``). Any field of a candidate may be null (a failed build has no latency, a skipped
one no accuracy): it shows as "—" and is left out of the plot.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from ptopt.core.atomic import write_text_atomic
from ptopt.optimize.pareto import PlotData, pareto_plot
from ptopt.validate.noise import combined_spread, latency_noisy, speedup_noisy
from ptopt.validate.reports import common, json_report
from ptopt.validate.reports import html as H
from ptopt.validate.reports import markdown as M
from ptopt.validate.reports import terminal as T


# -- the facts every report shows ------------------------------------------------------------------
def candidates(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list(report.get("candidates") or [])


def batch_sizes(report: dict[str, Any]) -> list[str]:
    """The batch sizes as the latency dicts' keys (strings), in the order requested."""
    return [str(b) for b in report.get("batch_sizes") or []]


def ranking_batch_size(report: dict[str, Any]) -> str:
    """The batch size whose latency ranks the candidates (the largest requested, unless the report says)."""
    rbs = report.get("ranking_batch_size")
    if rbs is None:
        sizes = [int(b) for b in batch_sizes(report)]
        rbs = max(sizes) if sizes else 1
    return str(rbs)


def best_candidate(report: dict[str, Any]) -> dict[str, Any] | None:
    name = report.get("best")
    return next((c for c in candidates(report) if c.get("name") == name), None) if name else None


def has_winner(report: dict[str, Any]) -> bool:
    """A candidate within the budget was found (exit 0)."""
    return report.get("exit_code", 1) == 0 and best_candidate(report) is not None


def latency(c: dict[str, Any], bs: str) -> float | None:
    return ((c.get("latency_ms") or {}).get(bs) or {}).get("median")


def reference_candidate(report: dict[str, Any]) -> dict[str, Any] | None:
    """The candidate every speedup divides by (``report["reference"]`` names it)."""
    ref = report.get("reference")
    return next((c for c in candidates(report) if c.get("name") == ref or c.get("label") == ref), None)


# -- the timing noise (the rule: ptopt.validate.noise) ---------------------------------------------
def _spread(c: dict[str, Any] | None, bs: str) -> float | None:
    return (((c or {}).get("latency_ms") or {}).get(bs) or {}).get("spread_pct")


def is_noisy(report: dict[str, Any], c: dict[str, Any], bs: str) -> bool:
    """The candidate's latency or speedup at ``bs`` is within the timing noise (``ptopt.validate.noise``):
    its rounds spread too much (rule 1, as in validate), or the engine flagged it (``noisy``: true, or per
    batch size) and, for a candidate-wide flag, its speedup there is within the combined spread of its
    and the reference's rounds of 1.0 (rule 2, the rule the engine flags by)."""
    if latency_noisy(_spread(c, bs)):
        return True
    flag = c.get("noisy")
    if isinstance(flag, dict):
        return bool(flag.get(bs))
    if not flag:
        return False
    sp = (c.get("speedup") or {}).get(bs)
    return sp is None or speedup_noisy(sp, _spread(c, bs), _spread(reference_candidate(report), bs))


def noise_notes(report: dict[str, Any]) -> list[str]:
    """A footnote per candidate and batch size marked noisy, saying which rule holds."""
    out, ref = [], reference_candidate(report)
    for c in candidates(report):
        for bs in batch_sizes(report):
            if latency(c, bs) is None or not is_noisy(report, c, bs):
                continue
            if latency_noisy(_spread(c, bs)):
                out.append(common.spread_note(c.get("name"), bs, _spread(c, bs)))
            else:
                sp = (c.get("speedup") or {}).get(bs)
                out.append(
                    common.within_note(
                        c.get("name"), bs, sp, combined_spread(_spread(c, bs), _spread(ref, bs))
                    )
                )
    return out


# -- what the budget is on, the machine, the search ------------------------------------------------
def y_value(report: dict[str, Any], c: dict[str, Any]) -> float | None:
    """What the budget is on: top-1 in % (metric "top1"), or the worst sample's cosine vs fp32."""
    if report.get("metric") == "cosine":
        return cosine_judged(c)
    acc = c.get("accuracy")
    return None if acc is None else 100.0 * acc


def cosine_judged(c: dict[str, Any]) -> float | None:
    """The worst-sample cosine ``--min-cosine`` judges: projected to the reference sample count
    (``ptopt.core.tail``); a report without projections (``ptopt.optimize/2`` before them) has the
    measured one only."""
    projected = c.get("cosine_projected")
    return c.get("cosine_min") if projected is None else projected


def reference_samples(report: dict[str, Any]) -> int | None:
    """The sample count worst cosines are projected to (None: a report from before projections)."""
    return (report.get("worst_cosine") or {}).get("reference_samples")


def y_label(report: dict[str, Any]) -> str:
    if report.get("metric") != "cosine":
        return "top-1 accuracy %"
    n = reference_samples(report)
    return "min cosine vs fp32" + ("" if n is None else f" (projected to {n} samples)")


def budget_line(report: dict[str, Any]) -> str:
    b = report.get("budget") or {}
    parts = []
    if b.get("max_accuracy_drop") is not None:
        parts.append(f"accuracy drop ≤ {b['max_accuracy_drop']:g} points of top-1")
    if b.get("min_cosine") is not None:
        n = reference_samples(report)
        over = "" if n is None else f", projected to {n} samples"
        parts.append(f"worst-sample cosine vs fp32 ≥ {b['min_cosine']:g}{over}")
    return " and ".join(parts) or "no accuracy budget"


def cosine_note(report: dict[str, Any]) -> list[str]:
    """What the two cosine columns are (a ``--min-cosine`` report with projections)."""
    n = reference_samples(report)
    if report.get("metric") != "cosine" or n is None:
        return []
    return [
        f"cos min: the worst-sample cosine measured on the held-out samples; cos proj: that worst projected to {n} "
        "samples like them (what the budget judges: the worst of a few dozen samples flatters a heavy tail)."
    ]


def budget_threshold(report: dict[str, Any]) -> float | None:
    """The budget on the plot's y axis: reference accuracy − drop (top1), or the min cosine."""
    b = report.get("budget") or {}
    if report.get("metric") == "cosine":
        return b.get("min_cosine")
    if b.get("max_accuracy_drop") is None:
        return None
    for c in candidates(report):  # accuracy + drop is the reference's accuracy (drop in points)
        if c.get("accuracy") is not None and c.get("accuracy_drop") is not None:
            return 100.0 * c["accuracy"] + c["accuracy_drop"] - b["max_accuracy_drop"]
    return None


def machine(report: dict[str, Any]) -> dict[str, Any]:
    """``report["machine"]``: ``ptopt.core.system.machine_summary()``'s dict, as in validate's report. A
    ``ptopt.optimize/1`` report's reduced one (``{"cpu": model, "isa": "avx2,fma", "threads", "device"}``,
    the versions at the top level) is read into that shape."""
    m = report.get("machine") or {}
    if isinstance(m.get("cpu"), dict) or not m:
        return m
    isa = {flag: True for flag in str(m.get("isa") or "").split(",") if flag}
    versions = {k: report[f"{k}_version"] for k in ("ptopt", "torch") if report.get(f"{k}_version")}
    return {"cpu": {"model": m.get("cpu"), "isa": isa}, "versions": versions}


def machine_line(report: dict[str, Any]) -> str:
    """Validate's machine line (``common.machine_line``) of the machine the candidates were timed on."""
    old = report.get("machine") or {}  # a ptopt.optimize/1 report kept threads and device there
    threads = report.get("threads", old.get("threads", "?"))
    return common.machine_line(machine(report), threads, report.get("device", old.get("device")))


def versions_line(report: dict[str, Any]) -> str:
    return common.versions_line(machine(report))


def search_line(report: dict[str, Any]) -> str:
    sizes = ", ".join(batch_sizes(report)) or "?"
    elapsed, limit = report.get("elapsed_s"), report.get("time_budget_s")
    took = "" if elapsed is None else f"; search took {elapsed:.1f} s"
    return (
        f"model {report.get('model', '?')}; runtime {report.get('runtime', 'any')}; batch sizes {sizes} "
        f"(ranked at {ranking_batch_size(report)}); speedups vs {report.get('reference', 'fp32 eager')}"
        f"{took}"
        + ("" if limit is None else f" of a {limit:g} s time budget")
        + _over_note(report)
        + _native_note(report)
    )


def overrun(report: dict[str, Any]) -> dict[str, Any] | None:
    """Past the time budget: ``{"seconds": by how much, "causes": [...]}``, the causes the phases
    (``time_phases``) and candidates (``spent_s`` against ``estimate_s``) that took longer than planned,
    the largest excess first; None within the budget."""
    elapsed, budget = report.get("elapsed_s"), report.get("time_budget_s")
    if elapsed is None or budget is None or elapsed <= budget:
        return None
    causes = []
    for name, ph in (report.get("time_phases") or {}).items():
        if ph.get("planned") is not None and ph["seconds"] > ph["planned"] + 1:
            causes.append(
                (
                    ph["seconds"] - ph["planned"],
                    f"{name} took {ph['seconds']:.0f} s, {ph['planned']:.0f} s planned",
                )
            )
    for c in report.get("candidates") or []:
        est, took = c.get("estimate_s"), c.get("spent_s")
        if est is not None and took is not None and took > est + 1:
            causes.append((took - est, f"{c['name']} took {took:.0f} s, estimated {est:.0f} s"))
    causes.sort(key=lambda t: -t[0])
    return {"seconds": round(elapsed - budget, 1), "causes": [text for _, text in causes[:3]]}


def _over_note(report: dict[str, Any]) -> str:
    over = report.get("over_budget")
    if not over:
        return ""
    why = "; ".join(over["causes"]) or "no phase or build ran more than a second past its estimate"
    return f" (over by {over['seconds']:.0f} s: {why})"


def _native_note(report: dict[str, Any]) -> str:
    """With --isa: which CPU level the main table's figures were measured at (this CPU's, uncapped)."""
    isa = report.get("isa")
    if not isa:
        return ""
    return f"; figures measured on this CPU, uncapped (level {isa.get('native_level') or 'unknown'})"


# -- the candidates table --------------------------------------------------------------------------
def where(c: dict[str, Any]) -> str:
    engine = f" ({c['engine']})" if c.get("engine") else ""
    return f"{c.get('format') or '?'} / {c.get('runtime') or '?'}{engine}"


def table_head(report: dict[str, Any]) -> list[str]:
    if report.get("metric") != "cosine":
        acc = ["top-1 %", "drop", "cos min"]
    else:
        acc = ["cos min"] if reference_samples(report) is None else ["cos min", "cos proj"]
    sizes = batch_sizes(report)
    return (
        ["", "candidate", "format / runtime", "precision", "MB"]
        + acc
        + [f"ms @{bs}" for bs in sizes]
        + [f"speedup @{bs}" for bs in sizes]
        + ["status"]
    )


#: the columns of ``table_head`` that are text (left-aligned); "status" is the one that wraps
TEXT_COLUMNS = ("", "candidate", "format / runtime", "precision")


def table_row(report: dict[str, Any], c: dict[str, Any]) -> list[str]:
    """One candidate's cells, the columns of ``table_head``."""
    ref = c is reference_candidate(report)
    cos = common.fmt_cos(c.get("cosine_min"))
    if report.get("metric") != "cosine":
        acc = [
            common.fmt_metric(c.get("accuracy"), percent=True),
            common.fmt_drop(c.get("accuracy_drop"), "pts", ref),
            cos,
        ]
    else:
        acc = [cos] if reference_samples(report) is None else [cos, common.fmt_cos(c.get("cosine_projected"))]
    sizes = batch_sizes(report)
    mark = "★" if c.get("name") == report.get("best") else (common.REF if ref else "")
    speed = [
        common.fmt_speedup((c.get("speedup") or {}).get(bs), is_noisy(report, c, bs), ref) for bs in sizes
    ]
    return (
        [
            mark,
            c.get("name") or "?",
            where(c),
            c.get("precision") or common.NONE,
            common.fmt_mb(c.get("size_bytes")),
        ]
        + acc
        + [common.fmt_ms(latency(c, bs), is_noisy(report, c, bs)) for bs in sizes]
        + speed
        + [fmt_status(c)]
    )


#: a status cell shows this much of its reason (report.json keeps it whole)
STATUS_CHARS = 400


def fmt_status(c: dict[str, Any]) -> str:
    from ptopt.core.errors import clip

    status = c.get("status") or "?"
    return (
        status if status == "kept" or not c.get("reason") else clip(f"{status}: {c['reason']}", STATUS_CHARS)
    )


# -- the verdict and the package command -----------------------------------------------------------
def artifact_path(report: dict[str, Any], directory: str | os.PathLike | None) -> str | None:
    """``DIR/best.<ext>`` of the best candidate (``best.<ext>`` when ``directory`` is None: relative to
    the output folder), or None when it has no file to serve."""
    c = best_candidate(report)
    if c is None:
        return None
    name = report.get("best_path")
    if not name:
        ext = Path(c["path"]).suffix if c.get("path") else _target_row(c).suffix
        name = f"best{ext}" if ext else None
    if name is None or directory is None:
        return name
    return str(Path(directory) / name)


def packageable(c: dict[str, Any]) -> bool:
    """``ptopt package`` serves the file as it is (else it exports it to TorchScript first)."""
    flag = c.get("packageable")
    return bool(flag) if flag is not None else "torchserve" in _target_row(c).servers


def _target_row(c: dict[str, Any]) -> Any:
    """The format row of a candidate's ``format`` (an export target; the base row when unknown)."""
    from ptopt.core.formats import targets
    from ptopt.formats.base import Format

    return targets().get(c.get("format") or "") or Format()


def package_command(report: dict[str, Any], directory: str | os.PathLike | None) -> str | None:
    """The ``ptopt package`` command for the best artifact (``--allow-pickle`` for an AOTInductor package,
    whose native code runs when it loads, as ``ptopt package`` requires)."""
    path = artifact_path(report, directory)
    if path is None:
        return None
    c = best_candidate(report) or {}
    consent = " --allow-pickle" if c.get("format") == "aoti" else ""
    return f"ptopt package {path} --format mar -o model.mar{consent}"


def headline(report: dict[str, Any]) -> str:
    """One line: the winner and its speedup, or, loudly, that no candidate meets the budget."""
    c, rbs = best_candidate(report), ranking_batch_size(report)
    ref = report.get("reference") or "fp32 eager"
    if has_winner(report):
        sp = (c.get("speedup") or {}).get(rbs)
        speed = f"{sp:.2f}x {ref} at batch {rbs}" if sp is not None else f"no speedup measured at batch {rbs}"
        return (
            f"best: {c['name']} ({c.get('label') or where(c)}): {speed}{lead_caveat(report, c, rbs)}, within "
            f"the budget ({budget_line(report)}){_cosine_figures(report, c)}"
        )
    found = f"; the best found, {c['name']}, does NOT meet it" if c is not None else ""
    return f"NO CANDIDATE MEETS THE BUDGET ({budget_line(report)}){found} (exit 1)"


def lead_caveat(report: dict[str, Any], c: dict[str, Any], rbs: str) -> str:
    """`` (~ not a clear lead: WHY; ...)`` when the timing cannot tell the winner from the next fastest
    candidate within the budget at ``rbs`` (``validate.noise.clear_lead``, validate's ★ rule), else ``""``."""
    from ptopt.validate.noise import clear_lead

    def cell(x: dict[str, Any] | None) -> dict[str, Any] | None:
        if x is None or latency(x, rbs) is None:
            return None
        return {"p50_ms": latency(x, rbs), "round_spread_pct": _spread(x, rbs)}

    rivals = [
        x for x in candidates(report) if x is not c and x.get("status") == "kept" and x.get("within_budget")
    ]
    rivals = [x for x in rivals if latency(x, rbs) is not None]
    runner_up = min(rivals, key=lambda x: latency(x, rbs), default=None)
    why = clear_lead(cell(c), cell(runner_up))
    ref = reference_candidate(report)
    # the speedup divides by the reference's median: a noisy one makes the headline figure noisy too
    ref_noisy = ref is not None and ref is not c and latency_noisy(_spread(ref, rbs))
    if why is None and not ref_noisy:
        return ""
    parts = []
    if why is not None:
        vs = f" over {runner_up['name']}" if runner_up is not None and "lead" in why else ""
        parts.append(f"not a clear lead{vs}: {why}")
    if ref_noisy:
        parts.append(
            f"the speedup divides by the reference {ref.get('name')}, whose timing rounds spread "
            f"{_spread(ref, rbs):.0f}%"
        )
    return f" ({common.NOISY_MARK} {'; '.join(parts)}; time it again on a quiet machine)"


def busy_line(report: dict[str, Any]) -> list[str]:
    """The machine was busy during the final timing (most cells noisy after timing again), or nothing."""
    t = report.get("timing_noise") or {}
    out = []
    if t.get("reference_noisy"):
        out.append(
            f"The reference's timing was noisy at batch size(s) {', '.join(map(str, t['reference_noisy']))}: every "
            "speedup there divides by it and is not to be trusted."
        )
    if not t.get("busy"):
        return out
    again = f" after {t['retimed']} more timing(s)" if t.get("retimed") else " (no time left to time again)"
    return out + [
        f"The machine was busy: {t['noisy_cells']} of {t['cells']} timings noisy{again}; the speedups above "
        "are not to be trusted."
    ]


def _cosine_figures(report: dict[str, Any], c: dict[str, Any]) -> str:
    """``; worst cosine 0.9998 measured on 32 held-out samples (0.9991 projected to 1000, what the budget
    judges)`` for a ``--min-cosine`` winner. The measured worst leads: it is the figure unseen inputs of that size show (the
    MiniLM bench: 0.9909 measured against 0.9923 on 128 unseen sentences); the projection, lower by design,
    is what the budget judges."""
    tail = c.get("tail") or {}
    if report.get("metric") != "cosine" or c.get("cosine_projected") is None or not tail:
        return ""
    held = " held-out" if (report.get("split") or {}).get("heldout_samples") else ""
    n = reference_samples(report) or tail.get("reference_samples")
    return (
        f"; worst cosine {c['cosine_min']:.4f} measured on {tail.get('samples')}{held} samples "
        f"({c['cosine_projected']:.4f} projected to {n}, what the budget judges)"
    )


def per_batch_lines(report: dict[str, Any], directory: str | os.PathLike | None = None) -> list[str]:
    """Where the fastest candidate differs between the timed batch sizes: each batch size's, with its file
    (the winner is the one at the largest; ``--batch-size B`` alone makes B's the winner)."""
    by = report.get("best_by_batch") or {}
    if len({e["name"] for e in by.values()}) < 2:
        return []
    ref = report.get("reference") or "fp32 eager"
    parts = []
    for bs, e in by.items():
        sp = "" if e.get("speedup") is None else f", {e['speedup']:.2f}x {ref}"
        path = e.get("path")
        path = "" if not path else f", `{os.path.join(str(directory), path) if directory else path}`"
        parts.append(f"batch {bs}: `{e['name']}`{sp}{path}")
    return [
        f"Fastest within the budget per batch size: {'; '.join(parts)}. Deploy the one for your batch size "
        f"(`--batch-size B` alone makes it the winner)."
    ]


def winner_lines(report: dict[str, Any], directory: str | os.PathLike | None) -> list[str]:
    """The winner (or the best found) and the command that packages it; ``directory``: the output
    folder the command names, or None for paths relative to it (a report inside the folder)."""
    c = best_candidate(report)
    if c is None:
        return ["No artifact to package: no candidate was kept."]
    cmd, art = package_command(report, directory), artifact_path(report, directory)
    steps = " → ".join(c.get("steps") or []) or "as loaded"
    what = "Winner" if has_winner(report) else "Best found (outside the budget: check it before you ship it)"
    out = [f"{what}: `{c['name']}` ({c.get('label') or where(c)}; made by: {steps}), saved as `{art}`."]
    if cmd is None:
        out.append(
            f"It is the {c.get('format')} model itself: `ptopt package MODEL` exports it to TorchScript."
        )
        return out
    where_ = "" if directory else " (from the output folder)"
    triton = " (or `--format triton -o model_repository`)" if "triton" in _target_row(c).servers else ""
    out.append(f"Package it for TorchServe{where_}: `{cmd}`{triton}.")
    if not packageable(c):
        out.append(
            "Note: `ptopt package` serves the formats whose rows name TorchServe as they are; it exports this "
            f"{c.get('format')} artifact to TorchScript first, so the served model is not the one timed here."
        )
    return out


# -- the files and the terminal --------------------------------------------------------------------
def write_json(report: dict[str, Any], path: str | os.PathLike) -> None:
    """``report.json``: the report as is (non-finite numbers as null, so any JSON parser reads it)."""
    json_report.write(report, path)


def isa_head(report: dict[str, Any]) -> list[str]:
    """``--isa``: the columns of the per-level table."""
    # what the level's column holds: the drop in top-1 points (validate's definition), or the cosine judged
    y = "top-1 drop vs fp32 native" if report.get("metric") != "cosine" else y_label(report)
    return (
        ["candidate", "level", "kernels", y]
        + [f"speedup @{bs} emu" for bs in batch_sizes(report)]
        + ["holds the budget"]
    )


def isa_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per (candidate judged at the levels, level)."""
    rows = []
    for c in candidates(report):
        for level, f in (c.get("by_isa") or {}).items():
            if "within_budget" not in f:
                continue
            y = f.get("accuracy_drop") if report.get("metric") == "top1" else f.get("cosine_projected")
            held = {True: "yes", False: f"NO: {f.get('why')}", None: f.get("why") or "not checked"}[
                f["within_budget"]
            ]
            sp = [common.fmt_speedup((f.get("speedup") or {}).get(bs)) for bs in batch_sizes(report)]
            cell = (
                common.NONE
                if y is None
                else (f"{y:+.2f} pts" if report.get("metric") == "top1" else f"{y:.5f}")
            )
            if f["within_budget"] and _f32_notes(f):
                held += " (run in f32 at this level)"
            rows.append([c.get("name") or "?", level, f.get("coverage") or "", cell, *sp, held])
    return rows


def isa_lines(report: dict[str, Any]) -> list[str]:
    """``--isa``: what the per-level table needs said; a level that is this CPU's own (``native``, or its
    highest) is the search's figures, measured in this process, not a child's."""
    isa = report.get("isa")
    if not isa:
        return []
    levels, native = list(isa.get("levels") or []), isa.get("native_level")
    own = isa.get("measured_here")
    own = [lv for lv in levels if lv in ("native", native)] if own is None else list(own)
    capped = [lv for lv in levels if lv not in own]
    out = []
    if own:
        out.append(
            f"--isa {', '.join(own)}: this CPU's own level ({native}): the search's figures above, measured in "
            "this process without a cap"
        )
    if capped:
        out.append(
            f"--isa {', '.join(capped)}: every candidate kept within the budget judged again at each level on the "
            f"{isa.get('samples')} samples that accepted it, in a child process with the kernel libraries capped "
            f"(this CPU: {native}); emu: emulated speedup, this CPU running that level's code"
        )
    out += [f"level {lv}: {ch['crash']}" for lv, ch in (isa.get("children") or {}).items() if ch.get("crash")]
    out += _level_notes(report)
    return out


def _f32_notes(f: dict[str, Any]) -> list[str]:
    """The parts of a level's note that say a bf16 artifact ran in f32 there (``validate.isa._f32_at``)."""
    return [n for n in str(f.get("note") or "").split("; ") if "runs in f32" in n]


def _level_notes(report: dict[str, Any]) -> list[str]:
    """Each level's notes once (a bf16 IR run in f32 under the cap, a runtime that follows partly) and why a
    level has no speedups (the reference failed there, or a candidate's timing)."""
    out: list[str] = []
    for c in candidates(report):
        for level, f in (c.get("by_isa") or {}).items():
            if "within_budget" not in f and f.get("error"):  # the reference
                out.append(
                    f"level {level}: no emulated speedups: the reference {c.get('name')} failed there: {f['error']}"
                )
            elif f.get("no_speedup") and "the reference" not in f["no_speedup"]:
                out.append(f"{c.get('name')} at {level}: no emulated speedup: {f['no_speedup']}")
            out += [n for n in _f32_notes(f) if n not in out]
    return out


def render_markdown(report: dict[str, Any], directory: str | os.PathLike | None = None) -> str:
    title = f"ptopt optimize: {headline(report)}"
    out = M.heading("✅" if has_winner(report) else "❌", title, machine_line(report), versions_line(report))
    out += [f"Budget: {budget_line(report)}; {search_line(report)}.", ""]
    rows = []
    for c in candidates(report):
        cells = table_row(report, c)
        cells[1] = f"**`{c.get('name')}`**" if cells[0] == "★" else f"`{c.get('name')}`"
        rows.append(cells)
    out += M.table(table_head(report), rows)
    out += [""] + cosine_note(report) + winner_lines(report, directory) + per_batch_lines(report, directory)
    if isa_rows(report):
        out += ["", "**Per CPU level (`--isa`)**", ""] + M.table(isa_head(report), isa_rows(report))
    out += [""] + isa_lines(report) if isa_lines(report) else []
    return "\n".join(out + M.noise_section(noise_notes(report) + busy_line(report)) + [""])


def write_markdown(
    report: dict[str, Any], path: str | os.PathLike, directory: str | os.PathLike | None = None
) -> None:
    """``summary.md``. The package command names ``directory`` (the output folder as the user gave it);
    without it, the artifact's path relative to the folder (reports are often written into a staging
    folder that is renamed afterwards, so the folder they are written to is not the one to name)."""
    write_text_atomic(path, render_markdown(report, directory))


def render_terminal(
    report: dict[str, Any], directory: str | os.PathLike | None = None, width: int = T.WIDTH
) -> str:
    """The candidates table and the verdict, as plain text for the CLI, ``width`` columns wide (the
    table wrapped by column where it is wider, the candidate names whole); with ``directory`` (the
    output folder), also the winner's file and the command that packages it."""
    from rich.markup import escape

    rows = []
    for c in candidates(report):
        style = "bold green" if c.get("name") == report.get("best") else None
        style = "dim" if c.get("status") not in ("kept", None) else style
        rows.append(([escape(x) for x in table_row(report, c)], style))
    # the budget on a line of its own (a table's title wraps at the table's width)
    tables = T.fitted("", table_head(report), rows, width, TEXT_COLUMNS, {"status": {}})
    head = [
        ("machine", machine_line(report)),
        ("versions", versions_line(report)),
        ("search", search_line(report)),
    ]
    lines = cosine_note(report) + [headline(report)]
    if directory is not None:
        lines += [x.replace("`", "") for x in winner_lines(report, directory)]
    lines += [x.replace("`", "") for x in per_batch_lines(report, directory)]
    lines += noise_notes(report) + busy_line(report)
    parts = [T.head_lines(head), f"ptopt optimize — {budget_line(report)}", *tables, "\n".join(lines)]
    if isa_rows(report):
        isa = [([escape(x) for x in row], None) for row in isa_rows(report)]
        left = {"candidate", "level", "kernels", "holds the budget"}
        wrap = {"holds the budget": {}}  # a long reason wraps; the candidate names stay whole
        parts += T.fitted("per CPU level (--isa)", isa_head(report), isa, width, left, wrap, keys=1)
        parts.append("\n".join(isa_lines(report)))
    return T.to_text(parts, width)


def plot_data(report: dict[str, Any]) -> PlotData:
    """What the Pareto plot shows: every candidate with a latency at the ranking batch size and a y value."""
    rbs = ranking_batch_size(report)
    pts = [(latency(c, rbs), y_value(report, c), c) for c in candidates(report)]
    return PlotData(
        points=[(x, y, c) for x, y, c in pts if x is not None and y is not None],
        batch_size=rbs,
        y_label=y_label(report),
        threshold=budget_threshold(report),
        budget_line=budget_line(report),
        best=report.get("best"),
        has_winner=has_winner(report),
    )


def _plot_html(report: dict[str, Any]) -> str:
    """The Pareto plot (or why there is none) and the candidates it leaves out."""
    e_, rbs = html.escape, ranking_batch_size(report)
    uri = pareto_plot(plot_data(report))
    if not uri:
        return (
            f"<p class='fail'>Nothing to plot: no candidate has both a latency at batch {e_(rbs)} and "
            f"a {e_(y_label(report))}.</p>"
        )
    out = f"<img alt='Pareto plot' title='latency at batch {e_(rbs)} vs {e_(y_label(report))}' src='{uri}'>"
    left_out = [
        c.get("name") or "?"
        for c in candidates(report)
        if latency(c, rbs) is None or y_value(report, c) is None
    ]
    if left_out:
        out += f"<p class='dim'>Not in the plot (no numbers): {e_(', '.join(left_out))}.</p>"
    return out


def _table_html(report: dict[str, Any]) -> str:
    head = table_head(report) + ["steps"]
    cands = candidates(report)
    rows = [table_row(report, c) + [" → ".join(c.get("steps") or [])] for c in cands]
    classes = [
        "best" if c.get("name") == report.get("best") else ("" if c.get("status") == "kept" else "out")
        for c in cands
    ]
    return H.table(head, rows, {1, 2, 3, len(head) - 2, len(head) - 1}, classes)


def _isa_html(report: dict[str, Any]) -> str:
    rows = isa_rows(report)
    if not rows:
        return H.paragraphs(isa_lines(report), "dim")
    head = isa_head(report)
    classes = ["out" if r[-1].startswith("NO") else "" for r in rows]
    table = H.table(head, rows, {0, 1, 2, len(head) - 1}, classes)
    return "<h2>Per CPU level (--isa)</h2>" + table + H.paragraphs(isa_lines(report), "dim")


def render_html(report: dict[str, Any], directory: str | os.PathLike | None = None) -> str:
    e_, rbs, what = html.escape, ranking_batch_size(report), y_label(report)
    verdict = (
        f"<h1 class='{'pass' if has_winner(report) else 'loud'}'>ptopt optimize: {e_(headline(report))}</h1>"
    )
    lines = winner_lines(report, directory) + per_batch_lines(report, directory)
    winner = "".join(f"<p>{H.code_spans(e_(x))}</p>" for x in lines)
    return H.page(
        f"ptopt optimize — {headline(report)}",
        f"""{verdict}
<p class="dim">Machine: {e_(machine_line(report))}<br>Versions: {e_(versions_line(report))}<br>
Search: {e_(search_line(report))}</p>
<h2>Budget</h2><p>{e_(budget_line(report))}; metric: {e_(what)}. Exit code {report.get("exit_code")}.</p>
{winner}
<h2>Pareto plot</h2>{_plot_html(report)}
<p class="dim">x: median latency at batch {e_(rbs)} (log scale); y: {e_(what)}; marker area ∝ file
size; dashed: the Pareto front (no other candidate is both faster and more accurate); dotted: the budget;
circled: the best; grey: rejected, failed or skipped.</p>
<h2>Candidates</h2>{_table_html(report)}
{_isa_html(report)}
{H.paragraphs(cosine_note(report), "dim")}
<p class="dim">ms: median of interleaved timing rounds in one process;
speedup vs {e_(report.get("reference") or "fp32 eager")}; {e_(common.NOISY_MARK)}: within the timing noise.</p>\
{H.paragraphs(noise_notes(report) + busy_line(report), "fail")}""",
    )


def write_html(
    report: dict[str, Any], path: str | os.PathLike, directory: str | os.PathLike | None = None
) -> None:
    """``report.html``: one self-contained file (the plot is an embedded PNG); ``directory`` as in
    ``write_markdown``."""
    write_text_atomic(path, render_html(report, directory))
