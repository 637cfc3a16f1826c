"""The terminal report: the primitives both commands' tables are made of, then validate's: a rich
table, reference first, the best artifact marked ★, then the failed gates and the definition of the
accuracy drop."""

from __future__ import annotations

import io
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ptopt.validate.reports import common
from ptopt.validate.reports import facts as F


# -- primitives (optimize's terminal table uses them too) -------------------------------------------
def head_lines(pairs: Sequence[tuple[str, str]]) -> str:
    """``machine:  ...`` / ``versions: ...``: one labelled line each, the texts aligned."""
    return "\n".join(f"{label + ':':<9} {text}" for label, text in pairs)


def table(
    title: str, head: Sequence[str], left: Collection[str] = (), wrap: Mapping[str, dict] | None = None
) -> Any:
    """A rich table titled ``title``: numbers right-aligned and never wrapped; the columns in ``left``
    left-aligned; the columns in ``wrap`` left-aligned and folded (their value: more ``add_column``
    options, e.g. ``{"max_width": 44}``)."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in head:
        opts = (wrap or {}).get(col)
        if opts is not None:
            t.add_column(col, overflow="fold", **opts)
        else:
            t.add_column(col, justify="left" if col in left else "right", no_wrap=True)
    return t


def to_text(renderables: Sequence[Any], width: int) -> str:
    """Plain text (no colour, no markup: the caller decides), ``width`` columns wide."""
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, soft_wrap=False)
    for r in renderables:
        console.print(r, markup=False, soft_wrap=isinstance(r, str))
    return buf.getvalue()


# -- validate's table ------------------------------------------------------------------------------
def print_report(data: dict[str, Any]) -> None:
    """Print to stdout, wide enough for the table (CI logs are not terminals)."""
    from rich.console import Console

    width = Console().width if Console().is_terminal else 0
    Console(soft_wrap=False, width=max(width, 150)).print(render(data))


def _latency_cells(data: dict[str, Any], e: dict[str, Any]) -> list[str]:
    """p50 per batch size, each with the artifact's speedup over the reference."""
    out = []
    for bs in data["batch_sizes"]:
        cell = F.ms_cell(e["latency"].get(str(bs)))
        if not F.is_reference(e) and str(bs) in (e.get("speedup") or {}):
            cell += f" {F.speedup_cell(e, bs)}"
        out.append(cell)
    return out


_LEGEND = (
    "p50 ms: median latency per batch, with the speedup over the reference; agree: top-1 agreement "
    "with the reference (per token for [N, tokens, vocab] outputs); cos min: the worst sample's cosine "
    "of its outputs with the reference's; max|Δ|: largest output difference"
)
_LM_LEGEND = (
    "decode / prefill tok/s: tokens per second at batch 1 with the KV cache (median of the rounds); "
    "weight MB: the weights in memory; disk MB: every file of the artifact; peak MB: peak resident memory"
)


def _foot(data: dict[str, Any]) -> list[str]:
    out = [_LM_LEGEND if F.is_lm(data) else _LEGEND, F.drop_line(data)]
    for g in data["gate_results"]:
        if not g["passed"] and not g.get("inconclusive"):
            out.append(f"FAILED {g['artifact']}: {g['gate']}: {g['message']}")
    for e in F.rows(data):
        for bs, st in e["latency"].items():
            if "skipped" in st:
                out.append(f"n/a: {e['name']} at batch {bs}: {st['skipped']}")
    return out + F.noise_notes(data) + [f"note: {n}" for n in data.get("notes", [])]


def render(data: dict[str, Any]) -> Any:
    """A rich renderable (a Group of the header, the table and the footer)."""
    from rich.console import Group
    from rich.markup import escape
    from rich.text import Text

    head = (
        ["", "artifact", "runtime", F.metric_header(data), "drop", "agree", "cos min", "max|Δ|", "MB"]
        + [f"p50 ms @{bs}" for bs in data["batch_sizes"]]
        + ["peak MB", "gates"]
    )
    if F.is_lm(data):
        head = ["", "artifact", "runtime", *F.LM_HEAD, "gates"]
    wrap = {"artifact": {"max_width": 28}, "runtime": {"max_width": 22}, "gates": {"max_width": 44}}
    t = table(f"ptopt validate — {F.summary_line(data)}", head, left={""}, wrap=wrap)
    for e in F.rows(data):
        agr = e.get("agreement") or {}
        status = F.gate_status(e)
        style = "bold green" if e.get("best") else ("red" if status.startswith("FAIL") else None)
        style = "yellow" if status.startswith("INCONCLUSIVE") else style
        if F.is_lm(data):
            t.add_row(
                F.mark(e),
                escape(e["name"]),
                escape(e["runtime"]),
                *F.lm_cells(e),
                escape(status),
                style=style,
            )
            continue
        t.add_row(
            F.mark(e),
            escape(e["name"]),
            escape(e["runtime"]),
            F.metric_cell(data, e.get("metric")),
            F.drop_cell(data, e),
            common.fmt_frac(agr.get("top1_agreement")),
            common.fmt_cos(agr.get("min_cosine")),
            common.fmt_diff(agr.get("max_abs_diff")),
            common.fmt_mb((e.get("size") or {}).get("bytes")),
            *_latency_cells(data, e),
            common.fmt_mem(e.get("peak_memory_mb")),
            escape(status),
            style=style,
        )
    lines = [
        ("machine", F.machine_line(data)),
        ("versions", F.versions_line(data)),
        ("data", F.data_line(data)),
    ]
    parts = [Text(head_lines(lines), style="dim"), t, Text("\n".join(_foot(data)))]
    if F.has_isa(data):
        wrap = {"artifact": {"max_width": 28}, "gates": {"max_width": 60}}
        it = table("per CPU level (--isa)", F.isa_head(data), left={"level", "kernels"}, wrap=wrap)
        for row in F.isa_rows(data):
            it.add_row(*(escape(c) for c in row))
        parts += [it, Text("\n".join(F.isa_notes(data)))]
    return Group(*parts)
