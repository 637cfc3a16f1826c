"""The reports' vocabulary, one copy for ``ptopt validate`` and ``ptopt optimize``: one spelling of
every number, the machine and versions lines, and the timing-noise mark and footnotes. Values in,
strings out: each command reads its own report dict and spells what it finds with these, so a figure
reads the same in every report of both commands. (The format primitives are in ``markdown``,
``html`` and ``terminal``; the JSON writer is ``json_report``; the noise rule is ``ptopt.validate.noise``.)
"""

from __future__ import annotations

from typing import Any

from ptopt.validate.noise import NOISY_SPREAD_PCT as NOISY_SPREAD_PCT  # re-exported: the reports' threshold

#: a figure that was not measured (or cannot be: a failed build, a skipped batch size)
NONE = "—"
#: a figure relative to the reference (its drop, its speedup) in the reference's own row
REF = "ref"
#: after a latency or speedup within the timing noise (``ptopt.validate.noise``)
NOISY_MARK = "~"


def fmt_metric(value: float | None, percent: bool) -> str:
    """A task metric: a fraction as % with two decimals (the header says %), else four digits."""
    if value is None:
        return NONE
    return f"{100 * value:.2f}" if percent else f"{value:.4g}"


def fmt_drop(value: float | None, unit: str, reference: bool = False) -> str:
    """An accuracy drop with its unit: ``+0.33 pts`` (absolute, metric in %), ``+0.61%`` (relative),
    ``+0.0012`` (absolute, a metric without a unit)."""
    if reference:
        return REF
    if value is None:
        return NONE
    return f"{value:+.2f}{'%' if unit == '%' else (' pts' if unit == 'pts' else '')}"


def fmt_frac(v: float | None) -> str:
    """A fraction as a percentage (top-1 agreement)."""
    return NONE if v is None else f"{100 * v:.2f}%"


def fmt_cos(v: float | None) -> str:
    return NONE if v is None else f"{v:.6f}"


def fmt_diff(v: float | None) -> str:
    return NONE if v is None else f"{v:.3g}"


def fmt_mb(nbytes: int | None) -> str:
    """Bytes as MB (10^6), three decimals."""
    return NONE if nbytes is None else f"{nbytes / 1e6:.3f}"


def fmt_mem(mb: float | None) -> str:
    return NONE if mb is None else f"{mb:.0f}"


def fmt_ms(ms: float | None, noisy: bool = False) -> str:
    """A latency in ms, three decimals, marked when it is noisy."""
    return NONE if ms is None else f"{ms:.3f}" + (NOISY_MARK if noisy else "")


def fmt_speedup(v: float | None, noisy: bool = False, reference: bool = False) -> str:
    """A speedup over the reference (``2.64x``), marked when it is within the timing noise."""
    if reference:
        return REF
    return NONE if v is None else f"{v:.2f}x" + (NOISY_MARK if noisy else "")


def machine_line(machine: dict[str, Any], threads: Any, device: str | None = None) -> str:
    """The machine a report was measured on, from ``ptopt.core.system.machine_summary()``'s dict:
    CPU model (arch, cores; ISA flags); OS; threads; and the device when it is not the CPU. A part the
    dict lacks is left out."""
    cpu = machine.get("cpu") or {}
    isa = ", ".join(k for k, v in (cpu.get("isa") or {}).items() if v) or "none of the tracked"
    known = cpu.get("usable_cores") is not None and cpu.get("logical_cores") is not None
    cores = f"{cpu.get('usable_cores')} usable of {cpu.get('logical_cores')} cores" if known else None
    inside = ", ".join(str(x) for x in (cpu.get("arch"), cores) if x)
    parts = [f"{cpu.get('model') or '?'} ({inside + '; ' if inside else ''}ISA: {isa})", machine.get("os")]
    parts += [f"threads: {threads}", f"device: {device}" if device and device != "cpu" else None]
    return "; ".join(str(p) for p in parts if p)


def versions_line(machine: dict[str, Any]) -> str:
    """The library versions of ``machine_summary()`` (``python 3.11.7, ptopt 0.1.0, torch ...``)."""
    return ", ".join(f"{k} {v}" for k, v in (machine.get("versions") or {}).items())


_NOT_MEANINGFUL = "speedups at this batch size are not meaningful"


def spread_note(name: str, bs: Any, spread_pct: float) -> str:
    """The footnote of a noisy latency (the noise rule 1)."""
    return (
        f"{NOISY_MARK} noisy: {name} at batch {bs}: the timing rounds spread {spread_pct:.0f}% (IQR of "
        f"the round medians): {_NOT_MEANINGFUL}"
    )


def within_note(name: str, bs: Any, speedup: float | None, spread_pct: float | None) -> str:
    """The footnote of a speedup within the timing noise of 1.0 (the noise rule 2); ``spread_pct``:
    the combined spread of its and the reference's rounds."""
    sp = "its speedup" if speedup is None else f"its speedup {fmt_speedup(speedup)}"
    of = "" if spread_pct is None else f" ({spread_pct:.0f}%)"
    return (
        f"{NOISY_MARK} noisy: {name} at batch {bs}: {sp} is within the combined spread of its and the "
        f"reference's timing rounds{of}: {_NOT_MEANINGFUL}"
    )


def fmt_rate(per_s: float | None, noisy: bool = False) -> str:
    """Tokens (or samples) per second, one decimal, marked when it is noisy."""
    return NONE if per_s is None else f"{per_s:.1f}" + (NOISY_MARK if noisy else "")


def fmt_ppl(v: float | None) -> str:
    """A perplexity, three decimals."""
    return NONE if v is None else f"{v:.3f}"
