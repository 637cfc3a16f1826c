"""``ptopt.optimize``: the fastest deployable artifact within an accuracy budget, across techniques,
formats and runtimes, measured on this machine.

    res = ptopt.optimize("zoo:resnet", calib_data="builtin:digits32:train",
                         eval_data="builtin:digits32:test", accuracy_budget=1.0, output="opt")
    res.best.name, res.best.speedup      # e.g. "int8-onnx-qdq", {"1": 1.8, "32": 2.6}
    res.model(x)                         # the best candidate, in this process
    res.exit_code                        # 0: a winner; 1: nothing within the budget (best found named)
    res.report                           # the report.json dict (schema ``ptopt.optimize/2``)

Order of work: every option and input a user can get wrong is checked before anything is built
(exit 2, nothing written); the model and data load; one reference batch is timed, and a time budget
too short to evaluate and time the fp32 reference is refused saying how long that takes; then the
search (``ptopt.optimize.search``) builds the catalogue's candidates (``ptopt.optimize.candidates``),
pre-screens, evaluates and times them. ``best`` is the fastest candidate within the accuracy budget
at the largest requested batch size (ties: the smaller file) among those ``ptopt package`` takes as
they are (TorchScript, ONNX, ExportedProgram and AOTInductor ``.pt2``; the fp32 eager reference is
reported, never chosen). ``report["best_by_batch"]`` names the same rule's pick at each requested batch
size (with its file once saved): one winner cannot be the fastest at every batch size. ``save(directory)`` writes
``best.<ext>``, ``candidates/``, ``report.json`` (+ ``report.html``, ``summary.md``) into a folder
staged beside the destination and renamed into place.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptopt.core import progress as _progress
from ptopt.core.choice import fastest_within
from ptopt.core.data import split_eval
from ptopt.core.errors import DataError, UsageError
from ptopt.optimize.candidates import REFERENCE, Candidate, Context, runtime_filters, select
from ptopt.optimize.options import OPTIONS, OptimizeOptions, resolve
from ptopt.optimize.search import (
    Clock,
    Evaluator,
    Search,
    Settings,
    check_budget,
    measure_costs,
)

if TYPE_CHECKING:
    from ptopt.optimize.lm import LMOptimizeResult

SCHEMA = "ptopt.optimize/2"
_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


@dataclasses.dataclass
class OptimizeResult:
    """What ``optimize`` found (see the module docstring)."""

    candidates: list[Candidate]
    best: Candidate | None
    report: dict[str, Any]
    #: the model and data the search ran on (never written over by ``save``)
    inputs_paths: tuple[Path, ...] = ()
    directory: Path | None = None
    _final: Path | None = dataclasses.field(default=None, repr=False)
    #: the search's clock: ``save`` counts its own time in (``elapsed_s``, ``time_phases``)
    clock: Clock | None = dataclasses.field(default=None, repr=False)

    @property
    def exit_code(self) -> int:
        return int(self.report["exit_code"])

    @property
    def model(self) -> Any:
        """The best candidate's in-memory callable, or None."""
        return None if self.best is None else self.best.model

    @property
    def artifact(self) -> Any:
        """The saved ``best.<ext>`` Artifact (after ``save``), else None."""
        if self.best is None or self.best.result is None:
            return None
        return self.best.result.artifact if self.directory is not None else None

    def candidate(self, name: str) -> Candidate:
        return next(c for c in self.candidates if c.name == name)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the folder (``best.<ext>``, ``candidates/``, reports), staged and renamed into place;
        refused (nothing written) when ``directory`` is a file, a non-empty folder or an input."""
        directory = Path(directory)
        check_output_dir(directory, self.inputs_paths)
        directory.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{directory.name}.stage-", dir=directory.parent))
        try:
            self._final = directory
            self._write(stage)
            if directory.exists():
                directory.rmdir()  # empty: check_output_dir said so
            os.rename(stage, directory)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        self.directory = directory
        if self.best is not None and self.best.result is not None:  # point at the renamed files
            from ptopt.core.artifact import Artifact

            self.best.result.artifact = Artifact.load(directory / f"best{self.best.suffix}")
        return directory

    def _write(self, stage: Path) -> None:
        # made here, so that saving a candidate does not announce the staging folder it lies in
        t0, planned = time.perf_counter(), _writing_s(self.candidates, self.best)
        (stage / "candidates").mkdir(exist_ok=True)
        for cand in self.candidates:
            if cand.status == "kept" and cand.result is not None:
                cand.path = f"candidates/{cand.name}{cand.suffix}"
                _mark(cand, None)
                cand.size_bytes = cand.result.save(stage / cand.path).size_bytes
        self.report["candidates"] = [c.to_dict() for c in self.candidates]
        if self.best is not None and self.best.result is not None:
            _mark(self.best, "report.json", self.report.get("split"))
            self.best.result.save(stage / f"best{self.best.suffix}")
            self.report["best_path"] = f"best{self.best.suffix}"
        for entry in (self.report.get("best_by_batch") or {}).values():
            cand = self.candidate(entry["name"])
            entry["path"] = self.report["best_path"] if cand is self.best else cand.path
        if self.clock is not None:  # the reports say what the whole run took, writing -o included
            self.clock.phases["writing"] = {"seconds": round(time.perf_counter() - t0, 1), "planned": planned}
            _account(self.report, self.clock)
        _write_reports(self.report, stage, self._final)


def _writing_s(cands: list[Candidate], best: Candidate | None) -> float:
    """What the search kept for writing the folder (``Search.writing_s``: each kept one, the winner twice)."""
    kept = [c.save_seconds or 0.0 for c in cands if c.status == "kept"]
    return round(sum(kept) + (best.save_seconds or 0.0 if best is not None else 0.0), 1)


def _account(report: dict[str, Any], clock: Clock) -> None:
    """The run's time in the report: ``elapsed_s`` (everything so far, writing -o included), each phase's
    seconds and plan (``time_phases``) and, past the budget, ``over_budget``: by how much and which phase
    or build ran over (``ptopt.optimize.report.search_line`` prints it)."""
    from ptopt.optimize.report import overrun

    report["elapsed_s"] = round(clock.elapsed(), 2)
    report["time_phases"] = dict(clock.phases)
    report["over_budget"] = overrun(report)


def _mark(cand: Candidate, report: str | None, split: dict[str, Any] | None = None) -> None:
    """The sidecar names the whole path that produced the artifact, its worst-sample cosine on the held-out
    samples (measured, and projected: ``ptopt.core.tail``) and, for the winner, how the eval data was split
    between choosing it and accepting it."""
    record = {"candidate": cand.name, "label": cand.label, "steps": list(cand.steps)}
    if cand.tail is not None:  # the worst cosine it was accepted on: measured, and projected
        record["worst_cosine"] = cand.tail
    if report:
        record["report"] = report
    if split:
        record["split"] = split
    cand.result.template.extra["optimize"] = record


def _write_reports(report: dict[str, Any], stage: Path, directory: Path) -> None:
    """report.json, report.html and summary.md, written into ``stage`` (renamed to ``directory``
    afterwards, the folder the reports name)."""
    from ptopt.optimize import report as reports

    reports.write_json(report, stage / "report.json")
    reports.write_html(report, stage / "report.html", directory=directory)
    reports.write_markdown(report, stage / "summary.md", directory=directory)


def render(report: dict[str, Any], directory: Path | None = None) -> str:
    """The terminal summary (with ``directory``, the output folder: the winner's file and the command that
    packages it)."""
    from ptopt.optimize.report import render_terminal

    return render_terminal(report, directory=directory)


@_progress.reported
@OPTIONS.twin
def optimize(
    model: Any,
    *,
    calib_data: Any = None,
    eval_data: Any = None,
    train_data: Any = None,
    input_shapes: Any = None,
    weights: Any = None,
    allow_pickle: bool = False,
    output: str | os.PathLike | None = None,
    latency: Any = None,
    progress: Callable[[str], None] | bool | None = None,
    **options: Any,
) -> OptimizeResult | LMOptimizeResult:
    """Search the candidates for the fastest artifact within the accuracy budget (module docstring).

    ``model``: an nn.Module, a MODEL reference (``weights``/``allow_pickle`` qualify it) or a stage
    Result; ``calib_data``/``eval_data``/``train_data``: DATA references or in-memory data.
    ``options``: the fields of ``ptopt.optimize.options.OptimizeOptions`` and validate's
    ``LatencyOptions`` (listed below). ``accuracy_budget``: points of top-1 on the labelled
    ``eval_data`` (validate's definition); ``min_cosine``: the worst sample's cosine with the fp32
    outputs (unlabelled data); exactly one. ``runtime``: any | torch | onnxruntime. ``time_budget``:
    seconds, or ``"10m"``/``"90s"`` (default 9 minutes, writing ``output`` included).
    ``candidates``/``skip``: catalogue names to try only / to leave out (``ptopt.optimize.candidates``).
    ``threads``, ``rounds``, ``min_seconds`` or ``latency`` (a validate ``LatencyOptions``): how the
    survivors are timed. ``output``: also ``save`` there (a new or empty folder). ``progress``: a
    callable taking each progress line, True for lines on stderr, None/False for silence.
    ``max_perplexity_increase`` (%): a causal language model, judged on ``eval_data`` text; the
    weight-only search of ``ptopt.optimize.lm``: returns its ``LMOptimizeResult`` (else an
    ``OptimizeResult``).
    ``isa``: CPU levels every candidate within the budget must hold at too (``ptopt.optimize.isa``).
    """
    say = progress if callable(progress) else (_to_stderr if progress else (lambda msg: None))
    kind, opts, lat = resolve(options, latency)
    if kind == "lm":
        given = dict(train_data=train_data, input_shapes=input_shapes, weights=weights)
        return _optimize_lm(model, opts, lat, eval_data, calib_data, output, allow_pickle, given, say)
    settings, specs = _settings(opts, lat, eval_data, calib_data)
    clock = Clock(settings.time_budget)
    inputs_paths = _output_checked(output, model, weights, calib_data, eval_data, train_data)
    loaded, data = _load(model, weights, allow_pickle, calib_data, eval_data, train_data, settings)
    search, isa_section = _search(loaded, data, input_shapes, settings, specs, clock, say)
    best, within = _choose(search.candidates, settings)
    report = _report(search.candidates, best, within, settings, loaded, clock)
    report |= _report_tail(search, settings, within, isa_section)
    result = OptimizeResult(search.candidates, best, report, inputs_paths, clock=clock)
    if output is not None:
        with _progress.step(f"writing {output}", announce=False):
            result.save(output)
    else:
        _account(report, clock)
    return result


def _search(
    loaded: Any, data: Any, input_shapes: Any, settings: Settings, specs: list, clock: Clock, say: Any
) -> tuple[Search, dict[str, Any] | None]:
    """The reference timed, the budget checked against what it costs, then the search; with --isa, the
    kept candidates judged at every level after it (their time set aside from the search's)."""
    from ptopt.core.timing import torch_threads
    from ptopt.validate.runners import runner_for_loaded

    # the runners set the thread count for the whole process: restored afterwards
    with torch_threads(None):
        ref_runner = _place(runner_for_loaded(REFERENCE, loaded), settings.device)
        search, isa_section = None, None
        try:
            ref_runner.prepare(settings.threads)
            costs = measure_costs(ref_runner, data["eval"], settings)
            check_budget(costs, settings)
            ctx = Context(
                loaded.module, data["calib"], data["eval"], data["train"], input_shapes,
                settings.max_accuracy_drop, settings.min_cosine, clock.left,
                batch_sizes=tuple(settings.batch_sizes), device=settings.device,
            )  # fmt: skip
            search = Search(ctx, specs, settings, costs, clock)
            _set_aside(search, say)
            clock.phases["loading"] = {"seconds": round(clock.elapsed(), 1)}
            _run(search, ref_runner, settings, say)
            with clock.phase("--isa level checks", clock.reserve()):
                isa_section = _check_levels(search, settings.isa, say, clock)
            if not settings.isa:
                clock.phases.pop("--isa level checks")
        finally:
            ref_runner.close()
            if search is not None:
                search.close()
    return search, isa_section


def _place(ref_runner: Any, device: str) -> Any:
    """The fp32 reference's runner on ``device``: a copy of the module moves there (the candidates are built
    from the CPU one)."""
    if device != "cpu":
        import copy

        ref_runner.module = copy.deepcopy(ref_runner.module)
        ref_runner.place(device)
    return ref_runner


def _output_checked(output: Any, *refs: Any) -> tuple[Path, ...]:
    """The inputs' paths; the output folder refused (before anything loads) when it cannot be written."""
    inputs_paths = _input_paths(*refs)
    if output is not None:
        check_output_dir(Path(output), inputs_paths)
    return inputs_paths


def _set_aside(search: Search, say: Callable[[str], None] = print) -> None:
    """With --isa, the level checks (they run after the search) keep part of the budget: what they need for
    the candidates kept so far (``Search.reserved_s``, asked at every ``Clock.left``), said in one line (a
    candidate skipped for time otherwise sees only what was left)."""
    settings, clock = search.settings, search.clock
    clock.reserve = search.reserved_s
    if not settings.isa:
        return
    from ptopt.core.isa import is_native
    from ptopt.optimize.isa import RESERVE_SHARE

    now, cap = search.reserved_s(), RESERVE_SHARE * settings.time_budget
    if now >= 0.5:
        capped = ",".join(lv for lv in settings.isa if not is_native(lv))
        say(
            f"--isa {capped}: {now:.0f} s of the {settings.time_budget:.0f} s --time-budget kept "
            f"for the level checks after the search (up to {cap:.0f} s before a candidate is kept), growing "
            "with each candidate kept by what opening and judging it took here; what they do not need goes "
            "back to the search"
        )


def _check_levels(
    search: Search, levels: Sequence[str], say: Callable[[str], None], clock: Clock
) -> dict[str, Any] | None:
    """--isa: the kept candidates judged at every level (``ptopt.optimize.isa``), in the budget kept for
    them; None without levels."""
    clock.reserve = lambda: 0.0
    if not levels:
        return None
    from ptopt.optimize.isa import check_levels

    return check_levels(search, levels, say)


def _report_tail(
    search: Search, settings: Settings, within: bool, isa: dict[str, Any] | None
) -> dict[str, Any]:
    """The report's per-batch winners, the eval data's split and, with --isa, the level checks."""
    best_by_batch = _per_batch(search.candidates, settings) if within else {}
    return {
        "best_by_batch": best_by_batch,
        "split": search.split,
        # noisy_cells, cells, retimed (timed again on a busy machine), busy: as validate's report
        "timing_noise": search.timing,
        **({"isa": isa} if isa is not None else {}),
    }


def _optimize_lm(
    model: Any,
    opts: OptimizeOptions,
    lat: Any,
    eval_data: Any,
    calib_data: Any,
    output: Any,
    allow_pickle: bool,
    others: dict[str, Any],
    say: Callable[[str], None],
) -> Any:
    """``optimize(max_perplexity_increase=...)``: the language-model search (``optimize/lm.py``);
    ``others``: the arguments of the other search, refused here when given."""
    from ptopt.core.options import soft
    from ptopt.core.timing import torch_threads
    from ptopt.optimize.lm import optimize_lm

    given = sorted(k for k, v in others.items() if v not in (None, (), []) and not soft(k))
    if given:
        raise UsageError(
            f"{', '.join(given)}: not options of the language-model search (--max-perplexity-increase)"
        )
    if eval_data is None:
        raise UsageError(
            "--max-perplexity-increase needs --eval-data: text (a .txt, token ids, builtin:pydoc-text:eval)"
        )
    if output is not None:
        check_output_dir(Path(output), ())
    with torch_threads(opts.threads):
        return optimize_lm(
            model, eval_data=eval_data, calib_data=calib_data, max_perplexity_increase=opts.max_perplexity_increase,
            output=output, candidates=opts.candidates, skip=opts.skip, allow_pickle=allow_pickle,
            time_budget=parse_duration(opts.time_budget), progress=say, rounds=lat.rounds,
        )  # fmt: skip


def _to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run(search: Search, ref_runner: Any, settings: Settings, say: Callable[[str], None]) -> None:
    ref = search.candidates[0]
    select, heldout, search.split = split_eval(search.ctx.evald)
    held = f", {len(heldout)} held out to accept on" if heldout is not None else ""
    say(f"evaluating the fp32 reference on {len(select)} samples to choose on{held}")
    t0 = time.perf_counter()
    with search.clock.phase("builds"):
        search.evaluator = Evaluator(ref_runner, select, settings, heldout)
        search.costs.observe_eval(time.perf_counter() - t0)  # a whole pass: steadier than the first few calls
        ref.status, ref.within_budget = "kept", True
        ev = search.evaluator
        ref_acc = ev.ref_acc if heldout is None else ev._top1(ev.held_ref, heldout)
        ref.accuracy, ref.accuracy_drop, ref.cosine_min, ref.cosine_projected = ref_acc, 0.0, 1.0, 1.0
        search.run(say)
    search.time_kept(ref_runner, say)


def _choose(cands: list[Candidate], settings: Settings) -> tuple[Candidate | None, bool]:
    """The fastest packageable candidate within the budget at the largest batch size (ties: the smaller
    file); when none is, the packageable built one closest to the goal (not within the budget)."""
    bs = str(settings.batch_sizes[-1])

    def median(c: Candidate) -> float:
        return (c.latency_ms.get(bs) or {}).get("median", float("inf"))

    best, within = fastest_within(
        cands,
        latency=median,
        within=lambda c: c.status == "kept" and bool(c.within_budget) and c.packageable,
        tiebreak=lambda c: c.size_bytes or 0,
    )
    if within:
        return best, True
    built = [c for c in cands if c.result is not None and c.packageable and c.cosine_min is not None]
    if not built:
        return None, False
    if settings.metric == "top1":
        return min(built, key=lambda c: (c.accuracy_drop, median(c))), False
    projected = lambda c: c.cosine_min if c.cosine_projected is None else c.cosine_projected  # noqa: E731
    return max(built, key=lambda c: (projected(c), c.cosine_min, -median(c))), False


def _per_batch(cands: list[Candidate], settings: Settings) -> dict[str, dict[str, Any]]:
    """At each timed batch size, the fastest packageable candidate within the budget (one winner cannot
    be the fastest at every batch size: ``best`` is the one at the largest; a user who deploys at
    another batch takes that batch's, or asks for it alone with ``--batch-size B``)."""
    out: dict[str, dict[str, Any]] = {}
    for b in settings.batch_sizes:
        bs = str(b)
        best, within = fastest_within(
            cands,
            latency=lambda c, bs=bs: (c.latency_ms.get(bs) or {}).get("median", float("inf")),
            within=lambda c: c.status == "kept" and bool(c.within_budget) and c.packageable,
            tiebreak=lambda c: c.size_bytes or 0,
        )
        if within and best is not None:
            out[bs] = {"name": best.name, "speedup": best.speedup.get(bs), "path": None}
    return out


def _report(
    cands: list[Candidate],
    best: Candidate | None,
    within: bool,
    settings: Settings,
    loaded: Any,
    clock: Clock,
) -> dict[str, Any]:
    import torch

    from ptopt import __version__
    from ptopt.core.system import machine_summary

    return {
        "schema": SCHEMA,
        "ptopt_version": __version__,
        "torch_version": torch.__version__,
        "machine": machine_summary(),  # as validate's report: the same machine line prints for both
        "threads": settings.threads,
        "device": settings.device,
        "model": loaded.ref,
        "budget": {"max_accuracy_drop": settings.max_accuracy_drop, "min_cosine": settings.min_cosine},
        "worst_cosine": worst_cosine_rule(),
        "batch_sizes": settings.batch_sizes,
        "runtime": settings.runtime,
        "time_budget_s": settings.time_budget,
        "elapsed_s": round(clock.elapsed(), 2),
        "metric": settings.metric,
        "reference": REFERENCE,
        "candidates": [c.to_dict() for c in cands],
        "best": None if best is None else best.name,
        "best_within_budget": within,
        "best_path": None,
        "ranking_batch_size": settings.batch_sizes[-1],
        "exit_code": 0 if within else 1,
    }


def worst_cosine_rule() -> dict[str, Any]:
    """How ``--min-cosine`` is judged (report.json's ``worst_cosine``): the worst sample's cosine projected
    to ``reference_samples`` samples from the held-out ones (``ptopt.core.tail``)."""
    from ptopt.core.tail import REFERENCE_SAMPLES

    return {
        "reference_samples": REFERENCE_SAMPLES,
        "judged_on": "projected",
        "rule": (
            f"the expected worst cosine over {REFERENCE_SAMPLES} samples like the held-out ones: the lowest of "
            "the measured worst, an exponential tail of the mean deviation (1 - cosine), and an exponential "
            "fitted to the top quarter of the deviations"
        ),
    }


# -- bad input: checked before anything loads ---------------------------------------------------------


def parse_duration(value: Any) -> float:
    """Seconds from ``600``, ``"90s"``, ``"10m"``, ``"1h"``; a negative budget is a UsageError."""
    m = _DURATION.match(str(value)) if not isinstance(value, (int, float)) else None
    if m is None and not isinstance(value, (int, float)):
        raise UsageError(f"--time-budget {value!r}: write seconds or a duration such as 90s, 10m, 1h")
    seconds = float(value) if m is None else float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds < 0:
        raise UsageError(f"--time-budget {value}: a time budget cannot be below zero")
    return seconds


def _settings(opts: OptimizeOptions, lat: Any, eval_data: Any, calib_data: Any) -> tuple[Settings, list[Any]]:
    """The search's settings from its options, the data required checked."""
    for option, value in (("--eval-data", eval_data), ("--calib-data", calib_data)):
        if value is None:
            raise UsageError(
                f"{option} is required: optimize measures every candidate on data (e.g. builtin:digits32:test)"
            )
    budget = parse_duration(opts.time_budget)
    _check_runtime(opts.runtime)
    device = _check_device(opts.device)
    threads = opts.threads
    if threads is None:
        from ptopt.core.system import cpu_info

        threads = int(cpu_info()["usable_cores"])
    sizes = list(opts.batch_sizes)
    settings = Settings(
        sizes, opts.runtime, budget, lat, int(threads), opts.accuracy_budget, opts.min_cosine,
        device=device, isa=opts.isa,
    )  # fmt: skip
    return settings, select(opts.candidates, opts.skip, device)


def _check_runtime(runtime: str) -> None:
    if runtime not in runtime_filters():
        raise UsageError(f"--runtime {runtime!r}: choose one of {', '.join(runtime_filters())}")
    if runtime == "onnxruntime" and importlib.util.find_spec("onnxruntime") is None:
        raise UsageError("--runtime onnxruntime: onnxruntime is not installed here (pip install onnxruntime)")


def _check_device(device: str) -> str:
    """``cpu`` or ``cuda:N`` (the GPU checked to exist): the catalogue and the runners of that device."""
    from ptopt.core.device import resolve_device

    try:
        return str(resolve_device(device, allow_auto=False))
    except UsageError as e:
        raise UsageError(f"--device: {e}") from None


def _input_paths(*refs: Any) -> tuple[Path, ...]:
    return tuple(Path(r) for r in refs if isinstance(r, (str, os.PathLike)) and Path(r).exists())


def check_output_dir(directory: Path, inputs: tuple[Path, ...]) -> None:
    """The output folder: new, or empty; never a file or one of the inputs."""
    for p in inputs:
        if directory.resolve() == p.resolve():
            raise UsageError(f"-o {directory} is an input of this run; give a new folder")
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"-o {directory} is a file; give a new (or empty) folder")
    if directory.is_dir() and any(directory.iterdir()):
        raise UsageError(f"-o {directory} is a folder that is not empty; give a new (or empty) folder")


def _load(
    model: Any, weights: Any, allow_pickle: bool, calib: Any, evald: Any, train: Any, settings: Settings
) -> tuple[Any, dict[str, Any]]:
    """The fp32 source as a LoadedModel with a module, and the data as Datasets (finite values)."""
    from ptopt.core.data import load_data, refuse_missing_file
    from ptopt.core.modelref import as_loaded
    from ptopt.validate.api import _model_ref

    refuse_missing_file(calib_data=calib, eval_data=evald, train_data=train)  # before the model loads
    loaded = as_loaded(_model_ref(model), weights=weights, allow_pickle=allow_pickle)
    loaded.require_module("optimize")
    data = {}
    for key, value in (("calib", calib), ("eval", evald), ("train", train)):
        data[key] = None if value is None else load_data(value, model=loaded)
        if data[key] is not None:
            data[key].check_finite()
    if settings.max_accuracy_drop is not None and not data["eval"].has_labels:
        raise DataError(
            f"--eval-data {data['eval'].name} has no labels, which --accuracy-budget needs; "
            "use --min-cosine C to compare outputs with the fp32 model's instead"
        )
    return loaded, data
