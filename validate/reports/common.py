"""Formatting shared by the reports: one spelling of every number."""

from __future__ import annotations

from typing import Any


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The reference first, then every artifact."""
    return [data["reference"]] + list(data["artifacts"])


def metric_header(data: dict[str, Any]) -> str:
    m = data["metric"]
    return f"{m['name']}" + (" %" if m.get("unit") == "%" else "")


def fmt_metric(data: dict[str, Any], value: Any) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.2f}" if data["metric"].get("unit") == "%" else f"{value:.4g}"


def fmt_drop(data: dict[str, Any], entry: dict[str, Any]) -> str:
    if entry.get("role") == "reference":
        return "ref"
    d = entry.get("accuracy_drop")
    if d is None:
        return "—"
    unit = data["accuracy_drop"]["unit"]
    return f"{d:+.2f}{'%' if unit == '%' else (' pts' if unit == 'pts' else '')}"


def fmt_frac(v: Any) -> str:
    return "—" if v is None else f"{100 * v:.2f}%"


def fmt_cos(v: Any) -> str:
    return "—" if v is None else f"{v:.6f}"


def fmt_diff(v: Any) -> str:
    return "—" if v is None else f"{v:.3g}"


def fmt_mb(nbytes: Any) -> str:
    return "—" if nbytes is None else f"{nbytes / 1e6:.3f}"


#: a latency whose timing rounds spread more than this (IQR of the round medians, % of their median) is
#: marked NOISY_MARK in the tables: speedups from it are not meaningful
NOISY_SPREAD_PCT = 25.0
NOISY_MARK = "~"


def is_noisy(stats: dict[str, Any] | None) -> bool:
    return bool(stats) and (stats.get("round_spread_pct") or 0.0) > NOISY_SPREAD_PCT


def fmt_ms(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "—"
    if "p50_ms" not in stats:
        return "n/a"
    return f"{stats['p50_ms']:.3f}" + (NOISY_MARK if is_noisy(stats) else "")


def noise_notes(data: dict[str, Any]) -> list[str]:
    """One line per noisy latency and per inconclusive gate, for every report's footer."""
    out = []
    for e in rows(data):
        for bs, st in e["latency"].items():
            if is_noisy(st):
                out.append(
                    f"{NOISY_MARK} noisy: {e['name']} at batch {bs}: the timing rounds spread "
                    f"{st['round_spread_pct']:.0f}% (IQR of the round medians): speedups at this batch "
                    "size are not meaningful"
                )
    for g in data["gate_results"]:
        if g.get("inconclusive"):
            out.append(f"INCONCLUSIVE {g['artifact']}: {g['gate']}: {g['message']}")
    return out


def fmt_speedup(entry: dict[str, Any], bs: Any) -> str:
    if entry.get("role") == "reference":
        return "1.00x"
    v = (entry.get("speedup") or {}).get(str(bs))
    return "—" if v is None else f"{v:.2f}x"


def fmt_mem(v: Any) -> str:
    return "—" if v is None else f"{v:.0f}"


def gate_status(entry: dict[str, Any]) -> str:
    if entry.get("role") == "reference":
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
    m = data["machine"]
    cpu = m["cpu"]
    isa = ", ".join(k for k, v in cpu.get("isa", {}).items() if v) or "none of the tracked"
    return (
        f"{cpu.get('model')} ({cpu.get('arch')}, {cpu.get('usable_cores')} usable of {cpu.get('logical_cores')} "
        f"cores; ISA: {isa}); {m.get('os')}; threads: {data['threads']}"
    )


def versions_line(data: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in data["machine"].get("versions", {}).items())


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
