"""Markdown for a pull-request comment: verdict first, the table, failed gates, then the details."""

from __future__ import annotations

import os
from typing import Any

from ptopt.core.artifact import write_text_atomic
from ptopt.validate.reports.common import (
    data_line,
    fmt_cos,
    fmt_diff,
    fmt_drop,
    fmt_frac,
    fmt_mb,
    fmt_mem,
    fmt_metric,
    fmt_ms,
    fmt_speedup,
    gate_status,
    machine_line,
    metric_header,
    noise_notes,
    rows,
    summary_line,
    versions_line,
)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(data: dict[str, Any]) -> str:
    icon = (
        "✅"
        if data["passed"]
        else ("⚠️" if data.get("inconclusive") and "FAILED" not in summary_line(data) else "❌")
    )
    out = [
        f"### {icon} ptopt validate: {summary_line(data)}",
        "",
        f"<sub>{machine_line(data)} · {versions_line(data)}</sub>",
        "",
    ]
    sizes = data["batch_sizes"]
    head = (
        [
            "",
            "artifact",
            "runtime",
            metric_header(data),
            "drop",
            "top-1 agree",
            "cosine",
            "min cosine",
            "max abs diff",
            "size MB",
            "gzip MB",
        ]
        + [f"p50 ms @{bs}" for bs in sizes]
        + [f"speedup @{bs}" for bs in sizes]
        + ["peak MB", "gates"]
    )
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "|".join("---" for _ in head) + "|")
    for e in rows(data):
        mark = "★" if e.get("best") else ("ref" if e["role"] == "reference" else "")
        agr = e.get("agreement") or {}
        size = e.get("size") or {}
        cells = (
            [
                mark,
                f"`{e['name']}`",
                e["runtime"],
                fmt_metric(data, e.get("metric")),
                fmt_drop(data, e),
                fmt_frac(agr.get("top1_agreement")),
                fmt_cos(agr.get("cosine")),
                fmt_cos(agr.get("min_cosine")),
                fmt_diff(agr.get("max_abs_diff")),
                fmt_mb(size.get("bytes")),
                fmt_mb(size.get("gzip_bytes")),
            ]
            + [fmt_ms(e["latency"].get(str(bs))) for bs in sizes]
            + [fmt_speedup(e, bs) for bs in sizes]
            + [fmt_mem(e.get("peak_memory_mb")), gate_status(e)]
        )
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    out += _gate_lines(data)
    out += ["", f"Accuracy drop, {data['accuracy_drop']['definition']}", ""]
    for n in data.get("notes", []):
        out.append(f"> note: {n}")
    out += [
        "<details><summary>Machine, data and every gate</summary>",
        "",
        f"- Machine: {machine_line(data)}",
        f"- Versions: {versions_line(data)}",
        f"- Data: {data_line(data)}",
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


def write(data: dict[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(path, render(data))


def _gate_lines(data: dict[str, Any]) -> list[str]:
    """The failed gates, then the timing noise (noisy latencies, inconclusive gates)."""
    out = []
    failed = [g for g in data["gate_results"] if not g["passed"] and not g.get("inconclusive")]
    if failed:
        out += ["", "**Failed gates**", ""]
        out += [f"- `{g['artifact']}` **{g['gate']}**: {g['message']}" for g in failed]
    noise = noise_notes(data)
    if noise:
        out += ["", "**Timing noise**", ""] + [f"- ⚠️ {n}" for n in noise]
    return out
