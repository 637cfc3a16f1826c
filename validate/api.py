"""``ptopt validate``: the same samples through the reference and every artifact, each in its own
runtime, on this machine; the task metric, agreement with the reference, size, latency per batch
size and peak memory side by side; gates that fail CI; reports for people and machines.

Order of work: everything a user can get wrong (options, data, metric, baseline, every artifact's
loadability, whether the data fits each artifact, gates on what will be measured) is checked first,
so a bad input exits 2 within seconds. Then each artifact is loaded, evaluated, sized and its peak
memory taken, one at a time; last, all of them are loaded together and timed in interleaved rounds
(``ptopt.validate.latency``), so memory during timing is the sum of the artifacts'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.data import Dataset, load_data
from ptopt.core.errors import (
    GateFailedError,
    MissingDependencyError,
    PtoptError,
    ShapeMismatchError,
    UsageError,
)
from ptopt.core.inputspec import check_inputs, flatten_inputs, format_shape
from ptopt.validate import gates as _gates
from ptopt.validate.latency import LatencyOptions, measure_runners
from ptopt.validate.metrics import PeakMemory, agreement, compute_metric, resolve_metric, size_info
from ptopt.validate.runners import Runner, display_name, open_runner

SCHEMA = "ptopt.validate/1"
DEFAULT_BATCH_SIZES = (1, 32)
DEFAULT_EVAL_BATCH_SIZE = 64
#: without an accuracy or agreement gate, an artifact losing more than this (in the drop's unit)
#: is not eligible as "best"
BEST_MAX_DROP = 1.0
BEST_RULE = (
    "best = the fastest artifact (p50 at the smallest batch size, then the next) among those that pass "
    f"every gate; without an accuracy or agreement gate, among those whose accuracy drop is at most "
    f"{BEST_MAX_DROP:g} (points, or % with --relative; without a metric: top-1 agreement at least 99%)"
)


@dataclasses.dataclass
class ValidationResult:
    """What ``validate`` measured: ``data`` is the JSON report (schema in docs/validate.md)."""

    data: dict[str, Any]
    report_paths: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.data["passed"])

    @property
    def entries(self) -> list[dict[str, Any]]:
        """One entry per artifact (the reference is ``.reference``)."""
        return self.data["artifacts"]

    @property
    def reference(self) -> dict[str, Any]:
        return self.data["reference"]

    @property
    def best(self) -> str | None:
        return self.data["best"]

    @property
    def failed_gates(self) -> list[dict[str, Any]]:
        return [g for g in self.data["gate_results"] if not g["passed"]]

    def entry(self, name: str) -> dict[str, Any]:
        for e in self.entries:
            if e["name"] == name:
                return e
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return self.data


def parse_batch_sizes(value: Any) -> list[int]:
    """``"1,32"``, ``32`` or ``(1, 32)`` → sorted unique positive ints."""
    items = str(value).split(",") if isinstance(value, (str, int)) else list(value)
    try:
        sizes = sorted({int(str(v).strip()) for v in items if str(v).strip()})
    except ValueError:
        raise UsageError(f"--batch-sizes {value!r}: write comma-separated integers, e.g. 1,32") from None
    if not sizes or sizes[0] < 1:
        raise UsageError(f"--batch-sizes {value!r}: batch sizes must be positive integers")
    return sizes


def validate(
    reference: Any,
    artifacts: Sequence[Any],
    data: Any,
    *,
    batch_sizes: Any = DEFAULT_BATCH_SIZES,
    threads: int | None = None,
    metric: Any = "top1",
    max_accuracy_drop: float | None = None,
    relative: bool = False,
    min_agreement: float | None = None,
    max_latency_ms: Any = (),
    min_speedup: float | None = None,
    max_size_mb: float | None = None,
    baseline: Any = None,
    max_regression: float | None = None,
    regression_on: Sequence[str] | str = _gates.DEFAULT_REGRESSION_ON,
    json_path: Any = None,
    junit_path: Any = None,
    markdown_path: Any = None,
    report_path: Any = None,
    weights: Any = None,
    allow_pickle: bool = False,
    providers: Sequence[str] | None = None,
    max_samples: int | None = None,
    eval_batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    latency: LatencyOptions | None = None,
    min_iters: int | None = None,
    min_seconds: float | None = None,
    rounds: int | None = None,
    raise_on_failure: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ValidationResult:
    """Validate ``artifacts`` against ``reference`` on ``data``; see the module docstring.

    ``reference``/``artifacts``: MODEL references, artifact paths, nn.Modules or LoadedModels
    (``weights``/``allow_pickle`` qualify the reference). ``data``: a DATA reference or a Dataset.
    Gates: see ``ptopt.validate.gates.Gates``. Reports are written to the ``*_path`` given, all of
    them before a failed gate is reported. Returns a ValidationResult (``.passed``); with
    ``raise_on_failure`` a failed gate raises GateFailedError (exit code 1) after the reports.
    """
    import torch

    t_start = time.perf_counter()
    say = progress or (lambda msg: None)
    # -- 1. options --------------------------------------------------------------------------------
    sizes = parse_batch_sizes(batch_sizes)
    if threads is None:
        from ptopt.core.system import cpu_info

        threads = int(cpu_info()["usable_cores"])
    if int(threads) < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    threads = int(threads)
    if eval_batch_size < 1:
        raise UsageError(f"--eval-batch-size must be >= 1, got {eval_batch_size}")
    lat_opts = latency or LatencyOptions()
    if min_iters is not None:
        lat_opts = dataclasses.replace(lat_opts, min_iters=int(min_iters))
    if min_seconds is not None:
        lat_opts = dataclasses.replace(lat_opts, min_seconds=float(min_seconds))
    if rounds is not None:
        lat_opts = dataclasses.replace(lat_opts, rounds=int(rounds))
    for opt, value, low in (
        ("--min-iters", lat_opts.min_iters, 1),
        ("--min-seconds", lat_opts.min_seconds, 0),
        ("--rounds", lat_opts.rounds, 1),
    ):
        if value < low:
            raise UsageError(f"{opt} must be >= {low}, got {value}")
    if isinstance(regression_on, str):
        regression_on = [k.strip() for k in regression_on.split(",") if k.strip()]
    if isinstance(max_latency_ms, (int, float, str)):
        max_latency_ms = [max_latency_ms]
    gate_cfg = _gates.Gates(
        max_accuracy_drop=max_accuracy_drop,
        relative=relative,
        min_agreement=min_agreement,
        max_latency_ms=_gates.parse_latency_limits(max_latency_ms or ()),
        min_speedup=min_speedup,
        max_size_mb=max_size_mb,
        max_regression=max_regression,
        regression_on=tuple(regression_on),
    )
    if isinstance(artifacts, (str, os.PathLike)) or isinstance(artifacts, torch.nn.Module):
        artifacts = [artifacts]
    artifacts = list(artifacts)
    for label, p in (
        ("json", json_path),
        ("junit", junit_path),
        ("markdown", markdown_path),
        ("report", report_path),
    ):
        if p is not None:
            _check_writable(label, Path(p))
    if report_path is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise MissingDependencyError(
                "--report draws its plots with matplotlib: pip install 'ptopt[report]'"
            )
    # -- 2. data, metric, baseline ---------------------------------------------------------------
    met = resolve_metric(metric)
    ds = load_data(data)
    if max_samples is not None:
        if max_samples < 1:
            raise UsageError(f"--max-samples must be >= 1, got {max_samples}")
        ds = ds.take(int(max_samples))
    ds.check_finite()
    data_name = str(data) if isinstance(data, (str, os.PathLike)) else ds.name
    metric_measured = ds.has_labels or not met.needs_labels
    base = _gates.load_baseline(baseline) if baseline is not None else None
    _gates.check_measurable(
        gate_cfg,
        metric_measured=metric_measured,
        metric_name=met.name,
        data_name=data_name,
        batch_sizes=sizes,
        baseline=base,
        classification=None,
    )
    # -- 3. every artifact loads and takes the data (one small batch each) ------------------------
    refs = [("reference", reference, weights)] + [("artifact", a, None) for a in artifacts]
    names = _unique_names([display_name(r) for _, r, _ in refs], [r for _, r, _ in refs])
    prev_threads = torch.get_num_threads()

    def open_prepared(ref: Any, name: str, w: Any) -> Runner:
        runner = open_runner(ref, name, weights=w, allow_pickle=allow_pickle, providers=providers)
        try:
            runner.prepare(threads)
        except BaseException:
            runner.close()
            raise
        return runner

    try:
        shapes = []
        for (role, ref, w), name in zip(refs, names, strict=False):
            say(f"checking {name}")
            runner = open_prepared(ref, name, w)
            try:
                out, labels = _probe(runner, ds, data_name)
                shapes.append(tuple(out.shape))
                if role == "reference" and metric_measured:
                    compute_metric(met, out, labels)  # a metric that can't work fails now, not after timing
            finally:
                runner.close()
        classification = len(shapes[0]) == 2 and shapes[0][1] >= 2
        _gates.check_measurable(
            gate_cfg,
            metric_measured=metric_measured,
            metric_name=met.name,
            data_name=data_name,
            batch_sizes=sizes,
            baseline=base,
            classification=classification,
        )
        # -- 4. load, evaluate, size and peak memory: one artifact at a time ------------------------
        entries: list[dict[str, Any]] = []
        ref_outputs = None
        for i, ((role, ref, w), name) in enumerate(zip(refs, names, strict=False)):
            say(f"evaluating {name} ({i + 1}/{len(refs)})")
            t0 = time.perf_counter()
            with PeakMemory() as mem:
                runner = open_prepared(ref, name, w)
                try:
                    eval_bs = _eval_batch_size(runner, eval_batch_size, len(ds))
                    with _failures_named(runner, data_name, f"the accuracy pass (batch size {eval_bs})"):
                        outputs = evaluate_outputs(runner, ds, eval_bs)
                    size = size_info(runner.files, getattr(runner, "module", None))
                finally:
                    runner.close()
            entry = _entry(runner, role, ref, eval_bs, size, mem)
            entry["elapsed_s"] = {"load_and_evaluate": round(time.perf_counter() - t0, 2)}
            if metric_measured:
                entry["metric"] = compute_metric(met, outputs, ds.y)
            if ref_outputs is None:
                ref_outputs = outputs
            else:
                entry["agreement"] = agreement(ref_outputs, outputs)
            entries.append(entry)
        # -- 5. latency: every artifact loaded, timed in interleaved rounds ----------------------------
        say(
            f"timing {len(refs)} models at batch sizes {', '.join(map(str, sizes))} "
            f"({lat_opts.rounds} interleaved rounds)"
        )
        t1 = time.perf_counter()
        runners = []
        try:
            for (_, ref, w), name in zip(refs, names, strict=False):
                runners.append(open_prepared(ref, name, w))
            lats = measure_runners(
                runners, ds, sizes, lat_opts, guard=lambda r: _failures_named(r, data_name, "timing")
            )
        finally:
            for r in runners:
                r.close()
        for entry, lat in zip(entries, lats, strict=False):
            entry["latency"] = {str(bs): st for bs, st in lat.items()}
            entry["elapsed_s"]["latency"] = round((time.perf_counter() - t1) / len(entries), 2)
    finally:
        torch.set_num_threads(prev_threads)
    # -- 6. compare, gate, pick the best ---------------------------------------------------------
    ref_entry, art_entries = entries[0], entries[1:]
    metric_info = met.describe()
    base_by_name = {e.get("name"): e for e in (base or {}).get("artifacts", [])}
    gate_results: list[_gates.GateResult] = []
    for e in art_entries:
        if e["metric"] is not None and ref_entry["metric"] is not None:
            e["accuracy_drop"] = _gates.accuracy_drop(
                ref_entry["metric"], e["metric"], met.higher_is_better, met.scale(), relative
            )
        e["speedup"] = {
            bs: ref_entry["latency"][bs]["p50_ms"] / st["p50_ms"]
            for bs, st in e["latency"].items()
            if "p50_ms" in st and "p50_ms" in ref_entry["latency"].get(bs, {})
        }
        results = _gates.evaluate(gate_cfg, e, ref_entry, metric_info, base_by_name.get(e["name"]))
        e["gates"] = [r.to_dict() for r in results]
        e["passed"] = all(r.passed for r in results)
        gate_results += results
    best = _pick_best(art_entries, gate_cfg, sizes)
    for e in art_entries:
        e["best"] = e["name"] == best
    notes = []
    if base is not None:
        from ptopt.core.system import cpu_info

        if base.get("machine", {}).get("cpu", {}).get("model") != cpu_info()["model"]:
            notes.append(
                "the baseline ran on a different CPU model: latency regressions compare different machines"
            )
        if (
            "speedup" in gate_cfg.regression_on
            and (base.get("reference") or {}).get("name") != ref_entry["name"]
        ):
            notes.append(
                f"the baseline's reference was {(base.get('reference') or {}).get('name')}, this run's "
                f"{ref_entry['name']}: speedup regressions compare gains over different references"
            )
        if base.get("threads") != threads:
            notes.append(f"the baseline ran with {base.get('threads')} threads, this run with {threads}")
        base_opts = base.get("latency_options") or {}
        if {k: base_opts.get(k) for k in ("min_seconds", "rounds")} != {
            "min_seconds": lat_opts.min_seconds,
            "rounds": lat_opts.rounds,
        }:
            notes.append(
                f"the baseline was timed differently (min_seconds {base_opts.get('min_seconds')}, rounds "
                f"{base_opts.get('rounds', 'none: one window per artifact')}), this run with min_seconds "
                f"{lat_opts.min_seconds:g} in {lat_opts.rounds} interleaved rounds"
            )
    from ptopt.core.system import machine_summary

    report = {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "passed": all(r.passed for r in gate_results),
        "best": best,
        "best_rule": BEST_RULE,
        "machine": machine_summary(),
        "threads": threads,
        "batch_sizes": sizes,
        "data": {
            "ref": data_name,
            "samples": len(ds),
            "labels": ds.has_labels,
            "inputs": {n: format_shape(t.shape[1:]) for n, t in flatten_inputs(ds.x)},
        },
        "metric": metric_info | {"measured": metric_measured},
        "accuracy_drop": {
            "relative": relative,
            "unit": "%" if relative else ("pts" if met.percent else ""),
            "definition": _gates.drop_definition(relative),
        },
        "gates": gate_cfg.to_dict(),
        "baseline": None
        if base is None
        else {
            "path": str(baseline),
            "created": base.get("created"),
            "cpu": base.get("machine", {}).get("cpu", {}).get("model"),
        },
        "latency_options": dataclasses.asdict(lat_opts),
        "reference": ref_entry,
        "artifacts": art_entries,
        "gate_results": [r.to_dict() for r in gate_results],
        "notes": notes,
        "elapsed_s": round(time.perf_counter() - t_start, 2),
    }
    result = ValidationResult(report)
    write_reports(
        result,
        json_path=json_path,
        junit_path=junit_path,
        markdown_path=markdown_path,
        report_path=report_path,
    )
    if raise_on_failure and not result.passed:
        raise GateFailedError(failure_message(result))
    return result


def failure_message(result: ValidationResult) -> str:
    failed = result.failed_gates
    return f"{len(failed)} gate(s) failed: " + "; ".join(
        f"{g['artifact']}: {g['gate']}: {g['message']}" for g in failed
    )


def write_reports(
    result: ValidationResult,
    *,
    json_path: Any = None,
    junit_path: Any = None,
    markdown_path: Any = None,
    report_path: Any = None,
) -> None:
    """Write every report asked for (each atomically); recorded in ``result.report_paths``."""
    from ptopt.validate.reports import html, json_report, junit, markdown

    for key, path, mod in (
        ("json", json_path, json_report),
        ("junit", junit_path, junit),
        ("markdown", markdown_path, markdown),
        ("html", report_path, html),
    ):
        if path is not None:
            mod.write(result.data, path)
            result.report_paths[key] = str(path)


# -- helpers ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _failures_named(runner: Runner, data_name: str, during: str) -> Iterator[None]:
    """A runtime failure after the probe (e.g. a batch size the artifact rejects) still exits 2 with
    the artifact's name, not with a traceback."""
    try:
        yield
    except PtoptError:
        raise
    except Exception as e:  # noqa: BLE001 - each runtime raises its own types
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ShapeMismatchError(
            f"{runner.name} ({runner.runtime}) failed on {data_name} during {during}: {reason}"
        ) from None


def _check_writable(label: str, path: Path) -> None:
    """A report path must be writable before the measurements start (it is only written at the end)."""
    if path.is_dir():
        raise UsageError(f"--{label} {path} is a folder; give a file path")
    parent = path.parent.resolve()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--{label} {path}: cannot write there ({parent} is not a writable folder)")


def _unique_names(names: list[str], refs: Sequence[Any] = ()) -> list[str]:
    """Names for the reports: file names, or the paths as given where file names collide
    (base/model.onnx vs build/model.onnx), then (2), (3)... for what still collides."""
    if refs:
        counts = {n: names.count(n) for n in names}
        names = [
            str(r) if counts[n] > 1 and isinstance(r, (str, os.PathLike)) else n
            for n, r in zip(names, refs, strict=False)
        ]
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} ({seen[n]})")
    return out


def _eval_batch_size(runner: Runner, wanted: int, n: int) -> int:
    bs = min(wanted, n)
    if runner.batch_range is not None:
        lo, hi = runner.batch_range
        bs = min(max(bs, lo), hi)
    return bs


def evaluate_outputs(runner: Runner, ds: Dataset, batch_size: int) -> Any:
    """The primary outputs of every sample, in order. A fixed-batch artifact gets its last batch
    padded with repeats of the last sample; the padding's outputs are dropped."""
    import torch

    lo = runner.batch_range[0] if runner.batch_range else 1
    outs = []
    n = len(ds)
    for start in range(0, n, batch_size):
        idx = torch.arange(start, min(start + batch_size, n))
        k = len(idx)
        if k < lo:
            idx = torch.cat([idx, idx[-1:].repeat(lo - k)])
        outs.append(runner.predict(ds.select(idx).x)[:k])
    return torch.cat(outs)


def _probe(runner: Runner, ds: Dataset, data_name: str) -> tuple[Any, Any]:
    """Run one small batch; data that doesn't fit becomes a ShapeMismatchError naming the artifact.
    Returns the batch's outputs and labels (None without labels)."""
    import torch

    bs = min(2, len(ds))
    if runner.batch_range is not None:
        bs = runner.batch_range[0]
    idx = torch.arange(bs) % len(ds)
    x = ds.select(idx).x
    labels = None if ds.y is None else ds.y[idx]
    got = ", ".join(
        f"{n}: {format_shape(t.shape)} {str(t.dtype).replace('torch.', '')}" for n, t in flatten_inputs(x)
    )
    expected = ", ".join(s.describe() for s in runner.input_specs) or None
    if runner.input_specs and runner.format != "eager":
        try:
            check_inputs(runner.input_specs, x, what="the data")
        except ShapeMismatchError as e:
            raise ShapeMismatchError(f"data {data_name} does not fit {runner.name}: {e}") from None
    try:
        out = runner.predict(x)
    except PtoptError:
        raise
    except Exception as e:  # noqa: BLE001 - each runtime raises its own types for a bad input
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ShapeMismatchError(
            f"data {data_name} does not fit {runner.name} ({runner.runtime}): {reason}",
            expected=expected,
            got=got,
        ) from None
    if out.dim() == 0 or out.shape[0] != bs:
        raise UsageError(
            f"{runner.name}: output of shape {tuple(out.shape)} for a batch of {bs}; "
            "validate needs one output row per sample"
        )
    return out, labels


def _entry(runner: Runner, role: str, ref: Any, eval_bs: int, size: dict, mem: PeakMemory) -> dict:
    art = None
    if runner.path is not None:
        from ptopt.core.artifact import Artifact

        try:
            art = Artifact.maybe_load(runner.path)
        except PtoptError:
            art = None
    return {
        "name": runner.name,
        "ref": runner.ref if not isinstance(ref, (str, os.PathLike)) else str(ref),
        "role": role,
        "format": runner.format,
        "runtime": runner.runtime,
        "precision": runner.precision,
        "parent": art.parent if art else None,
        "config": art.config if art else None,
        "batch_range": list(runner.batch_range) if runner.batch_range else None,
        "eval_batch_size": eval_bs,
        "metric": None,
        "accuracy_drop": None,
        "agreement": None,
        "size": size,
        "latency": {},  # filled by the interleaved timing
        "speedup": {},
        "peak_memory_mb": None if mem.peak_mb is None else round(mem.peak_mb, 1),
        "peak_memory_delta_mb": None if mem.delta_mb is None else round(mem.delta_mb, 1),
        "gates": [],
        "passed": True,
        "best": False,
        "info": {k: v for k, v in runner.info.items() if isinstance(v, (str, int, float, list))},
    }


def _pick_best(entries: list[dict], gates: _gates.Gates, sizes: list[int]) -> str | None:
    accuracy_gated = gates.max_accuracy_drop is not None or gates.min_agreement is not None
    eligible = []
    for e in entries:
        if not e["passed"]:
            continue
        if not accuracy_gated:
            if e["accuracy_drop"] is not None:
                if e["accuracy_drop"] > BEST_MAX_DROP:
                    continue
            else:
                agr = (e.get("agreement") or {}).get("top1_agreement")
                if agr is not None and agr < 0.99:
                    continue
        eligible.append(e)
    if not eligible:
        return None

    def key(e: dict) -> tuple:
        return tuple(e["latency"].get(str(bs), {}).get("p50_ms", float("inf")) for bs in sizes)

    return min(eligible, key=key)["name"]
