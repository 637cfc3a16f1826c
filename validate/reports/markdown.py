"""Markdown for a pull-request comment: the primitives both commands' ``summary.md`` are made of
(heading, table, sections), then validate's: verdict first, the table, failed gates, then the details."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ptopt.core.atomic import write_text_atomic
from ptopt.validate.reports import common
from ptopt.validate.reports import facts as F


# -- primitives (optimize's summary.md uses them too) -----------------------------------------------
def cell(text: Any) -> str:
    """A table cell: a ``|`` would end it and a newline the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def heading(icon: str, title: str, machine: str, versions: str) -> list[str]:
    """``### <icon> <title>`` and the machine and versions in small print."""
    return [f"### {icon} {title}", "", f"<sub>{machine} · {versions}</sub>", ""]


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A table's lines: the header, the rule, one line per row (every cell escaped)."""
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return out + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]


def section(title: str, items: Sequence[str], bullet: str = "- ") -> list[str]:
    """A bold title and a list (nothing when the list is empty)."""
    return ["", f"**{title}**", ""] + [f"{bullet}{x}" for x in items] if items else []


def noise_section(notes: Sequence[str]) -> list[str]:
    """The timing-noise footnotes (``common.spread_note`` ...), each flagged ⚠️."""
    return section("Timing noise", notes, "- ⚠️ ")


def write(data: dict[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(path, render(data))


# -- validate's summary ------------------------------------------------------------------------------
def _head(data: dict[str, Any]) -> list[str]:
    if F.is_lm(data):
        return ["", "artifact", "runtime", *F.LM_HEAD, "gates"]
    sizes = data["batch_sizes"]
    return (
        ["", "artifact", "runtime", F.metric_header(data), "drop", "top-1 agree", "cosine", "min cosine",
         "max abs diff", "size MB", "gzip MB"]
        + [f"p50 ms @{bs}" for bs in sizes]
        + [f"speedup @{bs}" for bs in sizes]
        + ["peak MB", "gates"]
    )  # fmt: skip


def _cells(data: dict[str, Any], e: dict[str, Any]) -> list[str]:
    if F.is_lm(data):
        return [F.mark(e), f"`{e['name']}`", e["runtime"], *F.lm_cells(e), F.gate_status(e)]
    agr = e.get("agreement") or {}
    size = e.get("size") or {}
    sizes = data["batch_sizes"]
    return (
        [
            F.mark(e),
            f"`{e['name']}`",
            e["runtime"],
            F.metric_cell(data, e.get("metric")),
            F.drop_cell(data, e),
            common.fmt_frac(agr.get("top1_agreement")),
            common.fmt_cos(agr.get("cosine")),
            common.fmt_cos(agr.get("min_cosine")),
            common.fmt_diff(agr.get("max_abs_diff")),
            common.fmt_mb(size.get("bytes")),
            common.fmt_mb(size.get("gzip_bytes")),
        ]
        + [F.ms_cell(e["latency"].get(str(bs))) for bs in sizes]
        + [F.speedup_cell(e, bs) for bs in sizes]
        + [common.fmt_mem(e.get("peak_memory_mb")), F.gate_status(e)]
    )


def render(data: dict[str, Any]) -> str:
    verdict = F.summary_line(data)
    undecided = data.get("inconclusive") and "FAILED" not in verdict
    icon = "✅" if data["passed"] else ("⚠️" if undecided else "❌")
    out = heading(icon, f"ptopt validate: {verdict}", F.machine_line(data), F.versions_line(data))
    out += table(_head(data), [_cells(data, e) for e in F.rows(data)])
    failed = [g for g in data["gate_results"] if not g["passed"] and not g.get("inconclusive")]
    out += section("Failed gates", [f"`{g['artifact']}` **{g['gate']}**: {g['message']}" for g in failed])
    if F.has_isa(data):
        out += ["", "**Per CPU level (`--isa`)**", ""] + table(F.isa_head(data), F.isa_rows(data))
        out += section("Per CPU level: notes", F.isa_notes(data))
    out += noise_section(F.noise_notes(data))
    drop = F.drop_line(data)
    out += ["", drop[0].upper() + drop[1:], ""]
    out += [f"> note: {n}" for n in data.get("notes", [])]
    out += [
        "<details><summary>Machine, data and every gate</summary>",
        "",
        f"- Machine: {F.machine_line(data)}",
        f"- Versions: {F.versions_line(data)}",
        f"- Data: {F.data_line(data)}",
        f"- Reference: `{data['reference']['name']}` ({data['reference']['runtime']})",
        f"- {data['best_rule']}",
    ]
    if data.get("baseline"):
        out.append(f"- Baseline: `{data['baseline']['path']}` ({data['baseline'].get('created')})")
    for g in data["gate_results"]:
        icon = "✅" if g["passed"] else ("⚠️" if g.get("inconclusive") else "❌")
        out.append(f"- {icon} `{g['artifact']}` {g['gate']}: {g['message']}")
    out += ["", "</details>", ""]
    return "\n".join(out)
