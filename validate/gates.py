"""Gates: the pass/fail rules a CI job sets on each artifact, checked against the reference run in
the same session (and, for regressions, against a stored run). Any failed gate makes ``ptopt
validate`` exit 1, after every report was written.

A gate that needs a measurement the run cannot make (an accuracy gate on unlabeled data, a latency
gate at a batch size not measured, a regression gate without a baseline) is a usage error, raised
before any measurement starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# EXIT_INCONCLUSIVE: the exit status of a run whose only undecided gates are latency gates within
# the timing noise (re-exported here for callers)
from ptopt.core.errors import EXIT_INCONCLUSIVE, PtoptError, UsageError
from ptopt.core.options import option
from ptopt.validate.noise import combined_spread, within_noise

#: where validate's gates on accuracy and latency apply: models on tensor data (a language model on text
#: has its own, ``LMGates``; ``max_size_mb`` is both's)
_MODEL = ("model",)


class GateInconclusiveError(PtoptError):
    """No gate failed, but a latency gate could not be decided: the machine's drift while timing
    (``round_spread_pct``) is larger than the margin to the gate's threshold (exit 4)."""

    exit_code = EXIT_INCONCLUSIVE


#: what ``--max-regression`` can compare against the baseline: ``latency`` (each p50, in ms), ``accuracy``
#: (the metric) and ``speedup`` (reference p50 / artifact p50, both from the same run): what an artifact
#: gains over its reference, e.g. a quantization that stopped paying off. A runner uniformly faster or
#: slower than the baseline's leaves it unchanged; a CPU with other int8 instructions does not, and it
#: does not see the reference itself getting slower. On one machine it is as noisy as the p50s it divides.
REGRESSION_KINDS = ("latency", "accuracy", "speedup")
#: the default check
DEFAULT_REGRESSION_ON = ("latency", "accuracy")


def accuracy_drop(
    base: float, new: float, higher_is_better: bool = True, scale: float = 100.0, relative: bool = False
) -> float:
    """How much worse an artifact's metric is than the reference's (positive = worse).

    absolute: drop = (base - new) in points, i.e. the difference of the metric in the unit it is shown in
    (top-1 0.981 -> 0.975 is a drop of 0.6 points).
    relative: drop = (base - new) / base, in percent of the reference's value (top-1 0.981 -> 0.975 is a drop of 0.61%).
    For a lower-is-better metric (mse, or a user metric with higher_is_better = False), base and new swap places.
    """
    diff = (base - new) if higher_is_better else (new - base)
    if relative:
        if base == 0:
            return 0.0 if diff == 0 else float("inf")
        return 100.0 * diff / abs(base)
    return diff * scale


def drop_definition(relative: bool) -> str:
    """The line of ``accuracy_drop``'s docstring that defines the drop in use (printed in every report)."""
    key = "relative:" if relative else "absolute:"
    for line in (accuracy_drop.__doc__ or "").splitlines():
        if line.strip().startswith(key):
            return line.strip()
    return key  # pragma: no cover


@dataclasses.dataclass(frozen=True)
class Gates:
    """The gates of one run; None / empty disables a gate. Its fields are ``ptopt validate``'s gate
    options (``max_latency_ms`` as ``["5"]`` or ``["1=2.5", "32=40"]``, ``regression_on`` as
    ``"latency,speedup"`` are read too)."""

    max_accuracy_drop: float | None = option(
        None,
        help="Fail when an artifact's metric drops more than PTS points below the reference's (with --relative: "
        "percent).",
        metavar="PTS",
        applies=_MODEL,
    )
    relative: bool = option(
        False, help="--max-accuracy-drop is relative: (base - new) / base, in percent.", applies=_MODEL
    )
    min_agreement: float | None = option(
        None,
        help="Fail below this top-1 agreement with the reference (fraction, 0.99 = 99%).",
        applies=_MODEL,
    )
    min_cosine: float | None = option(
        None,
        help="Fail when the worst sample's cosine similarity to the reference's output is below this (any "
        "outputs: embeddings and hidden states too).",
        applies=_MODEL,
    )
    #: ((batch_size or None for every batch size, milliseconds at p50), ...)
    max_latency_ms: tuple[tuple[int | None, float], ...] = option(
        (),
        help="Fail when p50 latency exceeds MS (at every batch size, or BATCH=MS for one); repeatable.",
        metavar="[BATCH=]MS",
        repeat=True,
        applies=_MODEL,
    )
    min_speedup: float | None = option(
        None, help="Fail when reference p50 / artifact p50 is below this, at any batch size.", applies=_MODEL
    )
    max_size_mb: float | None = option(
        None, help="Fail when an artifact's files exceed this many MB (10^6 bytes)."
    )
    #: largest accepted regression vs the baseline run, in percent: latency (new - old) / old,
    #: speedup (old - new) / old, accuracy as ``accuracy_drop(old, new, relative=True)``
    max_regression: float | None = option(
        None,
        help="With --baseline: fail when p50 latency grows, or the metric or speedup drops, by more than PCT "
        "percent.",
        metavar="PCT",
        applies=_MODEL,
    )
    regression_on: tuple[str, ...] = option(
        DEFAULT_REGRESSION_ON,
        help="What --max-regression compares, comma-separated: latency (p50 ms), accuracy (the metric), "
        "speedup (reference p50 / artifact p50 of the same run: what the artifact gains).",
        csv=True,
        applies=_MODEL,
    )
    #: fail an artifact whose sidecar chain says it was made from another model (``validate.lineage``)
    strict_lineage: bool = option(
        False,
        help="Fail an artifact whose sidecar says it was made from another model than REFERENCE (every "
        "report flags it either way).",
    )

    def __post_init__(self) -> None:
        limits = self.max_latency_ms
        object.__setattr__(
            self,
            "max_latency_ms",
            parse_latency_limits([limits] if isinstance(limits, (int, float, str)) else limits),
        )
        kinds = self.regression_on
        kinds = [k.strip() for k in kinds.split(",") if k.strip()] if isinstance(kinds, str) else kinds
        object.__setattr__(self, "regression_on", tuple(kinds))
        object.__setattr__(self, "relative", bool(self.relative))
        object.__setattr__(self, "strict_lineage", bool(self.strict_lineage))
        for name in ("max_accuracy_drop", "max_size_mb", "max_regression", "min_speedup"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {v}")
        if self.min_agreement is not None and not 0 <= self.min_agreement <= 1:
            raise UsageError(
                f"--min-agreement is a fraction in [0, 1] (0.99 = 99%), got {self.min_agreement}"
            )
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise UsageError(f"--min-cosine is a cosine similarity in [-1, 1], got {self.min_cosine}")
        for bs, ms in self.max_latency_ms:
            if ms <= 0 or (bs is not None and bs < 1):
                raise UsageError(
                    f"--max-latency-ms: bad value {bs}={ms}"
                    if bs
                    else f"--max-latency-ms must be > 0, got {ms}"
                )
        bad = [k for k in self.regression_on if k not in REGRESSION_KINDS]
        if bad or not self.regression_on:
            raise UsageError(
                f"--regression-on: {'unknown ' + ', '.join(bad) if bad else 'nothing given'} "
                f"(choose from {', '.join(REGRESSION_KINDS)})"
            )

    def active(self) -> list[str]:
        names = []
        for f in dataclasses.fields(self):
            if f.name in ("relative", "regression_on"):
                continue
            v = getattr(self, f.name)
            if v is not None and v != () and v is not False:
                names.append(f.name)
        return names

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["max_latency_ms"] = [{"batch_size": bs, "ms": ms} for bs, ms in self.max_latency_ms]
        d["regression_on"] = list(self.regression_on)
        return d


def parse_latency_limits(values: Sequence[Any]) -> tuple[tuple[int | None, float], ...]:
    """``["5"]`` (every batch size) or ``["1=2.5", "32=40"]`` (per batch size) → ((bs|None, ms), ...)."""
    out = []
    for v in values:
        if isinstance(v, (tuple, list)) and len(v) == 2:
            out.append((None if v[0] is None else int(v[0]), float(v[1])))
            continue
        text = str(v)
        bs, sep, ms = text.partition("=")
        try:
            out.append((int(bs), float(ms)) if sep else (None, float(text)))
        except ValueError:
            raise UsageError(
                f"--max-latency-ms {text!r}: write MS (every batch size) or BATCH=MS, e.g. 32=40"
            ) from None
    return tuple(out)


@dataclasses.dataclass
class GateResult:
    artifact: str
    gate: str
    threshold: float
    value: float | None
    passed: bool
    message: str
    #: a latency gate whose margin to its threshold is within the timing noise: neither passed nor
    #: failed (``passed`` is False, and the run is not FAILED because of it)
    inconclusive: bool = False
    #: the CPU level the gate was judged at (``validate --isa``; None: this CPU, natively)
    isa: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["isa"] is None:
            del d["isa"]
        return d

    @property
    def failed(self) -> bool:
        return not self.passed and not self.inconclusive


def spread_of(*stats: dict[str, Any] | None) -> float | None:
    """The combined round spread (%) of latency entries divided or compared (``noise.combined_spread``
    of their ``round_spread_pct``)."""
    return combined_spread(*(st.get("round_spread_pct") for st in stats if st))


def _timed(
    name: str, gate: str, threshold: float, value: float, ok: bool, message: str, spread: float | None
) -> GateResult:
    """A latency gate's result: inconclusive when ``value`` is within ``spread`` % of ``threshold``
    (``noise.within_noise``, the timing-noise rule 2)."""
    if within_noise(value, threshold, spread):
        return GateResult(
            name, gate, threshold, value, False,
            f"{message}: inconclusive, the timing rounds spread {spread:.0f}% (more than the margin)",
            inconclusive=True,
        )  # fmt: skip
    return GateResult(name, gate, threshold, value, ok, message)


def check_measurable(
    gates: Gates,
    *,
    metric_measured: bool,
    metric_name: str,
    data_name: str,
    batch_sizes: Sequence[int],
    baseline: dict | None,
    classification: bool | None,
    not_scores_why: str | None = None,
) -> None:
    """Raise UsageError for a gate on something this run will not measure (before measuring)."""
    if gates.max_accuracy_drop is not None and not metric_measured:
        raise UsageError(
            f"--max-accuracy-drop needs the metric {metric_name!r}, which needs labels, and "
            f"{data_name} has none; give labelled data or gate on --min-agreement instead"
        )
    for bs, _ in gates.max_latency_ms:
        if bs is not None and bs not in batch_sizes:
            raise UsageError(
                f"--max-latency-ms {bs}=...: batch size {bs} is not measured "
                f"(--batch-sizes {','.join(map(str, batch_sizes))})"
            )
    if gates.min_agreement is not None and classification is False:
        raise UsageError(
            "--min-agreement is top-1 agreement, which needs class scores: classification outputs "
            "[N, classes] or language-model logits [N, tokens, vocab]; the reference's are not: "
            f"{not_scores_why or 'another shape'}. Gate on --min-cosine instead"
        )
    if gates.max_regression is not None and baseline is not None:
        check_baseline(
            gates,
            baseline,
            metric_measured=metric_measured,
            metric_name=metric_name,
            data_name=data_name,
            batch_sizes=batch_sizes,
        )


def check_baseline(
    gates: Gates,
    baseline: dict,
    *,
    metric_measured: bool,
    metric_name: str,
    data_name: str,
    batch_sizes: Sequence[int],
) -> None:
    """Raise UsageError when a ``--regression-on`` kind has nothing to compare: a regression gate that
    compared nothing would pass silently."""
    kinds = gates.regression_on
    if "accuracy" in kinds:
        base_metric = baseline.get("metric") or {}
        if not metric_measured:
            raise UsageError(
                f"--regression-on accuracy needs the metric {metric_name!r}, which needs labels, and "
                f"{data_name} has none; give labelled data or --regression-on latency"
            )
        if base_metric.get("measured") is False or base_metric.get("name") is None:
            raise UsageError("--baseline has no metric (its data had no labels); use --regression-on latency")
        if base_metric["name"] != metric_name:
            raise UsageError(
                f"--baseline measured the metric {base_metric['name']!r}, this run {metric_name!r}; "
                "use the same --metric or --regression-on latency"
            )
    timed = {k for k in ("latency", "speedup") if k in kinds}
    if timed:
        base_sizes = set(baseline.get("batch_sizes") or [])
        missing = [bs for bs in batch_sizes if bs not in base_sizes]
        if missing:
            raise UsageError(
                f"--regression-on {','.join(sorted(timed))}: the baseline did not time batch size(s) "
                f"{','.join(map(str, missing))} (it timed {','.join(map(str, sorted(base_sizes))) or 'none'}); "
                "use the same --batch-sizes"
            )


def load_baseline(path: str | os.PathLike) -> dict[str, Any]:
    """A previous ``--json`` report; entries are matched to this run's artifacts by name."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--baseline {p}: no such file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"--baseline {p}: not a JSON file: {e}") from None
    if (
        not isinstance(data, dict)
        or not str(data.get("schema", "")).startswith("ptopt.validate/")
        or not isinstance(data.get("artifacts"), list)
    ):
        raise UsageError(f"--baseline {p}: not a `ptopt validate --json` report")
    return data


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def evaluate(
    gates: Gates,
    entry: dict[str, Any],
    reference: dict[str, Any],
    metric: dict[str, Any],
    baseline_entry: dict[str, Any] | None = None,
) -> list[GateResult]:
    """Every active gate on one artifact's entry (the JSON form; see docs/validate.md)."""
    out = _accuracy_gates(gates, entry, metric)
    out += _latency_gates(gates, entry, reference)
    if gates.max_size_mb is not None:
        size = (entry.get("size") or {}).get("bytes")
        mb = None if size is None else size / 1e6
        message = (
            f"size {_fmt(mb)} MB (max {_fmt(gates.max_size_mb)} MB)" if mb is not None else "size unknown"
        )
        ok = mb is not None and mb <= gates.max_size_mb
        out.append(GateResult(entry["name"], "max-size-mb", gates.max_size_mb, mb, ok, message))
    if gates.max_regression is not None:
        out += _regressions(gates, entry, metric, baseline_entry, reference)
    return out


def _places(limit: float, least: int, value: float | None = None) -> int:
    """Decimals that show a gate's ``limit`` as given (``--min-cosine 0.99999``: 5; it read "min
    1.0000"), at least ``least``, and more while the measured ``value`` beside it would read the same
    as a limit it differs from (a failed 0.999986 read "0.99999 (min 0.99999)")."""
    text = f"{limit:.12g}"
    p = max(least, len(text.split(".")[1]) if "." in text and "e" not in text else 0)
    while value is not None and value != limit and f"{value:.{p}f}" == f"{limit:.{p}f}" and p < 12:
        p += 1
    return p


def _accuracy_gates(gates: Gates, entry: dict[str, Any], metric: dict[str, Any]) -> list[GateResult]:
    name, out = entry["name"], []
    unit = "%" if gates.relative else (" pts" if metric.get("unit") == "%" else "")
    if gates.max_accuracy_drop is not None:
        drop, limit = entry.get("accuracy_drop"), gates.max_accuracy_drop
        ok = drop is not None and drop <= limit + 1e-9
        message = (
            f"{metric['name']} drop {_fmt(drop)}{unit} (max {_fmt(limit)}{unit})"
            if drop is not None
            else "metric not measured"
        )
        out.append(GateResult(name, "max-accuracy-drop", limit, drop, ok, message))
    if gates.min_agreement is not None:
        agr, limit = (entry.get("agreement") or {}).get("top1_agreement"), gates.min_agreement
        ok, p = (
            agr is not None and agr >= limit - 1e-12,
            _places(limit * 100, 2, None if agr is None else agr * 100),
        )
        message = (
            f"top-1 agreement {agr * 100:.{p}f}% (min {limit * 100:.{p}f}%)"
            if agr is not None
            else "top-1 agreement not measurable"
        )
        out.append(GateResult(name, "min-agreement", limit, agr, ok, message))
    if gates.min_cosine is not None:
        cos, limit = (entry.get("agreement") or {}).get("min_cosine"), gates.min_cosine
        ok, p = cos is not None and cos >= limit - 1e-12, _places(limit, 4, cos)
        message = (
            f"worst-sample cosine {cos:.{p}f} (min {limit:.{p}f})"
            if cos is not None
            else "cosine not measurable"
        )
        out.append(GateResult(name, "min-cosine", limit, cos, ok, message))
    return out


def _latency_gates(gates: Gates, entry: dict[str, Any], reference: dict[str, Any]) -> list[GateResult]:
    name, out = entry["name"], []
    lat = entry.get("latency") or {}
    ref_lat = reference.get("latency") or {}
    for bs_key, stats in lat.items():
        if "p50_ms" not in stats:
            continue
        bs, p50 = int(bs_key), stats["p50_ms"]
        for limit_bs, ms in gates.max_latency_ms:
            if limit_bs is None or limit_bs == bs:
                message = f"p50 {_fmt(p50)} ms at batch {bs} (max {_fmt(ms)} ms)"
                out.append(
                    _timed(name, f"max-latency-ms@bs{bs}", ms, p50, p50 <= ms, message, spread_of(stats))
                )
        if gates.min_speedup is not None and "p50_ms" in ref_lat.get(bs_key, {}):
            sp, limit = ref_lat[bs_key]["p50_ms"] / p50, gates.min_speedup
            message = f"speedup {sp:.{_places(limit, 2, sp)}f}x at batch {bs} (min {limit:.{_places(limit, 2, sp)}f}x)"
            spread = spread_of(stats, ref_lat[bs_key])
            out.append(_timed(name, f"min-speedup@bs{bs}", limit, sp, sp >= limit, message, spread))
    for limit_bs, ms in gates.max_latency_ms:
        if limit_bs is not None and "p50_ms" not in lat.get(str(limit_bs), {}):
            why = lat.get(str(limit_bs), {}).get("skipped", "not measured")
            out.append(
                GateResult(name, f"max-latency-ms@bs{limit_bs}", ms, None, False, f"batch {limit_bs}: {why}")
            )
    return out


def _regressions(
    gates: Gates,
    entry: dict[str, Any],
    metric: dict[str, Any],
    old: dict[str, Any] | None,
    reference: dict[str, Any] | None = None,
) -> list[GateResult]:
    """Regressions against the baseline's entry; latency and speedup ones within the timing noise
    (this run's round spreads, and the baseline's for latency) are inconclusive."""
    reference = reference or {}
    name, pct = entry["name"], gates.max_regression
    if old is None:
        return [
            GateResult(
                name, "max-regression", pct, None, True, "no entry of this name in the baseline: not compared"
            )
        ]
    out = []
    if "latency" in gates.regression_on:
        for bs_key, stats in (entry.get("latency") or {}).items():
            before = (old.get("latency") or {}).get(bs_key, {})
            if "p50_ms" in stats and "p50_ms" in before:
                reg = 100.0 * (stats["p50_ms"] - before["p50_ms"]) / before["p50_ms"]
                message = (
                    f"p50 {_fmt(before['p50_ms'])} -> {_fmt(stats['p50_ms'])} ms at batch {bs_key}: "
                    f"{reg:+.1f}% (max +{_fmt(pct)}%)"
                )
                limit_ms = before["p50_ms"] * (1 + pct / 100)
                result = _timed(
                    name, "", limit_ms, stats["p50_ms"], reg <= pct, message, spread_of(stats, before)
                )
                out.append(
                    dataclasses.replace(
                        result, gate=f"max-regression:latency@bs{bs_key}", threshold=pct, value=reg
                    )
                )
    if "speedup" in gates.regression_on:
        for bs_key, sp in (entry.get("speedup") or {}).items():
            before = (old.get("speedup") or {}).get(bs_key)
            if before:
                reg = 100.0 * (before - sp) / before
                message = (
                    f"speedup {before:.2f}x -> {sp:.2f}x at batch {bs_key}: {0.0 - reg:+.1f}% "
                    f"(max -{_fmt(pct)}%)"
                )
                lat = (entry.get("latency") or {}).get(bs_key)
                spread = spread_of(lat, (reference.get("latency") or {}).get(bs_key))
                result = _timed(name, "", before * (1 - pct / 100), sp, reg <= pct, message, spread)
                gate = f"max-regression:speedup@bs{bs_key}"
                out.append(dataclasses.replace(result, gate=gate, threshold=pct, value=reg))
    if (
        "accuracy" in gates.regression_on
        and entry.get("metric") is not None
        and old.get("metric") is not None
    ):
        reg = accuracy_drop(
            old["metric"], entry["metric"], metric.get("higher_is_better", True), relative=True
        )
        out.append(
            GateResult(
                name,
                "max-regression:accuracy",
                pct,
                reg,
                reg <= pct + 1e-9,
                f"{metric['name']} {_fmt(old['metric'])} -> {_fmt(entry['metric'])}: "
                f"{0.0 - reg:+.2f}% (max -{_fmt(pct)}%)",
            )
        )
    return out


# -- causal language models (``ptopt.validate.lm``) ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LMGates:
    """The gates of a language-model run (``--max-size-mb`` is ``Gates``' own, shared)."""

    max_perplexity_increase: float | None = option(
        None,
        help="Fail when an artifact's perplexity is more than PCT % above the reference's.",
        metavar="PCT",
        applies=("lm",),
    )
    min_tokens_per_s: float | None = option(
        None,
        help="Fail when an artifact decodes fewer than N tokens/s (batch 1, KV cache, median of the rounds).",
        metavar="N",
        applies=("lm",),
    )

    def __post_init__(self) -> None:
        if self.max_perplexity_increase is not None and self.max_perplexity_increase < 0:
            raise UsageError(
                f"--max-perplexity-increase is a percentage >= 0, got {self.max_perplexity_increase:g}"
            )
        if self.min_tokens_per_s is not None and self.min_tokens_per_s <= 0:
            raise UsageError(f"--min-tokens-per-s must be > 0, got {self.min_tokens_per_s:g}")


def perplexity_increase(base: float, new: float) -> float:
    """perplexity increase = (new - base) / base, in percent of the reference's perplexity (lower is
    better: 10.0 -> 10.3 is +3%)."""
    return 100.0 * (new - base) / base


def evaluate_lm(
    lm_gates: LMGates, gates: Gates, entry: dict[str, Any], reference: dict[str, Any]
) -> list[GateResult]:
    """Every active gate on one language model's entry: perplexity, decode tokens/s (inconclusive within
    the timing noise of its rounds, as the latency gates), and ``gates``' size gate."""
    name, lm, out = entry["name"], entry["lm"], []
    if lm_gates.max_perplexity_increase is not None:
        limit, inc = lm_gates.max_perplexity_increase, lm["perplexity_increase_pct"]
        message = (
            f"perplexity {_fmt(reference['lm']['perplexity'])} -> {_fmt(lm['perplexity'])}: "
            f"{inc:+.2f}% (max +{_fmt(limit)}%)"
        )
        out.append(GateResult(name, "max-perplexity-increase", limit, inc, inc <= limit + 1e-9, message))
    if lm_gates.min_tokens_per_s is not None:
        limit, tps = lm_gates.min_tokens_per_s, lm["decode_tokens_per_s"]
        message = f"decode {_fmt(tps)} tokens/s at batch 1 (min {_fmt(limit)})"
        out.append(
            _timed(name, "min-tokens-per-s", limit, tps, tps >= limit, message, lm.get("decode_spread_pct"))
        )
    return out + evaluate(Gates(max_size_mb=gates.max_size_mb), entry, reference, {})
