"""The Pareto plot of ``report.html``: every candidate with numbers at the ranking batch size, latency
(log x) against what the budget is on (y), marker area by file size, colour by runtime, the Pareto front
of the kept ones joined, the budget line and the best circled (docs/optimize.md, "Reading the Pareto
plot"). Drawn with the report stack's matplotlib helpers and embedded as a PNG."""

from __future__ import annotations

import dataclasses
from typing import Any

from ptopt.validate.reports.html import png_data_uri, pyplot


@dataclasses.dataclass(frozen=True)
class PlotData:
    """What the plot shows, read off the report by ``optimize.report`` (this module reads no report):
    ``points`` (latency, y value, candidate) with both numbers, at ``batch_size``."""

    points: list[tuple[float, float, dict[str, Any]]]
    batch_size: Any
    y_label: str
    threshold: float | None = None
    budget_line: str = ""
    best: str | None = None
    has_winner: bool = False


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


def pareto_plot(data: PlotData) -> str | None:
    """The Pareto plot as a PNG data URI; None when no candidate has both a latency and a y value."""
    pts, rbs = data.points, data.batch_size
    if not pts:
        return None
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    _draw_points(ax, pts)
    if data.threshold is not None:
        ax.axhline(data.threshold, color="tab:red", lw=1, ls=":", label=f"budget ({data.budget_line})")
    best = next(((x, y, c) for x, y, c in pts if c.get("name") == data.best), None)
    if best is not None:
        ax.scatter([best[0]], [best[1]], s=900, facecolors="none", edgecolors="tab:red", lw=2, zorder=4)
        ax.annotate(
            ("best: " if data.has_winner else "best found (outside budget): ") + (best[2].get("name") or "?"),
            (best[0], best[1]), xytext=(14, -22), textcoords="offset points", fontsize=9, color="tab:red",
            fontweight="bold",
        )  # fmt: skip
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 13.8, not 1.38×10¹: the axis spans little
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel(f"median latency at batch {rbs} (ms, log scale)")
    ax.set_ylabel(data.y_label)
    ax.set_title("Latency vs accuracy (marker area ∝ file size)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    return png_data_uri(fig)
