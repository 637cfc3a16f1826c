"""The terminal report: a rich table, reference first, the best artifact marked ★, then the
failed gates and the definition of the accuracy drop."""

from __future__ import annotations

from typing import Any

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


def print_report(data: dict[str, Any]) -> None:
    """Print to stdout, wide enough for the table (CI logs are not terminals)."""
    from rich.console import Console

    width = Console().width if Console().is_terminal else 0
    Console(soft_wrap=False, width=max(width, 150)).print(render(data))


def render(data: dict[str, Any]) -> Any:
    """A rich renderable (a Group of the header, the table and the footer)."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    sizes = data["batch_sizes"]
    t = Table(title=f"ptopt validate — {summary_line(data)}", title_justify="left", show_lines=False)
    t.add_column("", no_wrap=True)
    t.add_column("artifact", overflow="fold", max_width=28)
    t.add_column("runtime", overflow="fold", max_width=22)
    for col in [metric_header(data), "drop", "agree", "cos min", "max|Δ|", "MB"]:
        t.add_column(col, justify="right", no_wrap=True)
    for bs in sizes:
        t.add_column(f"p50 ms @{bs}", justify="right", no_wrap=True)
    t.add_column("peak MB", justify="right", no_wrap=True)
    t.add_column("gates", overflow="fold", max_width=44)
    for e in rows(data):
        agr = e.get("agreement") or {}
        size = e.get("size") or {}
        status = gate_status(e)
        style = "bold green" if e.get("best") else ("red" if status.startswith("FAIL") else None)
        style = "yellow" if status.startswith("INCONCLUSIVE") else style
        mark = "★" if e.get("best") else ("ref" if e["role"] == "reference" else "")
        lat = []
        for bs in sizes:
            cell = fmt_ms(e["latency"].get(str(bs)))
            if e["role"] != "reference" and str(bs) in (e.get("speedup") or {}):
                cell += f" {fmt_speedup(e, bs)}"
            lat.append(cell)
        t.add_row(
            mark,
            escape(e["name"]),
            escape(e["runtime"]),
            fmt_metric(data, e.get("metric")),
            fmt_drop(data, e),
            fmt_frac(agr.get("top1_agreement")),
            fmt_cos(agr.get("min_cosine")),
            fmt_diff(agr.get("max_abs_diff")),
            fmt_mb(size.get("bytes")),
            *lat,
            fmt_mem(e.get("peak_memory_mb")),
            escape(status),
            style=style,
        )
    head = Text(
        f"machine:  {machine_line(data)}\nversions: {versions_line(data)}\ndata:     {data_line(data)}",
        style="dim",
    )
    foot_lines = [
        "p50 ms: median latency per batch, with the speedup over the reference; agree: top-1 agreement "
        "with the reference (per token for [N, tokens, vocab] outputs); cos min: the worst sample's cosine "
        "of its outputs with the reference's; max|Δ|: largest output difference",
        f"accuracy drop, {data['accuracy_drop']['definition']}",
    ]
    for g in data["gate_results"]:
        if not g["passed"] and not g.get("inconclusive"):
            foot_lines.append(f"FAILED {g['artifact']}: {g['gate']}: {g['message']}")
    for e in rows(data):
        for bs, st in e["latency"].items():
            if "skipped" in st:
                foot_lines.append(f"n/a: {e['name']} at batch {bs}: {st['skipped']}")
    foot_lines += noise_notes(data)
    foot_lines += [f"note: {n}" for n in data.get("notes", [])]
    return Group(head, t, Text("\n".join(foot_lines)))
