"""Accuracy-aware quantization: meet an accuracy budget with the fastest int8 model found, and explain it.

``ptopt quantize MODEL --mode dynamic|static --accuracy-budget PTS --eval-data D`` (or ``--min-cosine C``
when the data has no labels) runs three steps on the eval data:

1. **Sensitivity**: each quantizable layer is quantized *alone* (every other layer float) and the error
   it causes is measured (``method="float"``: each layer is left float while the rest is quantized,
   and the error it saves is measured). The layers are ranked, most sensitive first.
2. **Search**: candidates are schemes (per-channel vs per-tensor weights; for static mode also the
   histogram / min-max / percentile observers; for dynamic mode also SmoothQuant, which moves
   activation outliers into the weights, see ``smoothquant``) with the ``k`` most sensitive layers
   left float. The
   fastest kind (no float layer) is tried first, then ``k`` grows (doubling, then bisection) until
   the budget holds; within ``tuning_budget`` (trials or seconds) the search then looks for a faster
   candidate that still holds: it drops float layers one at a time (least sensitive first) and tries
   the other schemes. Every candidate's error and latency is recorded. A candidate is timed in short
   interleaved slices with the fp32 model, and its latency is (its p50 / the fp32 p50 of the same
   slices) × the fp32 p50 measured at the start, so a CPU whose speed drifts during the search does
   not reorder the candidates.
3. **Always an answer**: the fastest candidate that holds is written (measured latency; within 10 %,
   a short timing's noise here, the one with fewer float multiply-accumulates). When none holds, the
   most accurate candidate is written, the layers that break the budget are named, and the result
   says so (the CLI exits 1).

Errors, measured against the fp32 model on the same samples:

- **accuracy drop** (points) = 100 × (top-1 accuracy of fp32 − top-1 accuracy of int8), with labels;
- **cosine**: cosine similarity between the flattened fp32 and int8 outputs of each sample; the goal
  ``min_cosine`` holds when the minimum over the samples, *projected to 1000 samples*
  (``ptopt.core.tail``: the worst of a few dozen samples flatters a heavy tail), reaches it; the
  measured minimum and the mean are reported too.

Quantization itself goes through the technique functions of ``techniques/static_fx`` /
``dynamic_fx`` (and so through ``engine_fx``; ``engine_pt2e`` for pt2e): a candidate is just their
config with ``float_modules``, ``per_channel`` and ``observer`` set. The chosen candidate is made
for good by the engine-neutral flow (``flow.quantize_prepared``), like any ``quantize``.

This module holds ``autoquantize``; the tuner (quantize, measure, time) is in ``autoquant_tuner``,
the goal, candidates and result with its tables in ``autoquant_result``, the order of the search in
``autoquant_search``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from ptopt.compress.quantize.autoquant_result import (  # noqa: F401 - re-exported: DEFAULT_TRIALS, SENSITIVITY_METHODS
    DEFAULT_TRIALS,
    SENSITIVITY_METHODS,
    AccuracyGoal,
    AutoQuantResult,
    _explain,
    parse_tuning_budget,
)
from ptopt.compress.quantize.autoquant_search import Search
from ptopt.compress.quantize.autoquant_tuner import Tuner
from ptopt.compress.quantize.config import OPTIONS, SearchOptions
from ptopt.compress.quantize.resolve import check_engine
from ptopt.core.choice import fastest_within
from ptopt.core.data import split_eval
from ptopt.core.errors import UsageError
from ptopt.core.search import accept


@OPTIONS.twin
def autoquantize(
    model: Any,
    mode: str | None,
    output: str | os.PathLike | None = None,
    *,
    eval_data: Any,
    calib_data: Any = None,
    config: Any = None,
    input_shapes: Any = (),
    weights: Any = None,
    allow_pickle: bool = False,
    progress: bool = True,
    **options: Any,
) -> AutoQuantResult:
    """Accuracy-aware int8 (see the module docstring); saves at ``output`` when given (never with
    ``analyze``). ``config`` (a static or dynamic quantization config) is the base scheme the search
    varies; ``options`` are ``quantize``'s (``ptopt.compress.quantize.config.OPTIONS``: the goal and
    the search's ``SearchOptions``, and the base config's fields). ``engine``: fx (default), pt2e
    (static: layers left float through X86InductorQuantizer's module-name config, candidates timed
    compiled by Inductor; the answer is an AOTInductor package, or with ``compile=False`` the int8
    ExportedProgram) or auto (static's default: the search runs on both engines, the tuning budget each,
    and the faster answer that meets the goal is kept: ``extra["engine_choice"]``; ``analyze`` ranks
    the layers on fx).

    Returns an :class:`AutoQuantResult` (``.result`` the chosen model's Result, ``.artifact`` its
    saved Artifact, ``.candidates``, ``.sensitivity``, ``.met``); when no candidate meets the goal
    the most accurate one is still chosen (and saved) and ``.met`` is False
    (``result.raise_if_missed()`` raises GateFailedError, exit code 1).
    """
    from ptopt.compress.quantize.resolve import resolve_config

    base, search = resolve_config(mode, config, options)
    common = dict(input_shapes=input_shapes, weights=weights, allow_pickle=allow_pickle, progress=progress)
    return run_search(model, base, search, output, calib_data=calib_data, eval_data=eval_data, **common)


def run_search(
    model: Any,
    base: Any,
    search: SearchOptions,
    output: Any,
    *,
    calib_data: Any,
    eval_data: Any,
    input_shapes: Any,
    weights: Any,
    allow_pickle: bool,
    progress: bool,
) -> AutoQuantResult:
    """The search of ``autoquantize`` with its options resolved (``base`` config, ``search``)."""
    from ptopt.compress.quantize.config import require_data
    from ptopt.compress.quantize.flow import prepare, winner_output

    trials, seconds = parse_tuning_budget(search.tuning_budget)
    goal = AccuracyGoal(
        search.accuracy_budget, search.min_cosine, trials, seconds, search.sensitivity,
        search.latency_batch_size, search.sensitivity_samples,
    )  # fmt: skip
    analyze, threads = search.analyze, search.threads
    if analyze and base.engine == "auto":  # one engine's layers are ranked: auto's first (static's default)
        base = base.replace(engine="fx")
    _check_request(base.mode, goal, eval_data, analyze)
    _check_base(base, analyze, output)
    require_data(base, calib_data=calib_data)
    prep = prepare(base, model, weights, allow_pickle, input_shapes, calib_data, None, eval_data)
    if goal.max_accuracy_drop is not None:
        prep.evald.require_labels("--accuracy-budget (use --min-cosine to compare outputs without labels)")
    # the search (sensitivity, SmoothQuant's alpha, float layers, scheme) fits on one half of the eval
    # data; the answer is judged, and its figures reported, on the other half it never saw
    data_note = _data_note(prep)
    search_data, heldout, split = split_eval(prep.evald) if not analyze else (prep.evald, None, None)
    prep = dataclasses.replace(prep, evald=search_data)
    engine = base.engine
    if engine == "auto":
        found, search_, tuner, base, choice = _search_both(
            prep, base, goal, threads, heldout, _logger(progress)
        )
    else:
        found, search_, tuner = _search(prep, base, goal, threads, heldout, analyze, _logger(progress))
        choice = None
    found.fp32.update(data_note)
    if analyze:
        return found
    found.result = _chosen_result(found, search_, tuner, base, prep)
    _judge_unseen(found, tuner, heldout, split)
    if choice is not None:
        found.result.template.extra["engine_choice"] = choice
    if output is not None:
        found.artifact = found.result.save(winner_output(found.result, engine, output))
    return found


def _data_note(prep: Any) -> dict[str, Any]:
    """The eval data's name and, with labels on a feature output, the note that top-1 (the
    --accuracy-budget's measure) may mean nothing there (``core.scores.labels_on_features``)."""
    from ptopt.compress.quantize.measure import labels_on_features

    ev = prep.evald
    note = labels_on_features(prep.loaded.module, ev) if ev.has_labels else None
    return {"eval_data": ev.name} | ({"labels_note": note} if note else {})


def _check_base(base: Any, analyze: bool, output: Any) -> None:
    from ptopt.compress.stage import check_output

    if base.engine not in ("fx", "pt2e", "auto"):
        raise UsageError(
            f"accuracy-aware quantization (--min-cosine / --accuracy-budget) searches on --engine fx or pt2e; "
            f"--engine {base.engine}'s float layers: ptopt export MODEL --target openvino --precision int8 "
            "--accuracy-control, or --engine auto (it keeps layers float until the int8 rule holds)"
        )
    if not analyze:
        check_output(output, hint=" such as model.int8.pt")


def _check_request(mode: str, goal: AccuracyGoal, eval_data: Any, analyze: bool) -> None:
    if mode not in ("static", "dynamic"):
        raise UsageError(
            f"accuracy-aware quantization searches --mode static or dynamic, not {mode!r} "
            "(QAT trains instead of searching)"
        )
    if not goal.has_target and not analyze:
        raise UsageError("give --accuracy-budget PTS (labelled eval data) or --min-cosine C, or --analyze")
    if eval_data is None:
        raise UsageError(
            "accuracy-aware quantization measures on --eval-data DATA (e.g. builtin:digits32:test)"
        )


def _search(
    prep: Any,
    base: Any,
    goal: AccuracyGoal,
    threads: int | None,
    heldout: Any,
    analyze: bool,
    log: Callable[[str], None],
) -> tuple[AutoQuantResult, Any, Tuner]:
    """Sensitivity of every quantizable layer, then (unless ``analyze``) the search for a candidate,
    accepted on the ``heldout`` samples (``ptopt.core.search.accept``: one that fails there leads to the
    next rung)."""
    from ptopt.compress.quantize.engine_fx import quantize_context
    from ptopt.core.errors import UnsupportedModelError

    with quantize_context(base.backend):
        tuner = Tuner(prep, base, prep.evald, goal, threads, log)
        names = tuner.quantizable_layers()
        if not names:
            raise UnsupportedModelError(
                f"{prep.loaded.ref}: no layer becomes int8 in --mode {base.mode}; nothing to tune"
            )
        fp32 = {
            "accuracy": tuner.fp32_acc,
            "latency_ms": round(tuner.fp32_latency, 4),
            "latency_batch_size": goal.latency_batch_size,
            "eval_samples": len(prep.evald),
            "sensitivity_samples": len(tuner.sens_eval),
            "threads": threads,
        }
        found = AutoQuantResult(goal, base.mode, fp32, tuner.sensitivity(names))
        if analyze:
            found.seconds = tuner.elapsed()
            return found, None, tuner
        search = Search(tuner, names, found.sensitivity, goal)
        search.run()
        rejected = _accept_unseen(search, tuner, heldout, goal) if heldout is not None else []
        chosen = search.choose()
        found.candidates, found.chosen = search.candidates, None if chosen is None else chosen.index
        found.budget_exhausted = search.exhausted
        found.met = bool(search.holding())
    assert found.best is not None  # the first candidate is always tried
    found.reason = _explain(found, names) + _rejected_note(rejected, heldout)
    found.seconds = tuner.elapsed()
    return found, search, tuner


def _accept_unseen(search: Search, tuner: Tuner, heldout: Any, goal: AccuracyGoal) -> list[Any]:
    """The search's choice judged on the held-out samples it never saw: one that fails there no longer
    holds, the next rung is tried, and the choice is made again (``ptopt.core.search.accept``). Returns
    the candidates rejected there."""
    ref = None

    def holds_unseen(c: Any) -> bool:
        nonlocal ref
        if not c.holds:  # nothing holds on the search's samples: the closest is the answer, not accepted
            return True
        if ref is None:
            ref = tuner.fp32_outputs(heldout)
        c.heldout = tuner.measure(search.quantized(c), heldout, ref)
        tuner.log(f"candidate {c.index + 1} on {len(heldout)} held-out samples: {_figure(c.heldout)}")
        return c.heldout.holds(goal)

    return accept(search.choose, holds_unseen, search.next_rung)[1]


def _rejected_note(rejected: list[Any], heldout: Any) -> str:
    if not rejected:
        return ""
    which = ", ".join(f"{c.index + 1} ({_figure(c.heldout)})" for c in rejected)
    return (
        f" Candidate(s) {which} held on the search's samples but not on {len(heldout)} held-out ones; "
        "the search went on to the next rung."
    )


def _search_both(
    prep: Any, base: Any, goal: AccuracyGoal, threads: int | None, heldout: Any, log: Callable[[str], None]
) -> tuple[AutoQuantResult, Any, Tuner, Any, dict[str, Any]]:
    """``engine="auto"``: the search on fx, then on pt2e; the faster answer meeting the goal (else
    the one meeting it, else fx's) with its search, tuner and base, and why it was chosen."""
    runs = {}
    for name in ("fx", "pt2e"):
        log(f"engine {name}")
        one = check_engine(base.replace(engine=name))
        runs[name] = (*_search(prep, one, goal, threads, heldout, False, log), one)
    met = {k: r[0].met for k, r in runs.items()}
    ms = {k: r[0].best.latency_ms for k, r in runs.items()}
    chosen, _ = fastest_within(runs, ms.get, met.get)
    if chosen is None:  # neither meets the goal: the faster
        chosen, _ = fastest_within(runs, ms.get, lambda k: True)
    why = (
        f"faster at batch {goal.latency_batch_size} within the goal"
        if all(met.values())
        else ("the only engine meeting the goal" if any(met.values()) else "neither meets the goal; faster")
    )
    choice = {"chosen": chosen, "why": why, "search_latency_ms": ms, "goal_met": met}
    found, search, tuner, chosen_base = runs[chosen]
    found.reason = f"engine {chosen} ({why}; search p50 ms {ms}). {found.reason}"
    return found, search, tuner, chosen_base, choice


def _chosen_result(found: AutoQuantResult, search: Any, tuner: Tuner, base: Any, prep: Any) -> Any:
    """The chosen candidate quantized for good (a Result), its search recorded in the sidecar."""
    from ptopt.compress.quantize.engine_fx import quantize_context
    from ptopt.compress.quantize.flow import quantize_prepared

    best = found.best
    final = search.config(best.scheme_key, best.float_layers)
    if best.smooth:
        with quantize_context(base.backend):
            prep = dataclasses.replace(prep, module=tuner.smoothed(final, best.smooth).eval())
    res = quantize_prepared(final, prep, progress=False)
    art = res.template
    art.config["accuracy_goal"] = found.goal.to_dict()
    art.extra["autoquant"] = found.to_dict()
    if best.smooth:
        art.extra["smoothquant"] = {
            "alpha": best.smooth,
            "layers": [n for n in tuner.smoothable if n not in best.float_layers],
            "calibrated_on": len(tuner.sens_eval),
        }
        art.extra.get("onnx_quantization", {})["note"] = (
            "re-quantizes the fp32 parent without SmoothQuant: accuracy differs from this artifact"
        )
    art.metrics |= {
        "min_cosine": best.measurement.min_cosine,
        "mean_cosine": best.measurement.mean_cosine,
        "goal_met": found.met,
        "search_latency_ms": best.latency_ms,
        "fp32_search_latency_ms": found.fp32["latency_ms"],
    }
    return res


def _judge_unseen(found: AutoQuantResult, tuner: Tuner, heldout: Any, split: dict[str, Any]) -> None:
    """The chosen model measured on the held-out samples: those figures are the result's headline
    (``metrics``) and decide whether the goal is met; the search's own stay beside them."""
    art = found.result.template
    search = found.best.measurement
    art.metrics |= {"search_min_cosine": search.min_cosine, "search_mean_cosine": search.mean_cosine}
    if search.accuracy_drop is not None:
        art.metrics["search_accuracy_drop_points"] = search.accuracy_drop
    if heldout is None:
        art.extra["autoquant"] = found.to_dict() | {"split": split}
        return
    unseen = found.unseen = tuner.measure_unseen(found.result.model, heldout)
    art.metrics |= {"min_cosine": unseen.min_cosine, "mean_cosine": unseen.mean_cosine}
    if unseen.projected_cosine is not None:
        art.metrics["projected_min_cosine"] = unseen.projected_cosine
    if unseen.accuracy_drop is not None:
        art.metrics["heldout_accuracy_drop_points"] = unseen.accuracy_drop
    held = unseen.holds(found.goal) if found.goal.has_target else True
    if found.met and not held:
        found.reason = (
            f"the search's answer held on the {split['search_samples']} samples it was fitted on "
            f"({_figure(search)}) but not on {split['heldout_samples']} held-out samples "
            f"({_figure(unseen)}); goal: {found.goal.describe()}"
        )
    elif found.met:
        found.reason = (
            f"{found.reason.rstrip('. ')}; on {split['heldout_samples']} held-out samples: {_figure(unseen)}."
        )
    found.met = found.met and held
    art.metrics["goal_met"] = found.met
    art.extra["autoquant"] = found.to_dict() | {"split": split}


def _figure(m: Any) -> str:
    drop = f", accuracy drop {m.accuracy_drop:.2f} pts" if m.accuracy_drop is not None else ""
    projected = "" if m.projected_cosine is None else f" (projected to 1000 samples {m.projected_cosine:.4f})"
    return f"min cosine {m.min_cosine:.4f}{projected}{drop}"


def _logger(progress: bool) -> Callable[[str], None]:
    if not progress:
        return lambda msg: None
    from ptopt.core import progress as report  # one line per message (muted by --quiet), never wrapped

    return lambda msg: report.note(f"autoquant: {msg}")
