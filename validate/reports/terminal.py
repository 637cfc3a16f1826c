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


#: the widest a table is printed: an 80-100 column terminal shows every table whole (issue 40)
WIDTH = 100
#: a column that wraps its text (gates, status) is given at least this many columns
WRAP_MIN = 16


def table_width() -> int:
    """The width to print at: the terminal's, at most :data:`WIDTH`; :data:`WIDTH` off a terminal."""
    from rich.console import Console

    console = Console()
    return min(console.width, WIDTH) if console.is_terminal else WIDTH


def fitted(
    title: str,
    head: Sequence[str],
    rows: Sequence[tuple[Sequence[str], str | None]],
    width: int,
    left: Collection[str] = (),
    wrap: Mapping[str, dict] | None = None,
    keys: int = 2,
) -> list[Any]:
    """``table(title, head, left, wrap)`` of ``rows`` (``(cells, style)``) within ``width`` columns
    (:func:`split`)."""
    t = table(title, head, left, wrap)
    for cells, style in rows:
        t.add_row(*cells, style=style)
    return split(t, width, keys)


def split(t: Any, width: int, keys: int = 1) -> list[Any]:
    """The rich table ``t`` within ``width`` columns: itself when it fits, else wrapped by column: tables
    one under the other, each repeating the first ``keys`` columns (the mark and the name, never
    split), then as many of the other columns, in order, as fit; a column that wraps its text (gates,
    status) takes the room left, at least :data:`WRAP_MIN`. The title goes on the first, the caption
    under the last."""
    import copy
    import dataclasses

    sizes = [_natural(c) for c in t.columns]
    # a wrapping column is never narrower than its longest word: a gate's name is never split
    least = [max(WRAP_MIN, _natural(c, words=True)) for c in t.columns]
    key_need = sum(sizes[:keys]) + 3 * keys + 1
    if key_need + sum(w + 3 for w in sizes[keys:]) <= width:
        return [t]
    parts: list[list[int]] = [[]]
    room = width - key_need
    for i in range(keys, len(sizes)):
        wraps = not t.columns[i].no_wrap
        need = (min(sizes[i], max(least[i], room - 3)) if wraps else sizes[i]) + 3
        if parts[-1] and need > room:
            parts.append([])
            room = width - key_need
        parts[-1].append(i)
        room -= need
    out = []
    for n, cols in enumerate(parts):
        free = width - key_need - sum(sizes[i] + 3 for i in cols if t.columns[i].no_wrap)
        part = copy.copy(t)
        part.columns, part.rows = [], list(t.rows)
        part.title = t.title if n == 0 else None
        part.caption = t.caption if n == len(parts) - 1 else None
        for i in [*range(keys), *cols]:
            col = dataclasses.replace(t.columns[i], _cells=list(t.columns[i]._cells))
            if not col.no_wrap:
                col.max_width = max(least[i], free - 3)
            part.columns.append(col)
        out.append(part)
    return out


def _natural(column: Any, words: bool = False) -> int:
    """The widest line of a column's header and cells, in terminal columns (markup not counted); with
    ``words``, the widest word of its cells (what wrapping cannot split)."""
    from rich.cells import cell_len
    from rich.text import Text

    def plain(x: Any) -> str:
        return Text.from_markup(x).plain if isinstance(x, str) else getattr(x, "plain", str(x))

    texts = [plain(column.header), *(plain(c) for c in column._cells)]
    if words:
        return max((cell_len(w) for text in texts[1:] for w in text.split()), default=0)
    return max(cell_len(line) for text in texts for line in (text.splitlines() or [""]))


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
    """Print to stdout, within the terminal's width (at most :data:`WIDTH`; :data:`WIDTH` in a CI log)."""
    from rich.console import Console

    width = table_width()
    Console(soft_wrap=False, width=width).print(render(data, width))


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


def render(data: dict[str, Any], width: int = WIDTH) -> Any:
    """A rich renderable (a Group of the header, the table and the footer) ``width`` columns wide: the
    table wrapped by column where it is wider (:func:`fitted`), the artifact names whole."""
    from rich.console import Group
    from rich.text import Text

    head = (
        ["", "artifact", "runtime", F.metric_header(data), "drop", "agree", "cos min", "max|Δ|", "MB"]
        + [f"p50 ms @{bs}" for bs in data["batch_sizes"]]
        + ["peak MB", "gates"]
    )
    if F.is_lm(data):
        head = ["", "artifact", "runtime", *F.LM_HEAD, "gates"]
    # the verdict on a line of its own (a table's title wraps at the table's width)
    title = Text(f"ptopt validate — {F.summary_line(data)}")
    t = fitted("", head, _rows(data), width, left={"", "artifact", "runtime"}, wrap={"gates": {}})
    lines = [
        ("machine", F.machine_line(data)),
        ("versions", F.versions_line(data)),
        ("data", F.data_line(data)),
    ]
    parts = [Text(head_lines(lines), style="dim"), title, *t, Text("\n".join(_foot(data)))]
    if F.has_isa(data):
        from rich.markup import escape

        isa = [([escape(c) for c in row], None) for row in F.isa_rows(data)]
        wrap = {"gates": {}}
        parts += fitted(
            "per CPU level (--isa)", F.isa_head(data), isa, width, {"artifact", "level", "kernels"}, wrap, 1
        )
        parts.append(Text("\n".join(F.isa_notes(data))))
    return Group(*parts)


def _rows(data: dict[str, Any]) -> list[tuple[list[str], str | None]]:
    """The table's cells (escaped) and style of each model, the reference first."""
    from rich.markup import escape

    out: list[tuple[list[str], str | None]] = []
    for e in F.rows(data):
        agr = e.get("agreement") or {}
        status = F.gate_status(e)
        style = "bold green" if e.get("best") else ("red" if status.startswith("FAIL") else None)
        style = "yellow" if status.startswith("INCONCLUSIVE") else style
        if F.is_lm(data):
            cells = [*F.lm_cells(e)]
        else:
            cells = [
                F.metric_cell(data, e.get("metric")),
                F.drop_cell(data, e),
                common.fmt_frac(agr.get("top1_agreement")),
                common.fmt_cos(agr.get("min_cosine")),
                common.fmt_diff(agr.get("max_abs_diff")),
                common.fmt_mb((e.get("size") or {}).get("bytes")),
                *_latency_cells(data, e),
                common.fmt_mem(e.get("peak_memory_mb")),
            ]
        row = [F.mark(e), e["name"], e["runtime"], *cells, status]
        out.append(([escape(c) for c in row], style))
    return out
