"""``ptopt validate``: the same samples through the reference and every artifact, each in its own
runtime, on this machine; the task metric, agreement with the reference, size, latency per batch
size and peak memory side by side; gates that fail CI; reports for people and machines.

Order of work: everything a user can get wrong (options, data, metric, baseline, every artifact's
loadability, whether the data fits each artifact, gates on what will be measured) is checked first,
so a bad input exits 2 within seconds. Then each artifact is loaded, evaluated, sized and its peak
memory taken, one at a time; last, all of them are loaded together and timed in interleaved rounds
(``ptopt.validate.latency``), so memory during timing is the sum of the artifacts'.

The steps, in order: ``_prepare`` (1-2: options, data, metric, baseline, report paths; a ``_Run``),
``_check_models`` (3: one small batch through each model), ``_evaluate`` (4: an ``Entry`` per model),
``_time`` (5), ``_compare`` and ``_report`` (6: gates, the best pick, the JSON report).

A causal language model REFERENCE with text data takes its own path, ``ptopt.validate.lm``
(perplexity and tokens/s instead of accuracy and latency per batch); the reports are the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ptopt.core import progress as _progress
from ptopt.core.data import Dataset, load_data
from ptopt.core.device import GpuPeakMemory
from ptopt.core.errors import (
    GateFailedError,
    PtoptError,
    ShapeMismatchError,
    UsageError,
)
from ptopt.core.inputspec import check_inputs, flatten_inputs, format_shape
from ptopt.core.scores import class_scores, labels_on_features
from ptopt.validate import gates as _gates
from ptopt.validate import lineage as _lineage
from ptopt.validate import lm as _lm
from ptopt.validate import noise as _noise
from ptopt.validate.entry import Entry
from ptopt.validate.latency import LatencyOptions, batch_inputs, measure_runners
from ptopt.validate.metrics import (
    Metric,
    PeakMemory,
    agreement,
    attention_mask_of,
    compute_metric,
    older_objects_frozen,
    resolve_metric,
    size_info,
)
from ptopt.validate.options import OPTIONS, Validation, parse_batch_sizes, resolve  # noqa: F401 - parse_batch_sizes re-exported
from ptopt.validate.runners import ArtifactRunError, Runner, display_name, open_runner

SCHEMA = "ptopt.validate/1"
DEFAULT_EVAL_BATCH_SIZE = 64
#: without an accuracy, agreement or cosine gate, an artifact losing more than this (in the drop's unit)
#: is not eligible as "best"
BEST_MAX_DROP = 1.0
#: ... and, without a metric, one whose top-1 agreement (features: worst-sample cosine) is below this
BEST_MIN_AGREEMENT = 0.99
BEST_RULE = (
    "best = the fastest artifact (p50 at the smallest batch size, then the next) among those that pass "
    f"every gate; without an accuracy, agreement or cosine gate, among those whose accuracy drop is at most "
    f"{BEST_MAX_DROP:g} (points, or % with --relative; without a metric: top-1 agreement at least "
    f"{BEST_MIN_AGREEMENT:.0%}, or for features, which have none, worst-sample cosine at least {BEST_MIN_AGREEMENT:g})"
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
        """Gates that failed (not those left inconclusive by the timing noise)."""
        return [g for g in self.data["gate_results"] if not g["passed"] and not g.get("inconclusive")]

    @property
    def inconclusive_gates(self) -> list[dict[str, Any]]:
        """Latency gates within the timing noise: neither passed nor failed."""
        return [g for g in self.data["gate_results"] if g.get("inconclusive")]

    def entry(self, name: str) -> dict[str, Any]:
        for e in self.entries:
            if e["name"] == name:
                return e
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return self.data


@dataclasses.dataclass
class _Run:
    """What one validation works with, every user input checked (steps 1-2 of the module docstring)."""

    models: _Models
    ds: Dataset
    data_name: str
    metric: Metric
    metric_measured: bool
    sizes: list[int]
    threads: int
    eval_batch_size: int
    gates: _gates.Gates
    latency: LatencyOptions
    baseline: dict[str, Any] | None
    baseline_path: Any
    #: --compile: also run each eager / ExportedProgram model through torch.compile (runners.compiled)
    compile: bool = False
    #: each model's runner format, in order (filled while the models are checked)
    formats: list[str] = dataclasses.field(default_factory=list)
    #: --isa: the CPU levels every model is judged at too (``ptopt.validate.isa``), and what they found
    isa: list[str] = dataclasses.field(default_factory=list)
    isa_section: dict[str, Any] | None = None
    #: the reference's outputs of the accuracy pass (kept for --isa: the children compare with them)
    ref_outputs: Any = None
    #: whether the reference's outputs are class scores (top-1 agreement is measured), and if not why
    class_scores: bool = True
    not_scores_why: str | None = None
    #: labels given, but the reference's outputs look like features (``core.scores.labels_on_features``)
    labels_note: str | None = None
    #: the timing's noise: noisy and timed cells, how often it was timed again (``_retime_while_busy``)
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)

    def check_measurable(self, classification: bool | None) -> None:
        _gates.check_measurable(
            self.gates,
            metric_measured=self.metric_measured,
            metric_name=self.metric.name,
            data_name=self.data_name,
            batch_sizes=self.sizes,
            baseline=self.baseline,
            classification=classification,
            not_scores_why=self.not_scores_why,
        )


@dataclasses.dataclass
class _Models:
    """The reference and the artifacts, by role, each opened on demand into a prepared runner."""

    refs: list[tuple[str, Any, Any]]  # (role, ref, weights)
    names: list[str]
    threads: int
    allow_pickle: bool
    providers: Sequence[str] | None
    #: ``cpu`` / ``cuda:N`` as given (checked), or None: each runtime's own (the CPU; TensorRT a GPU)
    device: str | None = None

    def __iter__(self) -> Iterator[tuple[str, Any, str]]:
        """(role, ref, name) of every model, the reference first."""
        return ((role, ref, name) for (role, ref, _), name in zip(self.refs, self.names, strict=True))

    def open(self, i: int) -> Runner:
        _, ref, weights = self.refs[i]
        runner = open_runner(
            ref, self.names[i], weights=weights, allow_pickle=self.allow_pickle, providers=self.providers
        )
        try:
            if self.device is not None:
                runner.place(self.device)  # the model moves once
            runner.prepare(self.threads)
        except BaseException:
            runner.close()
            raise
        return runner


@_progress.reported
@OPTIONS.twin
def validate(
    reference: Any,
    artifacts: Any,
    data: Any,
    *,
    gates: Any = None,
    latency: Any = None,
    weights: Any = None,
    allow_pickle: bool = False,
    raise_on_failure: bool = False,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> ValidationResult:
    """Validate ``artifacts`` against ``reference`` on ``data``; see the module docstring.

    ``reference``/``artifacts``: MODEL references, artifact paths, nn.Modules, LoadedModels or stage
    ``Result``s (the saved file, else the in-memory ``.model``); ``weights``/``allow_pickle`` qualify the
    reference. ``data``: a DATA reference, a Dataset or in-memory data (tensor, (x, y), {"x", "y"},
    torch Dataset/DataLoader, list of batches). ``options``: the fields of ``ptopt.validate.options``'
    configs (listed below); ``gates``/``latency``: a ``Gates`` / ``LatencyOptions`` (or a mapping of
    its fields) instead of their fields as options (not both). ``device``: ``cpu`` / ``cuda[:N]`` for
    every model (None: each runtime's own; see docs/gpu.md). Every report asked for is written before
    a failed gate is reported; returns a ValidationResult (``.passed``), or with ``raise_on_failure``
    raises GateFailedError (exit 1), or when no gate failed but a latency gate was within the timing
    noise, GateInconclusiveError (exit 4). ``compile``: also time every eager / ExportedProgram model
    (the reference too) through ``torch.compile``, as an extra row named ``NAME (torch.compile)`` with
    ``info["compile_seconds"]``. A causal language model REFERENCE with text ``data`` takes
    ``ptopt.validate.lm``'s path: perplexity (``context``, ``stride``), generation speed
    (``prompt_tokens``, ``new_tokens``, ``rounds``), gates ``max_perplexity_increase``,
    ``min_tokens_per_s`` and ``max_size_mb`` (docs/validate.md); the other options are refused there.
    """
    kind = "lm" if _lm.is_lm_model(reference) and _lm.is_lm_data(data) else "model"
    asked = resolve(kind, gates, latency, options)
    if kind == "lm":
        if weights is not None:
            raise UsageError(f"--weights does not apply to {_lm.KIND}")
        asked.reports.check()
        report = _lm.validate_lm(reference, artifacts, data, asked, allow_pickle, progress)
        return _finish(ValidationResult(report), asked, raise_on_failure)
    _lm.refuse_text_data(reference, data)
    t_start = time.perf_counter()
    models = dict(
        weights=weights, allow_pickle=bool(allow_pickle), providers=asked.settings.providers or None
    )
    run = _prepare(reference, artifacts, data, asked, models | {"device": asked.settings.device})
    entries = _measure(run, progress or (lambda msg: None))
    return _finish(ValidationResult(_report(run, entries, t_start)), asked, raise_on_failure)


def _finish(result: ValidationResult, asked: Validation, raise_on_failure: bool) -> ValidationResult:
    """Write every report asked for, then raise for a failed gate when asked to."""
    write_reports(result, **dataclasses.asdict(asked.reports))
    if raise_on_failure:
        raise_for_status(result)
    return result


def _measure(run: _Run, say: Callable[[str], None]) -> list[Entry]:
    """Steps 3-5: probe every model, evaluate each alone, time them all together."""
    import torch

    prev_threads = torch.get_num_threads()
    try:
        with older_objects_frozen():  # each model's gc.collect() scans only what was made since
            run.check_measurable(_check_models(run, say))
            if run.compile:
                _add_compiled(run, say)
            entries = _evaluate(run, say)
        _time(run, entries, say)
        if run.isa:
            from ptopt.validate.isa import measure_levels

            run.isa_section = measure_levels(run, entries, run.ref_outputs, run.isa, say)
    finally:
        torch.set_num_threads(prev_threads)
    return entries


# -- 1-2. options, data, metric, baseline: everything a user can get wrong, checked first ----------


def _prepare(reference: Any, artifacts: Any, data: Any, asked: Validation, models: dict[str, Any]) -> _Run:
    """Everything a user can get wrong, checked before anything runs."""
    settings = asked.settings
    sizes = list(settings.batch_sizes)
    threads, eval_batch_size = settings.threads, settings.eval_batch_size
    max_samples, baseline, compile = settings.max_samples, settings.baseline, settings.compile
    if eval_batch_size is None:  # one accuracy pass, in batches at least as large as the largest timed
        eval_batch_size = max(DEFAULT_EVAL_BATCH_SIZE, sizes[-1])
    if threads is None:
        from ptopt.core.system import cpu_info

        threads = int(cpu_info()["usable_cores"])
    if int(threads) < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    if eval_batch_size < 1:
        raise UsageError(f"--eval-batch-size must be >= 1, got {eval_batch_size}")
    if models.get("device") is not None:
        from ptopt.core.device import resolve_device

        models["device"] = str(resolve_device(models["device"], allow_auto=False))
    if compile:
        from ptopt.validate.runners.compiled import check_compiler

        check_compiler()
    refs = [("reference", _model_ref(reference), models.pop("weights"))]
    refs += [("artifact", _model_ref(a), None) for a in _as_list(artifacts)]
    asked.reports.check()
    met = resolve_metric(settings.metric)
    ds, data_name = _load_data(data, reference)
    _lm.check_generic_data(reference, ds, data_name)
    if max_samples is not None:
        if max_samples < 1:
            raise UsageError(f"--max-samples must be >= 1, got {max_samples}")
        ds = ds.take(int(max_samples))
    ds.check_finite()
    _check_batch_memory(sizes, ds)
    names = _unique_names([display_name(r) for _, r, _ in refs], [r for _, r, _ in refs])
    run = _Run(
        models=_Models(refs, names, int(threads), **models),
        ds=ds,
        data_name=data_name,
        metric=met,
        metric_measured=ds.has_labels or not met.needs_labels,
        sizes=sizes,
        threads=int(threads),
        eval_batch_size=eval_batch_size,
        gates=asked.gates,
        latency=asked.latency,
        baseline=_gates.load_baseline(baseline) if baseline is not None else None,
        baseline_path=baseline,
        compile=compile,
        isa=list(settings.isa),
    )
    run.check_measurable(None)
    return run


def _as_list(artifacts: Any) -> list[Any]:
    import torch

    from ptopt.core.result import Result

    if isinstance(artifacts, (str, os.PathLike, torch.nn.Module, Result)):
        return [artifacts]
    return list(artifacts)


def _model_ref(obj: Any) -> Any:
    """A stage's ``Result``: the file it saved, else its in-process model, named by what it is."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.result import Result

    if isinstance(obj, Artifact):
        return obj.path
    if not isinstance(obj, Result):
        return obj
    if obj.artifact is not None:
        return obj.artifact.path
    import torch

    from ptopt.core.modelref import LoadedModel

    t = obj.template
    if not isinstance(obj.model, torch.nn.Module):
        raise UsageError(
            f"an unsaved {t.format} result runs here only as its file: save it first (res.save(path)) "
            "and validate the file"
        )
    fmt = "torchscript" if isinstance(obj.model, torch.jit.ScriptModule) else "eager"
    name = obj.label
    info = {"precision": t.precision}
    return LoadedModel(name, fmt, obj.model, input_specs=list(t.inputs), input_style=t.input_style, info=info)


def _load_data(data: Any, reference: Any = None) -> tuple[Dataset, str]:
    """A DATA reference or in-memory data as a Dataset, and the name reports give it (a text file is one
    sentence per line for a Hugging Face encoder ``reference``: ``ptopt.core.sentences``)."""
    ds = load_data(data, model=reference if isinstance(reference, (str, os.PathLike)) else None)
    return ds, str(data) if isinstance(data, (str, os.PathLike)) else ds.name


# -- 3. every model loads and takes the data (one small batch each) --------------------------------


def _check_batch_memory(sizes: list[int], ds: Dataset) -> None:
    """Refuse batch sizes whose inputs alone would take more than half the memory available now
    (the outputs and the model's activations come on top)."""
    per_sample = sum(t[:1].numel() * t.element_size() for _, t in flatten_inputs(ds.first_batch(1).x))
    available = _available_memory_bytes()
    need = max(sizes) * per_sample
    if available and need > available // 2:
        raise UsageError(
            f"--batch-sizes {max(sizes)}: the inputs alone need {need / 2**30:.1f} GiB "
            f"({per_sample:,} bytes a sample), and {available / 2**30:.1f} GiB are available; "
            f"use at most {max(1, available // 2 // max(per_sample, 1)):,}"
        )


def _available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _check_models(run: _Run, say: Callable[[str], None]) -> bool:
    """Probe every model; returns whether the reference's outputs are class scores (``core.scores``)."""
    for i, (role, _, name) in enumerate(run.models):
        say(f"checking {name}")
        with _progress.step(f"loading {name}", announce=False):
            runner = run.models.open(i)
        if runner.info.get("device_note"):
            say(runner.info["device_note"])
        run.formats.append(runner.format)
        try:
            out, labels, x = _probe(runner, run.ds, run.data_name)
            if role == "reference":
                _check_reference(run, runner, out, labels, x)
        finally:
            runner.close()
    return run.class_scores


def _check_reference(run: _Run, runner: Runner, out: Any, labels: Any, x: Any) -> None:
    """The metric must work on the reference's outputs (it fails now, not after timing); whether
    those are class scores (``core.scores``) decides if top-1 agreement is measured."""
    if run.metric_measured:
        if run.metric.name in ("top1", "top5"):  # labels must index the classes: never 0% PASSED
            run.ds.check_labels(out, runner.name)
        compute_metric(run.metric, out, labels)
    layer = runner.score_layer(x)
    run.class_scores, run.not_scores_why = class_scores(
        out.shape, layer, labels=run.ds.has_labels, outputs=out
    )
    if run.ds.has_labels:  # measured as asked; said where the outputs look like features
        run.labels_note = labels_on_features(out.shape, layer, outputs=out)


def _add_compiled(run: _Run, say: Callable[[str], None]) -> None:
    """--compile: a ``NAME (torch.compile)`` artifact right after each eager / ExportedProgram model."""
    from ptopt.validate.runners.compiled import COMPILABLE_FORMATS, SUFFIX, CompiledRef

    refs, names = [], []
    for i, ((role, ref, weights), name) in enumerate(zip(run.models.refs, run.models.names, strict=True)):
        refs.append((role, ref, weights))
        names.append(name)
        if run.formats[i] in COMPILABLE_FORMATS:
            refs.append(("artifact", CompiledRef(ref), weights))
            names.append(name + SUFFIX)
    if len(refs) == len(run.models.refs):
        found = ", ".join(sorted(set(run.formats)))
        raise UsageError(
            f"--compile runs eager and ExportedProgram models through torch.compile; none here ({found})"
        )
    say(f"--compile: {', '.join(n for n in names if n.endswith(SUFFIX))} added")
    run.models.refs, run.models.names = refs, _unique_names(names)


# -- 4. load, evaluate, size and peak memory: one model at a time ----------------------------------


def _evaluate(run: _Run, say: Callable[[str], None]) -> list[Entry]:
    entries: list[Entry] = []
    ref_outputs = None
    for i, (role, ref, name) in enumerate(run.models):
        say(f"evaluating {name} ({i + 1}/{len(run.models.refs)})")
        t0 = time.perf_counter()
        step = _progress.step(f"evaluating {name}", announce=False)
        with step, PeakMemory() as mem, GpuPeakMemory(run.models.device or "cpu") as gpu_mem:
            runner = run.models.open(i)
            try:
                eval_bs = _eval_batch_size(runner, run.eval_batch_size, len(run.ds))
                during = f"the accuracy pass (batch size {eval_bs})"
                guard = functools.partial(_failures_named, runner, run.data_name, during)
                outputs = evaluate_outputs(runner, run.ds, eval_bs, guard=guard)
                size = size_info(runner.files, getattr(runner, "module", None))
            finally:
                runner.close()
        entry = _entry(runner, role, ref, eval_bs, size, mem)
        entry.peak_gpu_memory_mb = None if gpu_mem.peak_mb is None else round(gpu_mem.peak_mb, 1)
        entry.elapsed_s = {"load_and_evaluate": round(time.perf_counter() - t0, 2)}
        if run.metric_measured:
            entry.metric = compute_metric(run.metric, outputs, run.ds.y)
        if ref_outputs is None:
            ref_outputs = outputs
            if run.isa:
                run.ref_outputs = outputs
        else:
            mask = attention_mask_of(run.ds.x)
            entry.agreement = agreement(ref_outputs, outputs, class_scores=run.class_scores, mask=mask)
        entries.append(entry)
    return entries


# -- 5. latency: every model loaded, timed in interleaved rounds -----------------------------------


def _time(run: _Run, entries: list[Entry], say: Callable[[str], None]) -> None:
    say(
        f"timing {len(entries)} models at batch sizes {', '.join(map(str, run.sizes))} "
        f"({run.latency.rounds} interleaved rounds)"
    )
    t1 = time.perf_counter()
    runners: list[Runner] = []

    def guard(runner: Runner, bs: int) -> Any:
        return _failures_named(runner, run.data_name, "timing", lambda: batch_inputs(run.ds, bs))

    try:
        for i in range(len(entries)):
            runners.append(run.models.open(i))
        lats = measure_runners(runners, run.ds, run.sizes, run.latency, guard=guard)
        lats = _retime_while_busy(
            run, lambda: measure_runners(runners, run.ds, run.sizes, run.latency, guard=guard), lats, say
        )
    finally:
        for r in runners:
            r.close()
    early = []
    for entry, lat in zip(entries, lats, strict=True):
        entry.latency = {str(bs): st for bs, st in lat.items()}
        entry.elapsed_s["latency"] = round((time.perf_counter() - t1) / len(entries), 2)
        early += [
            f"{entry.name} @{bs} after {st['rounds']}"
            for bs, st in lat.items()
            if st.get("rounds", run.latency.rounds) < run.latency.rounds
        ]
    if early:
        say(f"stopped early, stable (median within {run.latency.stable_pct:g}%): {', '.join(early)} rounds")


def _retime_while_busy(run: _Run, measure: Callable[[], Any], lats: Any, say: Callable[[str], None]) -> Any:
    """When most cells are noisy, the machine is busy: time everything again (``noise.retime_while_busy``)
    and say so; ``run.timing`` records the verdict."""
    lats, run.timing = _noise.retime_while_busy(measure, _noise.noisy_cells, say, first=lats)
    if run.timing["busy"]:
        say(
            f"still busy after {run.timing['retimed']} more timing(s): {run.timing['noisy_cells']} of "
            f"{run.timing['cells']} timings noisy; no best is named on them"
        )
    return lats


# -- 6. compare, gate, pick the best; the report --------------------------------------------------


def _compare(run: _Run, entries: list[Entry]) -> tuple[list[_gates.GateResult], str | None]:
    ref, arts = entries[0], entries[1:]
    metric_info = run.metric.describe()
    base_by_name = {e.get("name"): e for e in (run.baseline or {}).get("artifacts", [])}
    results: list[_gates.GateResult] = []
    for e in arts:
        if e.metric is not None and ref.metric is not None:
            m = run.metric
            e.accuracy_drop = _gates.accuracy_drop(
                ref.metric, e.metric, m.higher_is_better, m.scale(), run.gates.relative
            )
        e.speedup = {
            bs: ref.latency[bs]["p50_ms"] / st["p50_ms"]
            for bs, st in e.latency.items()
            if "p50_ms" in st and "p50_ms" in ref.latency.get(bs, {})
        }
        mine = _gates.evaluate(run.gates, e.to_dict(), ref.to_dict(), metric_info, base_by_name.get(e.name))
        e.gates = [r.to_dict() for r in mine]
        e.passed = all(r.passed for r in mine)
        results += mine
    if run.isa:  # the same gates at every CPU level (ptopt.validate.isa)
        from ptopt.validate.isa import apply_metrics, level_gates

        apply_metrics(entries, run.metric, run.gates.relative)
        for e in arts:
            mine = level_gates(run.gates, e, ref, metric_info, base_by_name.get(e.name))
            e.gates += [r.to_dict() for r in mine]
            e.passed = e.passed and all(r.passed for r in mine)
            results += mine
    _, ref_model, weights = run.models.refs[0]
    results += _lineage.check_entries(entries, ref_model, weights, run.gates.strict_lineage)
    best = _crown(run, arts)
    return results, best


def _crown(run: _Run, arts: list[Entry]) -> str | None:
    """The fastest eligible artifact (``BEST_RULE``), or None; its entry is marked best (★) only when
    the timing can tell it from the next (``noise.clear_lead``); ``run.timing`` records the verdict."""
    ranked = _ranked(arts, run.gates, run.sizes, features=not run.class_scores)
    best = ranked[0].name if ranked else None
    why = None
    if ranked:
        bs = str(run.sizes[0])
        second = ranked[1].latency.get(bs) if len(ranked) > 1 else None
        why = _noise.clear_lead(ranked[0].latency.get(bs), second)
    run.timing["best_verdict"] = None if best is None else ("noisy" if why else "clear")
    run.timing["best_why"] = why
    for e in arts:
        e.best = e.name == best and why is None
    return best


def _baseline_notes(run: _Run, reference_name: str) -> list[str]:
    """Where a comparison with the baseline compares unlike things."""
    from ptopt.core.system import cpu_info

    base, lat, notes = run.baseline, run.latency, []
    if base is None:
        return notes
    if base.get("machine", {}).get("cpu", {}).get("model") != cpu_info()["model"]:
        notes.append(
            "the baseline ran on a different CPU model: latency regressions compare different machines"
        )
    base_ref = (base.get("reference") or {}).get("name")
    if "speedup" in run.gates.regression_on and base_ref != reference_name:
        notes.append(
            f"the baseline's reference was {base_ref}, this run's {reference_name}: speedup regressions "
            "compare gains over different references"
        )
    if base.get("threads") != run.threads:
        notes.append(f"the baseline ran with {base.get('threads')} threads, this run with {run.threads}")
    base_opts = base.get("latency_options") or {}
    if {k: base_opts.get(k) for k in ("min_seconds", "rounds")} != {
        "min_seconds": lat.min_seconds,
        "rounds": lat.rounds,
    }:
        notes.append(
            f"the baseline was timed differently (min_seconds {base_opts.get('min_seconds')}, rounds "
            f"{base_opts.get('rounds', 'none: one window per artifact')}), this run with min_seconds "
            f"{lat.min_seconds:g} in {lat.rounds} interleaved rounds"
        )
    return notes


def _cpu_notes(run: _Run, entries: list[Entry]) -> list[str]:
    """An artifact checked on a CPU whose int8-relevant flags differ from this one's: the difference, and
    the command that re-checks it at this CPU's level."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.isa import check_moved

    out = []
    for e in entries:
        if e.info.get("cpu_note") and isinstance(e.ref, str) and os.path.exists(e.ref):
            command = f"ptopt validate {entries[0].ref} {e.ref} --data {run.data_name} --isa {{level}}"
            line = check_moved(e.ref, Artifact.maybe_load(e.ref), command)
            out += [line] if line else []
    return out


def _report(run: _Run, entries: list[Entry], t_start: float) -> dict[str, Any]:
    """The JSON report (schema ``SCHEMA``, documented in docs/validate.md)."""
    from ptopt.core.system import machine_summary

    gate_results, best = _compare(run, entries)
    base, relative = run.baseline, run.gates.relative
    return {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "passed": all(r.passed for r in gate_results),
        "inconclusive": sum(1 for r in gate_results if r.inconclusive),
        "best": best,
        "best_rule": BEST_RULE,
        # "clear", or "noisy": the timing cannot tell the best from the next (no ★; best_why says why)
        "best_verdict": run.timing.get("best_verdict"),
        "best_why": run.timing.get("best_why"),
        "timing_noise": {k: run.timing.get(k) for k in ("noisy_cells", "cells", "retimed", "busy")},
        "machine": machine_summary(),
        "threads": run.threads,
        "device": run.models.device or "cpu",
        "batch_sizes": run.sizes,
        "data": {
            "ref": run.data_name,
            "samples": len(run.ds),
            "labels": run.ds.has_labels,
            "inputs": {n: format_shape(t.shape[1:]) for n, t in flatten_inputs(run.ds.x)},
        },
        "metric": run.metric.describe() | {"measured": run.metric_measured},
        "accuracy_drop": {
            "relative": relative,
            "unit": "%" if relative else ("pts" if run.metric.percent else ""),
            "definition": _gates.drop_definition(relative),
        },
        "gates": run.gates.to_dict(),
        "baseline": None
        if base is None
        else {
            "path": str(run.baseline_path),
            "created": base.get("created"),
            "cpu": base.get("machine", {}).get("cpu", {}).get("model"),
        },
        "latency_options": dataclasses.asdict(run.latency),
        "reference": entries[0].to_dict(),
        "artifacts": [e.to_dict() for e in entries[1:]],
        "gate_results": [r.to_dict() for r in gate_results],
        "notes": _baseline_notes(run, entries[0].name)
        + _cpu_notes(run, entries)
        + _lineage.notes(entries, run.gates.strict_lineage)
        + _scores_notes(run),
        **({"isa": run.isa_section} if run.isa_section is not None else {}),
        "elapsed_s": round(time.perf_counter() - t_start, 2),
    }


def _scores_notes(run: _Run) -> list[str]:
    if run.labels_note:
        return [run.labels_note]
    if not run.not_scores_why:
        return []
    return [
        f"top-1 agreement not measured, since the reference's outputs are not class scores: {run.not_scores_why}. "
        "The worst-sample cosine is the figure that means something (gate: --min-cosine)."
    ]


def failure_message(result: ValidationResult) -> str:
    failed = result.failed_gates
    if not failed:
        undecided = result.inconclusive_gates
        return (
            f"{len(undecided)} latency gate(s) inconclusive (the timing noise exceeds the margin; re-run on "
            "a quieter machine or with more --rounds/--min-seconds): "
            + "; ".join(f"{g['artifact']}: {g['gate']}" for g in undecided)
        )
    return f"{len(failed)} gate(s) failed: " + "; ".join(
        f"{g['artifact']}: {g['gate']}: {g['message']}" for g in failed
    )


def raise_for_status(result: ValidationResult) -> None:
    """GateFailedError (exit 1) when a gate failed; else GateInconclusiveError (exit 4) when a latency
    gate was within the timing noise; else nothing."""
    if result.failed_gates:
        raise GateFailedError(failure_message(result))
    if result.inconclusive_gates:
        raise _gates.GateInconclusiveError(failure_message(result))


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
def _failures_named(runner: Runner, data_name: str, during: str, inputs: Callable[[], Any]) -> Iterator[None]:
    """A runtime failure after the probe still exits 2 with the artifact's name, not a traceback.
    ``inputs()`` gives the batch that was running: when its samples run in smaller batches, the
    artifact does not take this batch size (ShapeMismatchError); when they fail there too, the
    artifact fails on this data (ArtifactRunError)."""
    try:
        yield
    except PtoptError:
        raise
    except Exception as e:  # noqa: BLE001 - each runtime raises its own types
        what = f"{runner.name} ({runner.runtime}) failed on {data_name} during {during}: {_first_line(e)}"
        smaller = _runs_in_smaller_batches(runner, inputs())
        if smaller:
            raise ShapeMismatchError(
                f"{what}; the same samples run in batches of {smaller}, so it does not take this batch size"
            ) from None
        raise ArtifactRunError(what) from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def _runs_in_smaller_batches(runner: Runner, x: Any) -> int | None:
    """The smallest batch size ``runner`` takes, when every sample of ``x`` runs in batches of it."""
    import torch

    samples = Dataset(x)
    small = runner.batch_range[0] if runner.batch_range else 1
    if len(samples) <= small:
        return None
    try:
        for start in range(0, len(samples) - small + 1, small):
            runner.predict(samples.select(torch.arange(start, start + small)).x)
    except Exception:  # noqa: BLE001 - any failure: not a batch-size problem
        return None
    return small


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


def evaluate_outputs(
    runner: Runner, ds: Dataset, batch_size: int, guard: Callable[[Callable[[], Any]], Any] | None = None
) -> Any:
    """The primary outputs of every sample, in order. A fixed-batch artifact gets its last batch
    padded with repeats of the last sample; the padding's outputs are dropped. ``guard(inputs)`` wraps
    each batch (``inputs()`` gives it)."""
    import torch

    lo = runner.batch_range[0] if runner.batch_range else 1
    outs = []
    n = len(ds)
    for start in range(0, n, batch_size):
        idx = torch.arange(start, min(start + batch_size, n))
        k = len(idx)
        if k < lo:
            idx = torch.cat([idx, idx[-1:].repeat(lo - k)])
        x = ds.select(idx).x
        with guard(lambda x=x: x) if guard else contextlib.nullcontext():
            outs.append(runner.predict(x)[:k])
    return torch.cat(outs)


def _probe(runner: Runner, ds: Dataset, data_name: str) -> tuple[Any, Any, Any]:
    """Run one small batch; data that doesn't fit becomes a ShapeMismatchError naming the artifact.
    Returns the batch's outputs, its labels (None without labels) and its inputs."""
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
        raise ShapeMismatchError(
            f"data {data_name} does not fit {runner.name} ({runner.runtime}): {_first_line(e)}",
            expected=expected,
            got=got,
        ) from None
    if out.dim() == 0 or out.shape[0] != bs:
        raise UsageError(
            f"{runner.name}: output of shape {tuple(out.shape)} for a batch of {bs}; "
            "validate needs one output row per sample"
        )
    return out, labels, x


def _entry(runner: Runner, role: str, ref: Any, eval_bs: int, size: dict, mem: PeakMemory) -> Entry:
    art = None
    if runner.path is not None:
        from ptopt.core.artifact import Artifact

        try:
            art = Artifact.maybe_load(runner.path)
        except PtoptError:
            art = None
    return Entry(
        name=runner.name,
        ref=runner.ref if not isinstance(ref, (str, os.PathLike)) else str(ref),
        role=role,
        format=runner.format,
        runtime=runner.runtime,
        precision=runner.precision,
        parent=art.parent if art else None,
        config=art.config if art else None,
        batch_range=list(runner.batch_range) if runner.batch_range else None,
        eval_batch_size=eval_bs,
        size=size,
        peak_memory_mb=None if mem.peak_mb is None else round(mem.peak_mb, 1),
        peak_memory_delta_mb=None if mem.delta_mb is None else round(mem.delta_mb, 1),
        device=runner.device,
        info={k: v for k, v in runner.info.items() if isinstance(v, (str, int, float, list))},
    )


def _ranked(
    entries: list[Entry], gates: _gates.Gates, sizes: list[int], features: bool = False
) -> list[Entry]:
    """The artifacts eligible as best (``BEST_RULE``), fastest first. ``features``: the reference's
    outputs are not class scores (no top-1 agreement: the worst-sample cosine stands in for it)."""
    accuracy_gated = any(
        g is not None for g in (gates.max_accuracy_drop, gates.min_agreement, gates.min_cosine)
    )
    eligible = []
    for e in entries:
        if not e.passed or _lineage.flagged(e.to_dict()):
            continue
        if not accuracy_gated:
            if e.accuracy_drop is not None:
                if e.accuracy_drop > BEST_MAX_DROP:
                    continue
            else:
                agr = (e.agreement or {}).get("min_cosine" if features else "top1_agreement")
                if agr is not None and agr < BEST_MIN_AGREEMENT:
                    continue
        eligible.append(e)

    def key(e: Entry) -> tuple:
        return tuple(e.latency.get(str(bs), {}).get("p50_ms", float("inf")) for bs in sizes)

    return sorted(eligible, key=key)
