"""Accuracy-aware quantization: the goal, what each candidate measured, and the result with its tables.

``ptopt.compress.quantize.autoquant`` runs the search; this module holds what it reports: ``AccuracyGoal``
(the budget and the tuning budget), ``Measurement`` and ``Candidate`` (one evaluated candidate),
``AutoQuantResult`` (every candidate, the sensitivity ranking, the rich tables and the sidecar
record) and the explanation printed when no candidate meets the goal.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ptopt.compress.quantize.config import SENSITIVITY_METHODS
from ptopt.core.config import Config, register_config
from ptopt.core.errors import GateFailedError, UsageError

DEFAULT_TRIALS = 24


@register_config
@dataclasses.dataclass(frozen=True)
class AccuracyGoal(Config):
    """What accuracy-aware quantization must keep, and how long it may search.

    ``max_accuracy_drop``: points of top-1 accuracy (needs labels); ``min_cosine``: minimum per-sample
    cosine similarity of the int8 outputs to the fp32 outputs. Both may be given (both must hold).
    ``trials`` / ``seconds``: tuning budget (candidates evaluated / wall time including sensitivity).
    """

    type_name = "accuracy-goal"
    max_accuracy_drop: float | None = None
    min_cosine: float | None = None
    trials: int | None = None
    seconds: float | None = None
    sensitivity: str = "alone"
    latency_batch_size: int = 32
    sensitivity_samples: int = 256

    def __post_init__(self) -> None:
        if self.max_accuracy_drop is not None and not self.max_accuracy_drop >= 0:
            raise UsageError(f"--max-accuracy-drop must be >= 0 points, got {self.max_accuracy_drop}")
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise UsageError(f"--min-cosine must be in [-1, 1], got {self.min_cosine}")
        if self.sensitivity not in SENSITIVITY_METHODS:
            raise UsageError(
                f"unknown sensitivity method {self.sensitivity!r} (known: {', '.join(SENSITIVITY_METHODS)})"
            )
        if self.trials is not None and self.trials < 1:
            raise UsageError(f"--tuning-budget must allow at least 1 trial, got {self.trials}")
        if self.seconds is not None and self.seconds <= 0:
            raise UsageError(f"--tuning-budget must be a positive time, got {self.seconds}s")
        if self.latency_batch_size < 1 or self.sensitivity_samples < 1:
            raise UsageError("latency_batch_size and sensitivity_samples must be >= 1")

    @property
    def has_target(self) -> bool:
        return self.max_accuracy_drop is not None or self.min_cosine is not None

    def describe(self) -> str:
        parts = []
        if self.max_accuracy_drop is not None:
            parts.append(f"accuracy drop <= {self.max_accuracy_drop} points")
        if self.min_cosine is not None:
            parts.append(f"min cosine >= {self.min_cosine}")
        return " and ".join(parts) or "no target"


def parse_tuning_budget(text: str | int | None) -> tuple[int | None, float | None]:
    """``"40"`` → 40 trials; ``"60s"`` / ``"2m"`` / ``"1h"`` → seconds. None → the default trials."""
    if text is None or text == "":
        return DEFAULT_TRIALS, None
    if isinstance(text, int):
        return text, None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", str(text).lower())
    if not m:
        raise UsageError(f"--tuning-budget {text!r}: give a number of trials (e.g. 30) or a time (90s, 5m)")
    value, unit = float(m.group(1)), m.group(2)
    if unit is None:
        if value != int(value):
            raise UsageError(f"--tuning-budget {text!r}: a number of trials is a whole number")
        return int(value), None
    return None, value * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}[unit]


# -- measurements --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Measurement:
    """int8 vs fp32 on the eval samples (see the module docstring for the definitions)."""

    samples: int
    min_cosine: float
    mean_cosine: float
    accuracy: float | None = None
    accuracy_drop: float | None = None
    #: the worst cosine projected to ``ptopt.core.tail.REFERENCE_SAMPLES`` samples: what ``min_cosine``
    #: goals are held to (None: a measurement without per-sample cosines, judged by its measured worst)
    projected_cosine: float | None = None

    @property
    def judged_cosine(self) -> float:
        return self.min_cosine if self.projected_cosine is None else self.projected_cosine

    def holds(self, goal: AccuracyGoal) -> bool:
        ok = True
        if goal.max_accuracy_drop is not None:
            ok &= self.accuracy_drop is not None and self.accuracy_drop <= goal.max_accuracy_drop + 1e-9
        if goal.min_cosine is not None:
            ok &= self.judged_cosine >= goal.min_cosine
        return ok

    def error(self, by_accuracy: bool) -> tuple[float, float]:
        """Sort key, smaller is better: accuracy drop (or 1 − the projected worst cosine), then 1 − mean
        cosine."""
        first = (
            self.accuracy_drop if by_accuracy and self.accuracy_drop is not None else 1.0 - self.judged_cosine
        )
        return (round(first, 9), round(1.0 - self.mean_cosine, 9))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Candidate:
    """One configuration tried by the search."""

    index: int
    per_channel: bool
    observer: str | None
    float_layers: tuple[str, ...]
    measurement: Measurement
    latency_ms: float
    holds: bool
    step: str
    seconds: float
    float_params: int = 0
    #: SmoothQuant alpha of the int8 Linears (dynamic mode), None: not smoothed
    smooth: float | None = None
    #: share of the tuned layers' multiply-accumulates that stays float (expected price in speed)
    float_macs: float = 0.0
    #: on the held-out samples, when it was chosen and judged there (``ptopt.core.search.accept``)
    heldout: Measurement | None = None
    #: it held on the search's samples but not on the held-out ones: no longer counted as holding
    heldout_failed: bool = False

    @property
    def scheme_key(self) -> tuple:
        return (self.per_channel, self.observer, self.smooth)

    @property
    def scheme(self) -> str:
        s = "per-channel" if self.per_channel else "per-tensor"
        s = f"{s}, {self.observer}" if self.observer else s
        return f"{s}, smoothed (alpha {self.smooth})" if self.smooth else s

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["float_layers"] = list(self.float_layers)
        d["scheme"] = self.scheme
        if self.heldout is None:  # judged on the search's samples only (the record as before)
            d.pop("heldout")
            d.pop("heldout_failed")
        return d


@dataclasses.dataclass
class AutoQuantResult:
    """What the search found. ``result`` is the chosen int8 model's :class:`~ptopt.core.result.Result`
    and ``artifact`` its saved Artifact: both None for ``analyze``; ``artifact`` None when no
    output was given (``result.save(path)`` writes it later)."""

    goal: AccuracyGoal
    mode: str
    fp32: dict[str, Any]
    sensitivity: list[dict[str, Any]]
    candidates: list[Candidate] = dataclasses.field(default_factory=list)
    chosen: int | None = None
    met: bool = False
    reason: str = ""
    breaking_layers: list[str] = dataclasses.field(default_factory=list)
    budget_exhausted: bool = False
    seconds: float = 0.0
    result: Any = None
    artifact: Any = None
    #: the chosen model on the held-out samples the search never saw (None: the data was not split)
    unseen: Measurement | None = None

    @property
    def best(self) -> Candidate | None:
        return None if self.chosen is None else self.candidates[self.chosen]

    def to_dict(self) -> dict[str, Any]:
        return {
            "goal": self.goal.to_dict(),
            "mode": self.mode,
            "met": self.met,
            "reason": self.reason,
            "unseen": None if self.unseen is None else self.unseen.to_dict(),
            "chosen": self.chosen,
            "breaking_layers": self.breaking_layers,
            "budget_exhausted": self.budget_exhausted,
            "seconds": round(self.seconds, 2),
            "trials": len(self.candidates),
            "fp32": self.fp32,
            "sensitivity": self.sensitivity,
            "candidates": [c.to_dict() for c in self.candidates],
            "definitions": {
                "accuracy_drop": "100 x (fp32 top-1 - int8 top-1), points",
                "cosine": "per-sample cosine of flattened int8 vs fp32 outputs; min and mean",
            },
        }

    def raise_if_missed(self) -> None:
        """GateFailedError (exit 1) when no candidate met the goal (the best one is already written
        when an output was given; ``err.result.result`` holds it in memory)."""
        if not self.met and self.goal.has_target and self.result is not None:
            err = GateFailedError(self.reason)
            err.result = self  # type: ignore[attr-defined]
            raise err

    # -- tables (rich) -----------------------------------------------------------------------------
    def sensitivity_table(self, limit: int | None = None):
        from rich.table import Table

        how = "quantized alone" if self.goal.sensitivity == "alone" else "left float, rest int8"
        t = Table(
            title=f"Layer sensitivity ({how}; most sensitive first)",
            caption="MACs: share of the tuned layers' multiply-accumulates; breaks: fails the goal alone",
        )
        labels = any(r.get("accuracy_drop") is not None for r in self.sensitivity)
        for col in ("#", "layer", "type", "MACs") + (("drop",) if labels else ()) + ("min cos", "mean cos"):
            t.add_column(
                col,
                justify="left" if col in ("layer", "type") else "right",
                no_wrap=True,  # a layer's name whole: ptopt.cli.options.echo_table wraps the table by column
            )
        if self.goal.has_target:
            t.add_column(
                "breaks" if self.goal.sensitivity == "alone" else "saves", justify="right", no_wrap=True
            )
        for i, r in enumerate(self.sensitivity[:limit]):
            row = [str(i + 1), r["layer"], r["type"], f"{100 * r.get('macs_share', 0):.1f}%"]
            if labels:
                row.append(_fmt(r.get("accuracy_drop"), "{:+.2f}"))
            row += [f"{r['min_cosine']:.5f}", f"{r['mean_cosine']:.5f}"]
            if self.goal.has_target:
                row.append(
                    ("yes" if r.get("breaks_budget") else "")
                    if self.goal.sensitivity == "alone"
                    else f"{r.get('saves', 0):.5f}"
                )
            t.add_row(*row)
        return t

    def candidates_table(self):
        from rich.table import Table

        t = Table(
            title=f"Candidates tried (goal: {self.goal.describe()})",
            caption="top k: the k most sensitive layers float (per MAC: sensitivity per multiply-"
            "accumulate); -L: L int8 again; pc/pt: per-channel/per-tensor weights; sqA: "
            "SmoothQuant alpha A; *: written; "
            f"ms: p50 at batch {self.fp32.get('latency_batch_size')}, relative to fp32 timed "
            "alongside, in fp32 ms",
        )
        labels = any(c.measurement.accuracy_drop is not None for c in self.candidates) and (
            self.goal.max_accuracy_drop is not None or not self.goal.has_target
        )
        cols = (
            ["#", "step", "scheme", "float layers", "fl. MACs"]
            + (["drop"] if labels else [])
            + ["min cos", "ms", "speedup", "holds"]
        )
        for col in cols:
            left = col in ("step", "scheme", "float layers")
            t.add_column(
                col,
                justify="left" if left else "right",
                no_wrap=col != "float layers",
                overflow="fold" if col == "float layers" else "ellipsis",
                min_width=12 if col == "float layers" else None,
            )
        fp32_ms = self.fp32.get("latency_ms")
        for c in self.candidates:
            mark = "yes" if c.holds else ("no (held out)" if c.heldout_failed else "no")
            if self.chosen == c.index:
                mark += " *"
            names = (
                ", ".join(c.float_layers)
                if len(c.float_layers) <= 2
                else f"{c.float_layers[0]} +{len(c.float_layers) - 1}"
            )
            scheme = (
                ("pc" if c.per_channel else "pt")
                + (f" {c.observer}" if c.observer else "")
                + (f" sq{c.smooth}" if c.smooth else "")
            )
            row = [str(c.index + 1), c.step, scheme, names or "-", f"{100 * c.float_macs:.1f}%"]
            if labels:
                row.append(_fmt(c.measurement.accuracy_drop, "{:+.2f}"))
            row += [
                f"{c.measurement.min_cosine:.5f}",
                f"{c.latency_ms:.2f}",
                f"{fp32_ms / c.latency_ms:.2f}x" if fp32_ms and c.latency_ms else "-",
                mark,
            ]
            t.add_row(*row)
        return t


def _fmt(v: Any, f: str) -> str:
    return "-" if v is None else f.format(v)


def _explain(result: AutoQuantResult, names: list[str]) -> str:
    best = result.best
    assert best is not None
    m = best.measurement
    got = ", ".join(
        x
        for x in (
            f"drop {m.accuracy_drop:.2f} points" if m.accuracy_drop is not None else "",
            f"min cosine {m.min_cosine:.5f}",
        )
        if x
    )
    if result.met:
        return (
            f"candidate {best.index + 1} ({best.scheme}, {len(best.float_layers)} float layer(s)) meets "
            f"{result.goal.describe()}: {got}"
        )
    breaking = [r["layer"] for r in result.sensitivity if r.get("breaks_budget")]
    result.breaking_layers = breaking
    msg = (
        f"no candidate meets {result.goal.describe()}; wrote the most accurate one found ({got}, "
        f"{len(best.float_layers)} float layer(s))"
    )
    if breaking:
        shown = ", ".join(_layer_error(r) for r in result.sensitivity if r["layer"] in breaking[:5])
        more = f" and {len(breaking) - 5} more" if len(breaking) > 5 else ""
        msg += f". Quantized alone, these layers already break the budget: {shown}{more}"
    else:
        top = ", ".join(_layer_error(r) for r in result.sensitivity[:3])
        msg += f". No single layer breaks it alone; together the int8 layers do (most sensitive: {top})"
    if result.budget_exhausted:
        g = result.goal
        msg += (
            f". The tuning budget ran out ({g.trials} trials)"
            if g.trials
            else f". The tuning budget ran out ({g.seconds:g}s)"
        )
        msg += "; a larger --tuning-budget may find one"
    return msg


def _layer_error(r: dict[str, Any]) -> str:
    if r.get("accuracy_drop") is not None:
        return f"{r['layer']} (drop {r['accuracy_drop']:.2f}, min cos {r['min_cosine']:.6f})"
    return f"{r['layer']} (min cos {r['min_cosine']:.6f})"
