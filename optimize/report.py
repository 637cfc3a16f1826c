"""The reports of ``ptopt optimize``: ``report.json``, ``report.html`` (a Pareto plot and the candidates
table), ``summary.md`` and the terminal table, all from the one report dict (schema ``ptopt.optimize/1``,
docs/optimize.md).

Every number has one spelling, shared with validate's reports (``ptopt.validate.reports.common``), and
every file is written atomically. Any field of a candidate may be null (a failed build has no latency, a
skipped one no accuracy): it shows as "—" and is left out of the plot.
"""

from __future__ import annotations

import html
import io
import math
import os
import re
from pathlib import Path
from typing import Any

from ptopt.core.atomic import write_text_atomic
from ptopt.validate.reports.common import NOISY_MARK, NOISY_SPREAD_PCT, fmt_cos, fmt_mb
from ptopt.validate.reports.json_report import dumps


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


def _spread(c: dict[str, Any] | None, bs: str) -> float:
    return (((c or {}).get("latency_ms") or {}).get(bs) or {}).get("spread_pct") or 0.0


def is_noisy(report: dict[str, Any], c: dict[str, Any], bs: str) -> bool:
    """The candidate's speedup at ``bs`` is within the timing noise. The engine flags a candidate
    (``noisy``: true, or per batch size); a candidate-wide flag is placed on the batch sizes where the
    engine's rule holds (|speedup − 1| within the combined spread of its and the reference's rounds).
    Rounds that spread more than validate's threshold are noisy whatever the flag."""
    if _spread(c, bs) > NOISY_SPREAD_PCT:
        return True
    flag = c.get("noisy")
    if isinstance(flag, dict):
        return bool(flag.get(bs))
    if not flag:
        return False
    sp = (c.get("speedup") or {}).get(bs)
    if sp is None:
        return True
    return abs(sp - 1.0) * 100.0 <= math.hypot(_spread(c, bs), _spread(reference_candidate(report), bs))


def y_value(report: dict[str, Any], c: dict[str, Any]) -> float | None:
    """What the budget is on: top-1 in % (metric "top1"), or the worst sample's cosine vs fp32."""
    if report.get("metric") == "cosine":
        return c.get("cosine_min")
    acc = c.get("accuracy")
    return None if acc is None else 100.0 * acc


def y_label(report: dict[str, Any]) -> str:
    return "min cosine vs fp32" if report.get("metric") == "cosine" else "top-1 accuracy %"


def budget_line(report: dict[str, Any]) -> str:
    b = report.get("budget") or {}
    parts = []
    if b.get("max_accuracy_drop") is not None:
        parts.append(f"accuracy drop ≤ {b['max_accuracy_drop']:g} points of top-1")
    if b.get("min_cosine") is not None:
        parts.append(f"worst-sample cosine vs fp32 ≥ {b['min_cosine']:g}")
    return " and ".join(parts) or "no accuracy budget"


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


def machine_line(report: dict[str, Any]) -> str:
    m = report.get("machine") or {}
    return (
        f"{m.get('cpu', '?')} (ISA: {m.get('isa') or '?'}); {m.get('threads', '?')} thread(s); "
        f"device {m.get('device', 'cpu')}; torch {report.get('torch_version', '?')}, "
        f"ptopt {report.get('ptopt_version', '?')}"
    )


def search_line(report: dict[str, Any]) -> str:
    sizes = ", ".join(batch_sizes(report)) or "?"
    elapsed, limit = report.get("elapsed_s"), report.get("time_budget_s")
    took = "" if elapsed is None else f"; search took {elapsed:.1f} s"
    return (
        f"model {report.get('model', '?')}; runtime {report.get('runtime', 'any')}; batch sizes {sizes} "
        f"(ranked at {ranking_batch_size(report)}); speedups vs {report.get('reference', 'fp32 eager')}"
        f"{took}" + ("" if limit is None else f" of a {limit:g} s time budget")
    )


# -- cells -----------------------------------------------------------------------------------------
def fmt_acc(v: Any) -> str:
    return "—" if v is None else f"{100 * v:.2f}"


def fmt_drop(v: Any) -> str:
    return "—" if v is None else f"{v:+.2f}"


def fmt_latency(report: dict[str, Any], c: dict[str, Any], bs: str) -> str:
    ms = latency(c, bs)
    return "—" if ms is None else f"{ms:.3f}" + (NOISY_MARK if is_noisy(report, c, bs) else "")


def fmt_speedup(report: dict[str, Any], c: dict[str, Any], bs: str) -> str:
    if c is reference_candidate(report):
        return "ref"
    v = (c.get("speedup") or {}).get(bs)
    return "—" if v is None else f"{v:.2f}x" + (NOISY_MARK if is_noisy(report, c, bs) else "")


def fmt_status(c: dict[str, Any]) -> str:
    status = c.get("status") or "?"
    return status if status == "kept" or not c.get("reason") else f"{status}: {c['reason']}"


def where(c: dict[str, Any]) -> str:
    engine = f" ({c['engine']})" if c.get("engine") else ""
    return f"{c.get('format') or '?'} / {c.get('runtime') or '?'}{engine}"


def table_head(report: dict[str, Any]) -> list[str]:
    acc = ["cos min"] if report.get("metric") == "cosine" else ["top-1 %", "drop (pts)", "cos min"]
    sizes = batch_sizes(report)
    return (
        ["", "candidate", "format / runtime", "precision", "MB"]
        + acc
        + [f"ms @{bs}" for bs in sizes]
        + [f"speedup @{bs}" for bs in sizes]
        + ["status"]
    )


def table_row(report: dict[str, Any], c: dict[str, Any]) -> list[str]:
    """One candidate's cells, the columns of ``table_head``."""
    acc = (
        [fmt_cos(c.get("cosine_min"))]
        if report.get("metric") == "cosine"
        else [fmt_acc(c.get("accuracy")), fmt_drop(c.get("accuracy_drop")), fmt_cos(c.get("cosine_min"))]
    )
    sizes = batch_sizes(report)
    mark = "★" if c.get("name") == report.get("best") else ("ref" if c is reference_candidate(report) else "")
    return (
        [mark, c.get("name") or "?", where(c), c.get("precision") or "—", fmt_mb(c.get("size_bytes"))]
        + acc
        + [fmt_latency(report, c, bs) for bs in sizes]
        + [fmt_speedup(report, c, bs) for bs in sizes]
        + [fmt_status(c)]
    )


def noise_notes(report: dict[str, Any]) -> list[str]:
    out = []
    for c in candidates(report):
        noisy = [bs for bs in batch_sizes(report) if latency(c, bs) is not None and is_noisy(report, c, bs)]
        if noisy:
            out.append(
                f"{NOISY_MARK} noisy: {c.get('name')} at batch {', '.join(noisy)}: its speedup is within "
                "the spread of the timing rounds; the ranking there is not to be trusted"
            )
    return out


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
        return f"best: {c['name']} ({c.get('label') or where(c)}): {speed}, within the budget ({budget_line(report)})"
    found = f"; the best found, {c['name']}, does NOT meet it" if c is not None else ""
    return f"NO CANDIDATE MEETS THE BUDGET ({budget_line(report)}){found} (exit 1)"


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
    out.append(f"Package it for TorchServe{where_}: `{cmd}` (or `--format triton -o model_repository`).")
    if not packageable(c):
        out.append(
            "Note: `ptopt package` serves TorchScript, ONNX and .pt2 files as they are; it exports this "
            f"{c.get('format')} artifact to TorchScript first, so the served model is not the one timed here."
        )
    return out


# -- JSON ------------------------------------------------------------------------------------------
def write_json(report: dict[str, Any], path: str | os.PathLike) -> None:
    """``report.json``: the report as is (non-finite numbers as null, so any JSON parser reads it)."""
    write_text_atomic(path, dumps(report))


# -- Markdown --------------------------------------------------------------------------------------
def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: dict[str, Any], directory: str | os.PathLike | None = None) -> str:
    icon = "✅" if has_winner(report) else "❌"
    head = table_head(report)
    out = [f"### {icon} ptopt optimize: {headline(report)}", "", f"<sub>{machine_line(report)}</sub>", ""]
    out += [f"Budget: {budget_line(report)}; {search_line(report)}.", ""]
    out += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for c in candidates(report):
        name = f"`{c.get('name')}`"
        cells = table_row(report, c)
        cells[1] = f"**{name}**" if cells[0] == "★" else name
        out.append("| " + " | ".join(_md_cell(x) for x in cells) + " |")
    out += [""] + winner_lines(report, directory) + [""]
    notes = noise_notes(report)
    if notes:
        out += ["**Timing noise**", ""] + [f"- ⚠️ {n}" for n in notes] + [""]
    return "\n".join(out)


def write_markdown(
    report: dict[str, Any], path: str | os.PathLike, directory: str | os.PathLike | None = None
) -> None:
    """``summary.md``. The package command names ``directory`` (the output folder as the user gave it);
    without it, the artifact's path relative to the folder (reports are often written into a staging
    folder that is renamed afterwards, so the folder they are written to is not the one to name)."""
    write_text_atomic(path, render_markdown(report, directory))


# -- terminal --------------------------------------------------------------------------------------
def render_terminal(
    report: dict[str, Any], directory: str | os.PathLike | None = None, width: int = 200
) -> str:
    """The candidates table and the verdict, as plain text for the CLI; with ``directory`` (the output
    folder), also the winner's file and the command that packages it."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"ptopt optimize — {budget_line(report)}", title_justify="left")
    for col in table_head(report):
        status = col == "status"  # the one column that wraps: names and numbers stay whole
        left = status or col in ("", "candidate", "format / runtime", "precision")
        t.add_column(
            col,
            justify="left" if left else "right",
            overflow="fold",
            no_wrap=not status,
            min_width=24 if status else None,
        )
    for c in candidates(report):
        style = "bold green" if c.get("name") == report.get("best") else None
        style = "dim" if c.get("status") not in ("kept", None) else style
        t.add_row(*(escape(x) for x in table_row(report, c)), style=style)
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, soft_wrap=False)
    console.print(
        f"machine: {machine_line(report)}\nsearch:  {search_line(report)}", markup=False, soft_wrap=True
    )
    console.print(t)
    lines = [headline(report)]
    if directory is not None:
        lines += [x.replace("`", "") for x in winner_lines(report, directory)]
    lines += noise_notes(report)
    console.print("\n".join(lines), markup=False, soft_wrap=True)
    return buf.getvalue()


# -- HTML ------------------------------------------------------------------------------------------
def pareto_front(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The points no other point beats on both latency (lower) and the y value (higher), by latency."""
    front: list[tuple[float, float, str]] = []
    for p in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or p[1] > front[-1][1]:
            front.append(p)
    return front


#: marker colour of a kept candidate, by runtime; every candidate that was not kept is grey
RUNTIME_COLORS = {"torch": "tab:blue", "onnxruntime": "tab:orange", "aoti": "tab:green"}
NOT_KEPT = "0.75"


def _point_style(c: dict[str, Any], max_bytes: float) -> dict[str, Any]:
    kept = c.get("status") == "kept"
    size = c.get("size_bytes")
    area = 60.0 if not size or not max_bytes else 30.0 + 470.0 * size / max_bytes  # marker area ∝ bytes
    return {
        "s": area,
        "color": RUNTIME_COLORS.get(c.get("runtime"), "tab:purple") if kept else NOT_KEPT,
        "edgecolors": "k" if kept else "0.6",
        "alpha": 0.85 if kept else 0.6,
        "zorder": 3 if kept else 2,
    }


def _draw_points(ax: Any, pts: list[tuple[float, float, dict[str, Any]]]) -> None:
    """Every candidate with numbers, labelled (labels alternate above / below, by latency, so
    neighbours do not print over each other), the Pareto front of the kept ones joined."""
    max_bytes = max((c.get("size_bytes") or 0) for _, _, c in pts)
    for i, (x, y, c) in enumerate(sorted(pts, key=lambda p: p[0])):
        ax.scatter([x], [y], **_point_style(c, max_bytes))
        ax.annotate(
            c.get("name") or "?", (x, y), xytext=(6, 6 if i % 2 == 0 else -12), textcoords="offset points",
            fontsize=7,
        )  # fmt: skip
    front = pareto_front([(x, y, c.get("name")) for x, y, c in pts if c.get("status") == "kept"])
    if front:
        ax.plot(
            [p[0] for p in front], [p[1] for p in front], "--", color="0.3", lw=1, label="Pareto front (kept)"
        )
    runtimes = sorted(
        {c.get("runtime") for _, _, c in pts if c.get("status") == "kept"} & set(RUNTIME_COLORS)
    )
    for rt in runtimes:  # legend entries only: the colour of each runtime
        ax.scatter([], [], color=RUNTIME_COLORS[rt], edgecolors="k", label=rt)
    if any(c.get("status") != "kept" for _, _, c in pts):
        ax.scatter([], [], color=NOT_KEPT, edgecolors="0.6", label="not kept")


def pareto_plot(report: dict[str, Any]) -> str | None:
    """The Pareto plot as a PNG data URI; None when no candidate has both a latency and a y value."""
    from ptopt.validate.reports.html import png_data_uri, pyplot

    rbs = ranking_batch_size(report)
    pts = [(latency(c, rbs), y_value(report, c), c) for c in candidates(report)]
    pts = [(x, y, c) for x, y, c in pts if x is not None and y is not None]
    if not pts:
        return None
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    _draw_points(ax, pts)
    thr = budget_threshold(report)
    if thr is not None:
        ax.axhline(thr, color="tab:red", lw=1, ls=":", label=f"budget ({budget_line(report)})")
    best = next(((x, y, c) for x, y, c in pts if c.get("name") == report.get("best")), None)
    if best is not None:
        ax.scatter([best[0]], [best[1]], s=900, facecolors="none", edgecolors="tab:red", lw=2, zorder=4)
        ax.annotate(
            ("best: " if has_winner(report) else "best found (outside budget): ") + (best[2].get("name") or "?"),
            (best[0], best[1]), xytext=(14, -22), textcoords="offset points", fontsize=9, color="tab:red",
            fontweight="bold",
        )  # fmt: skip
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 13.8, not 1.38×10¹: the axis spans little
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel(f"median latency at batch {rbs} (ms, log scale)")
    ax.set_ylabel(y_label(report))
    ax.set_title("Latency vs accuracy (marker area ∝ file size)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    return png_data_uri(fig)


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}tr.best{background:#e8f7e8;font-weight:bold}tr.out{color:#888}
.pass{color:#1a7f37}.fail{color:#cf222e}.loud{color:#fff;background:#cf222e;padding:0.5em 1em}
.dim{color:#666;font-size:13px}img{max-width:100%}code{background:#f3f3f3;padding:1px 4px}"""


def _html_table(report: dict[str, Any]) -> str:
    e_ = html.escape
    head = table_head(report) + ["steps"]
    left = {1, 2, 3, len(head) - 2, len(head) - 1}

    def tr(cells: list[str], tag: str, cls: str = "") -> str:
        tds = "".join(
            f"<{tag} class='{'l' if i in left else ''}'>{e_(x)}</{tag}>" for i, x in enumerate(cells)
        )
        return f"<tr class='{cls}'>{tds}</tr>"

    trs = [tr(head, "th")]
    for c in candidates(report):
        cls = "best" if c.get("name") == report.get("best") else ("" if c.get("status") == "kept" else "out")
        trs.append(tr(table_row(report, c) + [" → ".join(c.get("steps") or [])], "td", cls))
    return "<table>" + "".join(trs) + "</table>"


def _code(text: str) -> str:
    """Markdown's `code` spans as HTML ``<code>``."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", text)


def render_html(report: dict[str, Any], directory: str | os.PathLike | None = None) -> str:
    e_ = html.escape
    rbs = ranking_batch_size(report)
    uri = pareto_plot(report)
    plot = (
        f"<img alt='Pareto plot' title='latency at batch {e_(rbs)} vs {e_(y_label(report))}' src='{uri}'>"
        if uri
        else f"<p class='fail'>Nothing to plot: no candidate has both a latency at batch {e_(rbs)} and "
        f"a {e_(y_label(report))}.</p>"
    )
    left_out = [
        c.get("name") or "?"
        for c in candidates(report)
        if latency(c, rbs) is None or y_value(report, c) is None
    ]
    if uri and left_out:
        plot += f"<p class='dim'>Not in the plot (no numbers): {e_(', '.join(left_out))}.</p>"
    verdict = (
        f"<h1 class='pass'>ptopt optimize: {e_(headline(report))}</h1>"
        if has_winner(report)
        else f"<h1 class='loud'>ptopt optimize: {e_(headline(report))}</h1>"
    )
    winner = "".join(f"<p>{_code(e_(x))}</p>" for x in winner_lines(report, directory))
    notes = "".join(f"<p class='fail'>{e_(n)}</p>" for n in noise_notes(report))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ptopt optimize — {e_(headline(report))}</title>
<style>{_CSS}</style></head><body>
{verdict}
<p class="dim">Machine: {e_(machine_line(report))}<br>Search: {e_(search_line(report))}</p>
<h2>Budget</h2><p>{e_(budget_line(report))}; metric: {e_(y_label(report))}. Exit code {report.get("exit_code")}.</p>
{winner}
<h2>Pareto plot</h2>{plot}
<p class="dim">x: median latency at batch {e_(rbs)} (log scale); y: {e_(y_label(report))}; marker area ∝ file
size; dashed: the Pareto front (no other candidate is both faster and more accurate); dotted: the budget;
circled: the best; grey: rejected, failed or skipped.</p>
<h2>Candidates</h2>{_html_table(report)}
<p class="dim">ms: median of interleaved timing rounds in one process;
speedup vs {e_(report.get("reference") or "fp32 eager")}; {e_(NOISY_MARK)}: within the timing noise.</p>{notes}
</body></html>
"""


def write_html(
    report: dict[str, Any], path: str | os.PathLike, directory: str | os.PathLike | None = None
) -> None:
    """``report.html``: one self-contained file (the plot is an embedded PNG); ``directory`` as in
    ``write_markdown``."""
    write_text_atomic(path, render_html(report, directory))
