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


#: the first column of an artifact made from another model than the reference (``validate.lineage``)
OTHER_MODEL = "≠"


def mark(entry: dict[str, Any]) -> str:
    """The first column: ★ the best, ``ref`` the reference, ≠ made from another model."""
    if (entry.get("lineage") or {}).get("verdict") == "other":
        return OTHER_MODEL
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
    """One line per noisy latency (a language model's decode) and per inconclusive gate, for every
    report's footer."""
    out = []
    for e in rows(data):
        for bs, st in e["latency"].items():
            if is_noisy(st):
                out.append(common.spread_note(e["name"], bs, st["round_spread_pct"]))
        spread = (e.get("lm") or {}).get("decode_spread_pct")
        if latency_noisy(spread):
            out.append(common.spread_note(e["name"] + " (decode)", 1, spread))
    for g in data["gate_results"]:
        if g.get("inconclusive"):
            out.append(f"INCONCLUSIVE {g['artifact']}: {g['gate']}: {g['message']}")
    for e in rows(data):
        note = (e.get("agreement") or {}).get("note")
        if note and not is_reference(
            e
        ):  # its cells are blank: say why (a pruned base model's narrower output)
            out.append(f"not compared: {e['name']}: {note}")
    busy = data.get("timing_noise") or {}
    if busy.get("busy"):
        again = f", after timing {busy['retimed']} more time(s)" if busy.get("retimed") else ""
        out.append(
            f"{common.NOISY_MARK} busy machine: {busy['noisy_cells']} of {busy['cells']} timings are noisy{again}: "
            "the speedups are not a verdict; rerun on a quieter machine or with more --rounds/--min-seconds"
        )
    if data.get("best_verdict") == "noisy":
        out.append(
            f"{common.NOISY_MARK} no clear best: {data['best']} is fastest by the medians, but {data['best_why']}"
        )
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
    if data.get("best") and data.get("best_verdict") == "noisy":  # not crowned on noise (validate.noise)
        best = f"; no clear best (the timings are noisy; fastest by the medians: {data['best']})"
    return f"{verdict}{best}"


def data_line(data: dict[str, Any]) -> str:
    d = data["data"]
    if is_lm(data):
        return f"{d['ref']}: {d['samples']} tokens; {lm_line(data)}"
    ins = ", ".join(f"{k} {v}" for k, v in d.get("inputs", {}).items())
    return (
        f"{d['ref']}: {d['samples']} samples ({ins}), labels: {'yes' if d['labels'] else 'no'}; "
        f"batch sizes {', '.join(map(str, data['batch_sizes']))}"
    )


# -- causal language models (``task: causal-lm``; ``ptopt.validate.lm``) ------------------------------
#: the columns of a language model's row, between its runtime and its gates, in every table
LM_HEAD = ("precision", "perplexity", "ppl +%", "decode tok/s", "decode vs ref", "prefill tok/s",
           "weight MB", "disk MB", "peak MB")  # fmt: skip


def is_lm(data: dict[str, Any]) -> bool:
    return data.get("task") == "causal-lm"


def lm_cells(entry: dict[str, Any]) -> list[str]:
    """An entry's ``LM_HEAD`` cells."""
    lm, ref = entry.get("lm") or {}, is_reference(entry)
    noisy = latency_noisy(lm.get("decode_spread_pct"))
    return [
        entry.get("precision", ""),
        common.fmt_ppl(lm.get("perplexity")),
        common.fmt_drop(lm.get("perplexity_increase_pct"), "%", reference=ref),
        common.fmt_rate(lm.get("decode_tokens_per_s"), noisy),
        common.fmt_speedup(lm.get("decode_speedup"), noisy, reference=ref),
        common.fmt_rate(lm.get("prefill_tokens_per_s")),
        common.fmt_mb(lm.get("weight_bytes")),
        common.fmt_mb((entry.get("size") or {}).get("bytes")),
        common.fmt_mem(entry.get("peak_memory_mb")),
    ]


def lm_line(data: dict[str, Any]) -> str:
    """How perplexity was scored and generation timed."""
    s = data["lm"]
    return (
        f"perplexity: sliding window, context {s['context']}, stride {s['stride']}, {s['scored_tokens']} "
        f"tokens scored; speed: batch 1, KV cache, greedy, {s['prompt_tokens']}-token prompt, "
        f"{s['new_tokens']} new tokens, median of {s['rounds']} interleaved rounds"
    )


def drop_line(data: dict[str, Any]) -> str:
    """The definition of the drop in use (a language model's: its perplexity increase)."""
    definition = data["accuracy_drop"]["definition"]
    return definition if is_lm(data) else f"accuracy drop, {definition}"


# -- CPU levels (``validate --isa``; ``ptopt.validate.isa``) --------------------------------------------
def has_isa(data: dict[str, Any]) -> bool:
    return bool(data.get("isa"))


def isa_head(data: dict[str, Any]) -> list[str]:
    """The columns of the per-level table."""
    sizes = data["batch_sizes"]
    return (["artifact", "level", "kernels", metric_header(data), "drop", "agree", "cos min"]
            + [f"p50 ms @{bs}" for bs in sizes] + ["gates"])  # fmt: skip


def isa_rows(data: dict[str, Any]) -> list[list[str]]:
    """One row per (model, level): its figures there, emulated latencies marked ``emu``; a level the
    runtime ignores says so; one it cannot run at gives the reason in the gates column."""
    out = []
    for e in rows(data):
        for level, fig in (e.get("by_isa") or {}).items():
            cov = (fig.get("coverage") or {}).get("verdict", "")
            if fig.get("ignored"):
                out.append([e["name"], level, "ignores cap", *[common.NONE] * (4 + len(data["batch_sizes"])),
                            "not run (figures would be this CPU's)"])  # fmt: skip
                continue
            lat = [ms_cell(fig["latency"].get(str(bs))) for bs in data["batch_sizes"]]
            if fig.get("emulated"):
                lat = [c if c == common.NONE else f"{c} emu" for c in lat]
            gates = [
                g
                for g in e.get("gates") or []
                if (g.get("isa") or None) == (level if fig.get("emulated") else None)
            ]
            status = "" if is_reference(e) else _level_status(gates, fig)
            agreement = fig.get("agreement") or {}
            drop = common.fmt_drop(fig.get("accuracy_drop"), data["accuracy_drop"]["unit"], is_reference(e))
            out.append([e["name"], level, cov, metric_cell(data, fig.get("metric")), drop,
                        common.fmt_frac(agreement.get("top1_agreement")), common.fmt_cos(agreement.get("min_cosine")),
                        *lat, status])  # fmt: skip
    return out


def _level_status(gates: list[dict[str, Any]], fig: dict[str, Any]) -> str:
    if fig.get("error"):
        return f"FAIL: {fig['error']}"
    failed = [g["gate"] for g in gates if not g["passed"] and not g.get("inconclusive")]
    if failed:
        return "FAIL: " + ", ".join(failed)
    return "PASS" if gates else "no gates"


def isa_notes(data: dict[str, Any]) -> list[str]:
    """What the per-level table needs said: emulated latency, the native level, inherited caps, each
    runtime's coverage of each level (once), crashed children."""
    isa = data.get("isa") or {}
    out = [
        f"emu: emulated latency: this CPU ({isa.get('native_level')}) running the lower level's code, not a "
        "CPU at that level; accuracy at a level is that level's kernels' own"
    ]
    # caps inherited from the environment cap this process too: its top level then ran in a child
    # (``core.isa.is_native``), and the main table is not uncapped
    caps, native = isa.get("inherited_caps"), isa.get("native_level")
    own = [lv for lv in isa.get("levels") or [] if lv == "native" or (lv == native and not caps)]
    out.append(
        f"the main table: this CPU's own level ({native}), "
        + ("with the caps it inherited" if caps else "uncapped")
        + ", measured in this process"
        + (f" (the per-level rows at {', '.join(own)} are the same figures)" if own else "")
    )
    out += list(isa.get("notes") or [])
    if isa.get("inherited_caps"):
        caps = ", ".join(f"{k}={v}" for k, v in isa["inherited_caps"].items())
        out.append(f"this process inherited caps from its environment ({caps}): 'native' ran with them")
    seen = set()
    for e in rows(data):
        for fig in (e.get("by_isa") or {}).values():
            if fig.get("note") and fig["note"] not in seen and fig.get("emulated"):
                seen.add(fig["note"])
                out.append(fig["note"])
    for level, child in (isa.get("children") or {}).items():
        if child.get("crash"):
            out.append(f"level {level}: {child['crash']}; the models it had finished keep their figures")
    return out
