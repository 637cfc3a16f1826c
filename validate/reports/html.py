"""Self-contained HTML reports: the primitives both commands' pages are made of (the page shell and
its CSS, tables, footnotes, matplotlib on Agg and the embedded PNG), then validate's page: tables and
three plots (accuracy vs latency, size per artifact, latency per batch size) embedded as base64 PNG, so
the file opens in a browser offline and can be attached to a CI run as is."""

from __future__ import annotations

import base64
import html
import io
import os
import re
from collections.abc import Collection, Sequence
from typing import Any

from ptopt.core.atomic import write_text_atomic
from ptopt.core.errors import MissingDependencyError
from ptopt.validate.reports import common
from ptopt.validate.reports import facts as F

# -- primitives (optimize's report.html uses them too) ----------------------------------------------
#: the style of every report page: tr.best the winner, tr.fail a failed artifact, tr.out a candidate
#: not kept; .loud a verdict that must not be missed
CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}tr.best{background:#e8f7e8;font-weight:bold}tr.fail{background:#fdecec}
tr.out{color:#888}.pass{color:#1a7f37}.fail{color:#cf222e}.loud{color:#fff;background:#cf222e;padding:0.5em 1em}
.dim{color:#666;font-size:13px}img{max-width:100%;margin:0.5em 1em 0.5em 0}code{background:#f3f3f3;padding:1px 4px}"""


def page(title: str, body: str) -> str:
    """A whole self-contained page: ``title`` (plain text, escaped here) and ``body`` (HTML)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style></head><body>
{body}
</body></html>
"""


def table(
    head: Sequence[Any], rows: Sequence[Sequence[Any]], left: Collection[int], classes: Sequence[str]
) -> str:
    """A table of escaped text: columns in ``left`` left-aligned (numbers right), ``classes[i]`` the
    class of row ``i`` ("best", "fail", "out" or "")."""

    def tr(cells: Sequence[Any], tag: str, cls: str = "") -> str:
        tds = "".join(
            f"<{tag} class='{'l' if i in left else ''}'>{html.escape(str(c))}</{tag}>"
            for i, c in enumerate(cells)
        )
        return f"<tr class='{cls}'>{tds}</tr>" if tag == "td" else f"<tr>{tds}</tr>"

    return (
        "<table>"
        + tr(head, "th")
        + "".join(tr(r, "td", c) for r, c in zip(rows, classes, strict=True))
        + "</table>"
    )


def paragraphs(lines: Sequence[str], cls: str) -> str:
    """One ``<p class=cls>`` per line of plain text (footnotes: ``dim`` notes, ``fail`` noise)."""
    return "".join(f"<p class='{cls}'>{html.escape(x)}</p>" for x in lines)


def code_spans(text: str) -> str:
    """Markdown's `code` spans as HTML ``<code>`` (in text already escaped)."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", text)


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


def _size_plot(plt: Any, entries: list[dict[str, Any]]) -> str:
    """Bytes on disk and gzipped per artifact, as a data URI."""
    names = [e["name"] for e in entries]
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
    return png_data_uri(fig)


def lm_plots(data: dict[str, Any]) -> dict[str, str]:
    """A language-model run's plots: perplexity vs decode speed, and size per artifact."""
    plt = pyplot()
    entries = F.rows(data)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for e in entries:
        lm = e.get("lm") or {}
        if lm.get("decode_tokens_per_s") and lm.get("perplexity"):
            marker = "*" if e.get("best") else ("s" if F.is_reference(e) else "o")
            label = e["name"] + (" (best)" if e.get("best") else "")
            ax.scatter(lm["decode_tokens_per_s"], lm["perplexity"], s=70, marker=marker, label=label)
    ax.legend(fontsize=8)
    ax.set_xlabel("decode tokens/s (batch 1, KV cache)")
    ax.set_ylabel("perplexity (lower is better)")
    ax.set_title("Perplexity vs decode speed")
    ax.grid(alpha=0.3)
    return {"Perplexity vs decode speed": png_data_uri(fig), "Size per artifact": _size_plot(plt, entries)}


def plots(data: dict[str, Any]) -> dict[str, str]:
    """{title: data URI} of the three plots (a language-model run: ``lm_plots``)."""
    if F.is_lm(data):
        return lm_plots(data)
    plt = pyplot()
    entries = F.rows(data)
    sizes = data["batch_sizes"]
    out = {}
    # accuracy (or agreement) vs latency at the smallest batch size with numbers
    bs0 = str(sizes[0])
    use_metric = data["metric"].get("measured")
    y_label = F.metric_header(data) if use_metric else "top-1 agreement with the reference %"
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
    out["Size per artifact"] = _size_plot(plt, entries)
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
    if F.is_lm(data):
        return ["", "artifact", "runtime", *F.LM_HEAD, "gates"]
    sizes = data["batch_sizes"]
    return (
        ["", "artifact", "runtime", "precision", F.metric_header(data), "drop", "top-1 agree", "cosine",
         "min cosine", "max abs diff", "size MB", "gzip MB"]
        + [f"p50 ms @{bs}" for bs in sizes]
        + [f"p90 / p99 ms @{bs}" for bs in sizes]
        + [f"samples/s @{bs}" for bs in sizes]
        + [f"speedup @{bs}" for bs in sizes]
        + ["peak MB", "gates"]
    )  # fmt: skip


def _cells(data: dict[str, Any], e: dict[str, Any]) -> list[Any]:
    """One row of the main table: the same columns as ``_head``."""
    if F.is_lm(data):
        return [F.mark(e), e["name"], e["runtime"], *F.lm_cells(e), F.gate_status(e)]
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
            F.mark(e),
            e["name"],
            e["runtime"],
            e.get("precision", ""),
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
        + tails
        + thr
        + [F.speedup_cell(e, bs) for bs in sizes]
        + [common.fmt_mem(e.get("peak_memory_mb")), F.gate_status(e)]
    )


def _table(data: dict[str, Any]) -> str:
    head, entries = _head(data), F.rows(data)
    classes = [
        "best" if e.get("best") else ("fail" if F.gate_status(e).startswith("FAIL") else "") for e in entries
    ]
    return table(head, [_cells(data, e) for e in entries], {1, 2, 3, len(head) - 1}, classes)


def _isa_section(data: dict[str, Any]) -> str:
    """``--isa``: the per-level table and its notes (nothing without levels)."""
    if not F.has_isa(data):
        return ""
    rows = F.isa_rows(data)
    classes = ["fail" if r[-1].startswith("FAIL") else "" for r in rows]
    head = F.isa_head(data)
    return ("<h2>Per CPU level (--isa)</h2>" + table(head, rows, {0, 1, 2, len(head) - 1}, classes)
            + paragraphs(F.isa_notes(data), "dim"))  # fmt: skip


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


def _timing_text(data: dict[str, Any]) -> str:
    """How the speed was measured (plain text)."""
    peak = "Peak MB: the process's peak resident memory while the artifact was loaded and run."
    if F.is_lm(data):
        return f"{F.lm_line(data)}; {data['threads']} thread(s). {peak}"
    lat = data["latency_options"]
    return (
        f"Latency: p50 per batch after warm-up, at least {lat['min_iters']} iterations and "
        f"{lat['min_seconds']:g} s per artifact and batch size, in {lat.get('rounds', 1)} interleaved rounds; "
        f"the same {data['threads']} thread(s) for every runtime. {peak}"
    )


def render(data: dict[str, Any]) -> str:
    e_ = html.escape
    imgs = "".join(f"<img alt='{e_(t)}' title='{e_(t)}' src='{uri}'>" for t, uri in plots(data).items())
    verdict = F.summary_line(data)
    notes = paragraphs([f"note: {n}" for n in data.get("notes", [])], "dim") + paragraphs(
        F.noise_notes(data), "fail"
    )
    base = data.get("baseline")
    if base:
        notes += paragraphs([f"Baseline: {base['path']} ({base.get('created')})"], "dim")
    ref = data["reference"]
    return page(
        f"ptopt validate — {verdict}",
        f"""<h1>ptopt validate: <span class="{"pass" if data["passed"] else "fail"}">{e_(verdict)}</span></h1>
<p class="dim">Machine: {e_(F.machine_line(data))}<br>Versions: {e_(F.versions_line(data))}<br>
Data: {e_(F.data_line(data))}<br>Reference: {e_(ref["name"])} ({e_(ref["runtime"])});
created {e_(str(data.get("created")))}; {data.get("elapsed_s", 0):.1f} s</p>
{_table(data)}
<p>{e_(F.drop_line(data)[0].upper() + F.drop_line(data)[1:])}</p>
<p class="dim">{e_(data["best_rule"])}. {e_(_timing_text(data))}</p>
{notes}
{_isa_section(data)}
<h2>Plots</h2><div>{imgs}</div>
<h2>Gates</h2>{_gates_table(data)}""",
    )


def write(data: dict[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(path, render(data))
