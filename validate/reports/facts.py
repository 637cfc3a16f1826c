"""Validate's report dict (schema ``ptopt.validate/1``, docs/validate.md) read for its renderers: the
rows, the verdict, the data and machine lines, and each entry's cells spelled with the shared
vocabulary (``common``)."""

from __future__ import annotations

from typing import Any

from ptopt.validate.noise import latency_noisy
from ptopt.validate.reports import common


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The reference first, then every artifact."""
    return [data["reference"]] + list(data["artifacts"])


def is_reference(entry: dict[str, Any]) -> bool:
    return entry.get("role") == "reference"


def mark(entry: dict[str, Any]) -> str:
    """The first column: ★ the best, ``ref`` the reference."""
    return "★" if entry.get("best") else (common.REF if is_reference(entry) else "")


def metric_header(data: dict[str, Any]) -> str:
    m = data["metric"]
    return f"{m['name']}" + (" %" if m.get("unit") == "%" else "")


def metric_cell(data: dict[str, Any], value: Any) -> str:
    return common.fmt_metric(value, data["metric"].get("unit") == "%")


def drop_cell(data: dict[str, Any], entry: dict[str, Any]) -> str:
    unit = data["accuracy_drop"]["unit"]
    return common.fmt_drop(entry.get("accuracy_drop"), unit, reference=is_reference(entry))


def is_noisy(stats: dict[str, Any] | None) -> bool:
    """A latency entry whose rounds spread too much (the noise rule 1)."""
    return bool(stats) and latency_noisy(stats.get("round_spread_pct"))


def ms_cell(stats: dict[str, Any] | None) -> str:
    """An entry's p50 at one batch size: "n/a" where that batch size was skipped."""
    if not stats:
        return common.NONE
    if "p50_ms" not in stats:
        return "n/a"
    return common.fmt_ms(stats["p50_ms"], noisy=is_noisy(stats))


def speedup_cell(entry: dict[str, Any], bs: Any) -> str:
    v = (entry.get("speedup") or {}).get(str(bs))
    return common.fmt_speedup(v, reference=is_reference(entry))


def noise_notes(data: dict[str, Any]) -> list[str]:
    """One line per noisy latency and per inconclusive gate, for every report's footer."""
    out = []
    for e in rows(data):
        for bs, st in e["latency"].items():
            if is_noisy(st):
                out.append(common.spread_note(e["name"], bs, st["round_spread_pct"]))
    for g in data["gate_results"]:
        if g.get("inconclusive"):
            out.append(f"INCONCLUSIVE {g['artifact']}: {g['gate']}: {g['message']}")
    return out


def gate_status(entry: dict[str, Any]) -> str:
    if is_reference(entry):
        return ""
    gates = entry.get("gates") or []
    if not gates:
        return "no gates"
    failed = [g["gate"] for g in gates if not g["passed"] and not g.get("inconclusive")]
    undecided = [g["gate"] for g in gates if g.get("inconclusive")]
    if failed:
        return "FAIL: " + ", ".join(failed) + ("; ?: " + ", ".join(undecided) if undecided else "")
    return "PASS" if not undecided else "INCONCLUSIVE: " + ", ".join(undecided)


def machine_line(data: dict[str, Any]) -> str:
    return common.machine_line(data["machine"], data["threads"], data.get("device"))


def versions_line(data: dict[str, Any]) -> str:
    return common.versions_line(data["machine"])


def summary_line(data: dict[str, Any]) -> str:
    n_undecided = sum(1 for g in data["gate_results"] if g.get("inconclusive"))
    n_failed = sum(1 for g in data["gate_results"] if not g["passed"]) - n_undecided
    verdict = "PASSED" if data["passed"] else f"FAILED ({n_failed} gate(s))"
    if n_undecided:
        what = f"INCONCLUSIVE ({n_undecided} latency gate(s) within the timing noise)"
        verdict = what if not n_failed else f"{verdict}, {what}"
    best = f"; best: {data['best']}" if data.get("best") else ""
    return f"{verdict}{best}"


def data_line(data: dict[str, Any]) -> str:
    d = data["data"]
    ins = ", ".join(f"{k} {v}" for k, v in d.get("inputs", {}).items())
    return (
        f"{d['ref']}: {d['samples']} samples ({ins}), labels: {'yes' if d['labels'] else 'no'}; "
        f"batch sizes {', '.join(map(str, data['batch_sizes']))}"
    )
