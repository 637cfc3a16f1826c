"""A self-contained HTML report: tables and three plots (accuracy vs latency, size per artifact,
latency per batch size) drawn with matplotlib and embedded as base64 PNG, so the file opens in a
browser offline and can be attached to a CI run as is."""

from __future__ import annotations

import base64
import html
import io
import os
from typing import Any

from ptopt.core.artifact import write_text_atomic
from ptopt.core.errors import MissingDependencyError
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

_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}tr.best{background:#e8f7e8;font-weight:bold}tr.fail{background:#fdecec}
.pass{color:#1a7f37}.fail{color:#cf222e}.dim{color:#666;font-size:13px}img{max-width:100%;margin:0.5em 1em 0.5em 0}
code{background:#f3f3f3;padding:1px 4px}"""


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed), or the instruction to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError(
            "the HTML report draws plots with matplotlib: pip install 'ptopt[report]'"
        ) from None
    return plt


def png_data_uri(fig: Any) -> str:
    """The figure as a base64 PNG data URI (the HTML stays one self-contained file); closes it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def plots(data: dict[str, Any]) -> dict[str, str]:
    """{title: data URI} of the three plots."""
    plt = pyplot()
    entries = rows(data)
    names = [e["name"] for e in entries]
    sizes = data["batch_sizes"]
    out = {}
    # accuracy (or agreement) vs latency at the smallest batch size with numbers
    bs0 = str(sizes[0])
    use_metric = data["metric"].get("measured")
    y_label = metric_header(data) if use_metric else "top-1 agreement with the reference %"
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = []
    for e in entries:
        st = e["latency"].get(bs0, {})
        if use_metric:
            y = e.get("metric")
            y = None if y is None else (100 * y if data["metric"].get("unit") == "%" else y)
        else:
            y = 100.0 if e["role"] == "reference" else (e.get("agreement") or {}).get("top1_agreement")
            y = None if y is None else (y if e["role"] == "reference" else 100 * y)
        if "p50_ms" in st and y is not None:
            xs.append(st["p50_ms"])
            ax.scatter(
                st["p50_ms"],
                y,
                s=70,
                label=e["name"] + (" (best)" if e.get("best") else ""),
                marker="*" if e.get("best") else ("s" if e["role"] == "reference" else "o"),
            )
    if xs and max(xs) / max(min(xs), 1e-9) > 20:
        ax.set_xscale("log")
    ax.legend(fontsize=8)
    if not use_metric or data["metric"].get("unit") == "%":
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, min(hi, 100.5))
    ax.set_xlabel(f"p50 latency at batch {bs0} (ms)")
    ax.set_ylabel(y_label)
    ax.set_title("Accuracy vs latency")
    ax.grid(alpha=0.3)
    out["Accuracy vs latency"] = png_data_uri(fig)
    # size per artifact
    fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(entries) + 1.5))
    raw = [(e.get("size") or {}).get("bytes") or 0 for e in entries]
    gz = [(e.get("size") or {}).get("gzip_bytes") or 0 for e in entries]
    ys = range(len(entries))
    ax.barh([y + 0.2 for y in ys], [b / 1e6 for b in raw], height=0.4, label="on disk")
    ax.barh([y - 0.2 for y in ys], [b / 1e6 for b in gz], height=0.4, label="gzip")
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("MB")
    ax.set_title("Size per artifact")
    ax.legend()
    out["Size per artifact"] = png_data_uri(fig)
    # latency per batch size
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for e in entries:
        pts = [
            (bs, e["latency"][str(bs)]["p50_ms"]) for bs in sizes if "p50_ms" in e["latency"].get(str(bs), {})
        ]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=e["name"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("p50 latency per batch (ms)")
    ax.set_title("Latency per batch size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    out["Latency per batch size"] = png_data_uri(fig)
    return out


def _head(data: dict[str, Any]) -> list[str]:
    sizes = data["batch_sizes"]
    return (
        ["", "artifact", "runtime", "precision", metric_header(data), "drop", "top-1 agree", "cosine", "min cosine",
         "max abs diff", "size MB", "gzip MB"]
        + [f"p50 ms @{bs}" for bs in sizes]
        + [f"p90 / p99 ms @{bs}" for bs in sizes]
        + [f"samples/s @{bs}" for bs in sizes]
        + [f"speedup @{bs}" for bs in sizes]
        + ["peak MB", "gates"]
    )  # fmt: skip


def _cells(data: dict[str, Any], e: dict[str, Any]) -> list[Any]:
    """One row of the main table: the same columns as ``_head``."""
    sizes = data["batch_sizes"]
    agr = e.get("agreement") or {}
    size = e.get("size") or {}
    lat = {bs: e["latency"].get(str(bs), {}) for bs in sizes}
    tails = [
        f"{lat[bs]['p90_ms']:.3f} / {lat[bs]['p99_ms']:.3f}" if "p90_ms" in lat[bs] else "n/a" for bs in sizes
    ]
    thr = [f"{lat[bs]['throughput_per_s']:.0f}" if "throughput_per_s" in lat[bs] else "n/a" for bs in sizes]
    return (
        [
            ("★" if e.get("best") else ("ref" if e["role"] == "reference" else "")),
            e["name"],
            e["runtime"],
            e.get("precision", ""),
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
        + tails
        + thr
        + [fmt_speedup(e, bs) for bs in sizes]
        + [fmt_mem(e.get("peak_memory_mb")), gate_status(e)]
    )


def _table(data: dict[str, Any]) -> str:
    e_ = html.escape
    head = _head(data)
    left = {1, 2, 3, len(head) - 1}

    def tr(cells: list[Any], tag: str, cls: str = "") -> str:
        tds = "".join(
            f"<{tag} class='{'l' if i in left else ''}'>{e_(str(c))}</{tag}>" for i, c in enumerate(cells)
        )
        return f"<tr class='{cls}'>{tds}</tr>" if cls or tag == "td" else f"<tr>{tds}</tr>"

    trs = [tr(head, "th")]
    for e in rows(data):
        failed = gate_status(e).startswith("FAIL")
        trs.append(tr(_cells(data, e), "td", "best" if e.get("best") else ("fail" if failed else "")))
    return "<table>" + "".join(trs) + "</table>"


def _result_word(g: dict[str, Any]) -> str:
    return "pass" if g["passed"] else ("INCONCLUSIVE" if g.get("inconclusive") else "FAIL")


def _gates_table(data: dict[str, Any]) -> str:
    e_ = html.escape
    gate_rows = "".join(
        f"<tr><td class='l'>{e_(g['artifact'])}</td><td class='l'>{e_(g['gate'])}</td>"
        f"<td class='l {'pass' if g['passed'] else 'fail'}'>{_result_word(g)}</td>"
        f"<td class='l'>{e_(g['message'])}</td></tr>"
        for g in data["gate_results"]
    )
    head = "".join(f'<th class="l">{h}</th>' for h in ("artifact", "gate", "result", "detail"))
    return f"<table><tr>{head}</tr>{gate_rows}</table>" if gate_rows else "<p>No gates were set.</p>"


def render(data: dict[str, Any]) -> str:
    e_ = html.escape
    imgs = "".join(f"<img alt='{e_(t)}' title='{e_(t)}' src='{uri}'>" for t, uri in plots(data).items())
    verdict_cls = "pass" if data["passed"] else "fail"
    notes = "".join(f"<p class='dim'>note: {e_(n)}</p>" for n in data.get("notes", []))
    notes += "".join(f"<p class='fail'>{e_(n)}</p>" for n in noise_notes(data))
    baseline = (
        f"<p class='dim'>Baseline: {e_(data['baseline']['path'])} ({e_(str(data['baseline'].get('created')))})</p>"
        if data.get("baseline")
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ptopt validate — {e_(summary_line(data))}</title>
<style>{_CSS}</style></head><body>
<h1>ptopt validate: <span class="{verdict_cls}">{e_(summary_line(data))}</span></h1>
<p class="dim">Machine: {e_(machine_line(data))}<br>Versions: {e_(versions_line(data))}<br>
Data: {e_(data_line(data))}<br>Reference: {e_(data["reference"]["name"])} ({e_(data["reference"]["runtime"])});
created {e_(str(data.get("created")))}; {data.get("elapsed_s", 0):.1f} s</p>
{_table(data)}
<p>Accuracy drop, {e_(data["accuracy_drop"]["definition"])}</p>
<p class="dim">{e_(data["best_rule"])}. Latency: p50 per batch after warm-up, at least
{data["latency_options"]["min_iters"]} iterations and {data["latency_options"]["min_seconds"]:g} s per artifact and
batch size, in {data["latency_options"].get("rounds", 1)} interleaved rounds;
the same {data["threads"]} thread(s) for every runtime. Peak MB: the process's peak resident memory while the
artifact was loaded and run.</p>
{notes}{baseline}
<h2>Plots</h2><div>{imgs}</div>
<h2>Gates</h2>{_gates_table(data)}
</body></html>
"""


def write(data: dict[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(path, render(data))
