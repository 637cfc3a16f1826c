"""Accuracy-aware quantization: meet an accuracy budget with the fastest int8 model found, and explain it.

``ptopt quantize MODEL --mode dynamic|static --max-accuracy-drop PTS --eval-data D`` (or ``--min-cosine C``
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
  ``min_cosine`` holds when the *minimum* over the samples reaches it (the mean is reported too).

Quantization itself goes through the techniques of ``ptopt.compress.quantize_static`` /
``quantize_dynamic`` (and so through ``quant_engine``): a candidate is just their config with
``float_modules``, ``per_channel`` and ``observer`` set.

This module holds the tuner (quantize, measure, time) and ``autoquantize``; the goal, candidates and
result with its tables are in ``autoquant_result``, the order of the search in ``autoquant_search``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

from ptopt.compress.autoquant_result import (  # noqa: F401 - re-exported: DEFAULT_TRIALS, SENSITIVITY_METHODS
    DEFAULT_TRIALS,
    SENSITIVITY_METHODS,
    AccuracyGoal,
    AutoQuantResult,
    Measurement,
    _explain,
    parse_tuning_budget,
)
from ptopt.compress.autoquant_search import LATENCY_TIE, Search  # noqa: F401
from ptopt.core.data import rebatch
from ptopt.core.errors import UsageError
from ptopt.core.timing import torch_threads

EVAL_BATCH = 64


# -- the search -------------------------------------------------------------------------------------


class _Tuner:
    """Quantizes candidates through the technique functions, measures them against cached fp32 outputs."""

    def __init__(
        self,
        module: Any,
        base: Any,
        calib: Any,
        evald: Any,
        example: Any,
        goal: AccuracyGoal,
        threads: int | None,
        log: Callable[[str], None],
    ):
        import torch

        self.module, self.base, self.calib, self.example, self.goal = module, base, calib, example, goal
        self.log, self.threads = log, threads
        self.eval = evald
        self.by_accuracy = goal.max_accuracy_drop is not None or (not goal.has_target and evald.has_labels)
        self.sens_eval = (
            evald.take(goal.sensitivity_samples) if len(evald) > goal.sensitivity_samples else evald
        )
        self.started = time.perf_counter()
        with torch.no_grad():
            self.ref = self._outputs(module, evald)
        self.fp32_acc = self._accuracy(self.ref, evald)
        self.latency_x = rebatch(
            evald.first_batch(min(len(evald), goal.latency_batch_size)).x, goal.latency_batch_size
        )
        self.params = {n: sum(p.numel() for p in m.parameters()) for n, m in module.named_modules() if n}
        self.types = {n: type(m).__name__ for n, m in module.named_modules() if n}
        self.cost = self._macs(module, example)
        self.layers: list[str] = []
        self._absmax: dict[str, Any] | None = None
        #: the model's input specs and calling style (the pt2e engine captures the graph with them)
        self.specs: list[Any] = []
        self.style = "positional"

    @functools.cached_property
    def fp32_latency(self) -> float:
        """p50 ms of the fp32 model (timed on first use: a sensitivity ranking alone needs no timing)."""
        return self.latency(self.module)

    @staticmethod
    def _macs(module: Any, example: Any) -> dict[str, float]:
        """Multiply-accumulates per sample of each weighted layer (weights × output positions), the
        expected price of keeping it float."""
        import torch

        from ptopt.core.inputspec import batch_size_of, call_model

        out: dict[str, float] = {}
        hooks = []
        for name, m in module.named_modules():
            w = (
                getattr(m, "weight", None)
                if not isinstance(m, torch.nn.RNNBase)
                else getattr(m, "weight_ih_l0", None)
            )
            if not name or not isinstance(w, torch.Tensor) or w.dim() < 2:
                continue
            params = sum(p.numel() for p in m.parameters(recurse=False))

            def hook(mod, inp, y, name=name, rows=w.shape[0], params=params):
                y = y[0] if isinstance(y, (tuple, list)) else y
                if isinstance(y, torch.Tensor):
                    out[name] = params * y.numel() / max(rows, 1) / max(batch_size_of(example), 1)

            hooks.append(m.register_forward_hook(hook))
        try:
            with torch.no_grad():
                call_model(module, example)
        finally:
            for h in hooks:
                h.remove()
        return out

    # quantize / measure ---------------------------------------------------------------------------
    def quantize(self, config: Any, smooth: float | None = None) -> Any:
        if config.engine == "pt2e":  # the converted q/dq graph: measured eagerly, timed compiled
            from ptopt.compress import quant_engine_pt2e as pt2e

            batches = []
            for b in self.calib.batches(config.batch_size, shuffle=True, seed=0):
                if len(batches) >= config.calibration_batches:
                    break
                batches.append(b.x)
            return pt2e.quantize_static(self.module, self.specs, self.style, config, batches)
        if smooth:
            from ptopt.compress.quantize_dynamic import quantize_dynamic

            return quantize_dynamic(self.smoothed(config, smooth), config, self.example).module
        if config.mode == "static":
            from ptopt.compress.quantize_static import quantize_static

            return quantize_static(self.module, config, self.calib, self.example, progress=False).module
        from ptopt.compress.quantize_dynamic import quantize_dynamic

        return quantize_dynamic(self.module, config, self.example).module

    @property
    def smoothable(self) -> list[str]:
        """Quantizable Linears (dynamic mode): SmoothQuant candidates."""
        import torch

        if self.base.mode != "dynamic":
            return []
        return [n for n in self.layers if isinstance(self.module.get_submodule(n), torch.nn.Linear)]

    def smoothed(self, config: Any, alpha: float) -> Any:
        """The fp32 model with its int8-bound Linears smoothed (float layers stay as they are)."""
        from ptopt.compress import smoothquant

        if self._absmax is None:
            self._absmax = smoothquant.activation_absmax(self.module, self.sens_eval, self.smoothable)
        floats = set(config.float_modules)
        return smoothquant.smooth(
            self.module, self._absmax, alpha, [n for n in self.smoothable if n not in floats]
        )

    def _outputs(self, model: Any, ds: Any) -> list[Any]:
        from ptopt.core.inputspec import call_model

        outs = []
        for b in ds.batches(EVAL_BATCH):
            y = call_model(model, b.x)
            outs.append(_as_matrix(y))
        return outs

    def _accuracy(self, outs: list[Any], ds: Any) -> float | None:
        if not ds.has_labels:
            return None
        import torch

        pred = torch.cat([o.argmax(-1) for o in outs])
        return float((pred == ds.y[: len(pred)]).float().mean())

    def measure(self, model: Any, ds: Any) -> Measurement:
        import torch

        ref = torch.cat(self.ref)[: len(ds)]
        try:
            with torch.no_grad(), torch_threads(self.threads):
                outs = self._outputs(model, ds)
        except (RuntimeError, NotImplementedError) as e:
            # some float/int8 mixes do not run (graph mode hands a quantized tensor to a float
            # layer): such a candidate is the worst there is, not the end of the search
            self.log(f"candidate does not run: {str(e).splitlines()[0][:120]}")
            return Measurement(
                int(len(ref)), -1.0, -1.0, 0.0 if ds.has_labels else None, 100.0 if ds.has_labels else None
            )
        got = torch.cat(outs)
        cos = torch.nn.functional.cosine_similarity(got.double(), ref.double(), dim=1, eps=1e-12)
        acc = drop = None
        if ds.has_labels and ref.shape[1] > 1:
            acc = self._accuracy(outs, ds)
            ref_acc = float((ref.argmax(-1) == ds.y[: len(ref)]).float().mean())
            drop = round(100.0 * (ref_acc - acc), 6)
        return Measurement(int(len(got)), float(cos.min()), float(cos.mean()), acc, drop)

    def latency(self, model: Any) -> float:
        """p50 ms of ``model`` at the goal's batch size.

        The fp32 model is timed once, for 1 s. A candidate is timed in interleaved slices with the fp32
        model and reported as (its p50 / the fp32 p50 of the same slices) × the fp32 p50: on a shared
        CPU whose speed drifts over seconds, candidates timed minutes apart are then still ranked by
        their speed relative to fp32, not by the machine's state when each was timed.
        """
        import torch

        from ptopt.core.inputspec import call_model
        from ptopt.core.timing import measure_interleaved, measure_latency

        x = self.latency_x
        with torch.no_grad(), torch_threads(self.threads):
            if model is not self.module and self.base.engine == "pt2e":
                model = _compiled_int8(model, x)
            if model is self.module:
                return measure_latency(
                    lambda: call_model(model, x),
                    batch_size=self.goal.latency_batch_size,
                    min_iters=5,
                    min_seconds=1.0,
                    warmup_iters=2,
                    warmup_seconds=0.0,
                )["p50_ms"]
            fns = {"fp32": lambda: call_model(self.module, x), "candidate": lambda: call_model(model, x)}
            st = measure_interleaved(
                fns, rounds=3, min_iters=6, min_seconds=0.3, warmup_iters=2, warmup_seconds=0.0
            )
        return st["candidate"]["p50_ms"] / st["fp32"]["p50_ms"] * self.fp32_latency

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    # layers and sensitivity ----------------------------------------------------------------------------
    def quantizable_layers(self) -> list[str]:
        """Layers the base scheme turns int8 (user-excluded ones are not candidates, and neither
        are embeddings: weight-only int8 rows cost no accuracy to speak of and no time)."""
        import torch

        from ptopt.compress import quant_engine as engine

        if self.base.engine == "pt2e":  # what X86InductorQuantizer annotates, by module name
            kinds = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)
            floats = set(self.base.float_modules)
            self.layers = [
                n for n, m in self.module.named_modules() if n and isinstance(m, kinds) and n not in floats
            ]
            return self.layers
        q = self.quantize(self.base)
        out = []
        for name, m in self.module.named_modules():
            if not name or not any(True for _ in m.parameters(recurse=False)):
                continue
            if isinstance(m, torch.nn.Embedding):
                continue
            try:
                qm = q.get_submodule(name)
            except AttributeError:
                continue
            if engine.is_quantized_module(qm):
                out.append(name)
        self.layers = out
        return out

    def sensitivity(self, layers: list[str]) -> list[dict[str, Any]]:
        base_float = tuple(self.base.float_modules)
        rows = []
        full = None
        total = sum(self.cost.get(n, 0.0) for n in layers) or 1.0
        if self.goal.sensitivity == "float":
            full = self.measure(self.quantize(self.base), self.sens_eval)
        for i, name in enumerate(layers):
            if self.goal.sensitivity == "alone":
                floats = base_float + tuple(n for n in layers if n != name)
            else:
                floats = base_float + (name,)
            m = self.measure(self.quantize(self.base.replace(float_modules=floats)), self.sens_eval)
            row = {
                "layer": name,
                "type": self.types.get(name, "?"),
                "params": self.params.get(name, 0),
                "macs_share": round(self.cost.get(name, 0.0) / total, 4),
                **m.to_dict(),
            }
            if self.goal.sensitivity == "alone":
                row["breaks_budget"] = self.goal.has_target and not m.holds(self.goal)
                row["_key"] = m.error(self.by_accuracy)
            else:
                fe, me = full.error(self.by_accuracy), m.error(self.by_accuracy)
                row["saves"] = round(fe[0] - me[0], 9)
                row["_key"] = (fe[0] - me[0], fe[1] - me[1])
            rows.append(row)
            self.log(
                f"sensitivity {i + 1}/{len(layers)}: {name}  min cos {m.min_cosine:.5f}"
                + (f"  drop {m.accuracy_drop:+.2f}" if m.accuracy_drop is not None else "")
            )
        rows.sort(key=lambda r: r["_key"], reverse=True)
        for r in rows:
            r.pop("_key")
        return rows


def _compiled_int8(converted: Any, x: Any) -> Any:
    """A PT2E candidate the way it is deployed: Inductor with freezing (int8 kernels from its
    lowering; the q/dq graph run eagerly is slower than fp32), compiled here by one call at ``x``'s
    (fixed) batch, so the timing that follows measures no compilation."""
    import torch
    from torch._inductor import config as inductor_config

    from ptopt.compress.quant_engine_pt2e import int8_conv_layout
    from ptopt.core.inputspec import call_model
    from ptopt.core.quiet import silenced

    compiled = torch.compile(converted)
    with inductor_config.patch(freezing=True), int8_conv_layout(), silenced(("torch._inductor", "torchao")):
        for _ in range(3):  # the first call compiles; the next ones settle (constants, allocations)
            call_model(compiled, x)
    return compiled


def layer_macs(module: Any, example: Any) -> dict[str, float]:
    """Multiply-accumulates per sample of each layer with a weight matrix (or recurrent weights), by
    name: what keeping it float costs."""
    return _Tuner._macs(module, example)


#: a sensitivity ranking quantizes every layer once: past this many layers, only the search is suggested
MAX_RANKED_LAYERS = 48


def float_layers_that_hold(prep: Any, config: Any, data: Any, max_float: int = 8) -> Any:
    """The layers to keep in float so that ``config``'s int8 model holds export's parity rule against
    the fp32 model on ``data`` (``ptopt.compress.fidelity``): the layers ranked by sensitivity (each
    quantized alone), most sensitive first, then added to ``float_modules`` one by one until the rule
    holds. Returns ``(layers, fidelity record)``, or None when no quantizable layer can be ranked or
    ``max_float`` float layers are not enough."""
    from ptopt.compress import quant_engine as engine
    from ptopt.compress.fidelity import INT8_VS_FP32, measure_fidelity

    goal = AccuracyGoal(min_cosine=0.0, sensitivity_samples=max(len(data), 1), latency_batch_size=1)
    with engine.quantize_context(config.backend):
        tuner = _Tuner(prep.module, config, prep.calib, data, prep.example, goal, None, lambda msg: None)
        names = tuner.quantizable_layers()
        if not names or len(names) > MAX_RANKED_LAYERS:
            return None
        ranked = [row["layer"] for row in tuner.sensitivity(names)]

        def holds(floats: list[str]) -> Any:
            candidate = config.replace(float_modules=tuple(config.float_modules) + tuple(floats))
            try:
                fid = measure_fidelity(prep.module, tuner.quantize(candidate), data, **INT8_VS_FP32)
            except (RuntimeError, NotImplementedError):  # a float/int8 mix graph mode cannot run
                return None
            return fid if fid["passed"] else None

        floats: list[str] = []
        for name in ranked[: min(max_float, len(ranked) - 1)]:
            floats.append(name)
            fid = holds(floats)
            if fid is not None:
                for extra in list(floats[:-1]):  # then as few as hold: drop the ones not needed
                    fewer = holds([n for n in floats if n != extra])
                    if fewer is not None:
                        floats, fid = [n for n in floats if n != extra], fewer
                return floats, fid
    return None


def _as_matrix(y: Any) -> Any:
    """Model output → N × features float tensor (tuples/dicts of tensors are concatenated)."""
    import torch

    if isinstance(y, dict):
        y = list(y.values())
    if isinstance(y, (tuple, list)):
        ts = [t for t in y if isinstance(t, torch.Tensor)]
        return torch.cat([t.reshape(t.shape[0], -1).float() for t in ts], dim=1)
    return y.reshape(y.shape[0], -1).float()


def autoquantize(
    model: Any,
    mode: str,
    output: str | os.PathLike | None = None,
    *,
    eval_data: Any,
    calib_data: Any = None,
    max_accuracy_drop: float | None = None,
    min_cosine: float | None = None,
    tuning_budget: str | int | None = None,
    analyze: bool = False,
    sensitivity: str = "alone",
    latency_batch_size: int = 32,
    sensitivity_samples: int = 256,
    threads: int | None = None,
    config: Any = None,
    backend: str | None = None,
    observer: str | None = None,
    per_channel: bool | None = None,
    calibration_batches: int | None = None,
    batch_size: int | None = None,
    exclude: Any = None,
    layers: Any = None,
    input_shapes: Any = (),
    weights: Any = None,
    allow_pickle: bool = False,
    progress: bool = True,
    engine: str | None = None,
    compile: bool | None = None,
) -> AutoQuantResult:
    """Accuracy-aware int8 (see the module docstring); saves at ``output`` when given (never with
    ``analyze``). ``config`` (a static or dynamic quantization config) is the base scheme the search
    varies; the loose options (backend ... layers) are the same as ``quantize``'s. ``engine``: fx
    (default), pt2e (static: layers left float through X86InductorQuantizer's module-name config,
    candidates timed compiled by Inductor; the answer is an AOTInductor package, or with
    ``compile=False`` the int8 ExportedProgram) or auto (the search runs on both engines, the tuning
    budget each, and the faster answer that meets the goal is kept: ``extra["engine_choice"]``).

    Returns an :class:`AutoQuantResult` (``.result`` the chosen model's Result, ``.artifact`` its
    saved Artifact, ``.candidates``, ``.sensitivity``, ``.met``); when no candidate meets the goal
    the most accurate one is still chosen (and saved) and ``.met`` is False
    (``result.raise_if_missed()`` raises GateFailedError, exit code 1).
    """
    from ptopt.compress.quant_steps import prepare, require_data, resolve_config
    from ptopt.compress.stage import check_output

    trials, seconds = parse_tuning_budget(tuning_budget)
    goal = AccuracyGoal(
        max_accuracy_drop, min_cosine, trials, seconds, sensitivity, latency_batch_size, sensitivity_samples
    )
    _check_request(mode, goal, eval_data, analyze)
    loose = dict(backend=backend, observer=observer, per_channel=per_channel, exclude=exclude, layers=layers)
    loose |= dict(calibration_batches=calibration_batches, batch_size=batch_size)
    base = resolve_config(mode, config, engine=engine, compile=compile, **loose)
    if base.engine == "auto" and analyze:
        raise UsageError("--analyze ranks the layers of one engine: give --engine fx or --engine pt2e")
    if not analyze:
        check_output(output, hint=" such as model.int8.pt")
    require_data(base, calib_data, None)
    prep = prepare(base, model, weights, allow_pickle, input_shapes, calib_data, None, eval_data)
    if goal.max_accuracy_drop is not None:
        prep.evald.require_labels("--max-accuracy-drop (use --min-cosine to compare outputs without labels)")
    if base.engine == "auto":
        found, search, tuner, base, choice = _search_both(prep, base, goal, threads, _logger(progress))
    else:
        found, search, tuner = _search(prep, base, goal, threads, analyze, _logger(progress))
        choice = None
    if analyze:
        return found
    refs = {"calib_data": calib_data, "eval_data": eval_data}
    found.result = _chosen_result(found, search, tuner, base, prep, refs)
    if choice is not None:
        found.result.template.extra["engine_choice"] = choice
    if output is not None:
        found.artifact = found.result.save(output)
    return found


def _check_request(mode: str, goal: AccuracyGoal, eval_data: Any, analyze: bool) -> None:
    if mode not in ("static", "dynamic"):
        raise UsageError(
            f"accuracy-aware quantization searches --mode static or dynamic, not {mode!r} "
            "(QAT trains instead of searching)"
        )
    if not goal.has_target and not analyze:
        raise UsageError("give --max-accuracy-drop PTS (labelled eval data) or --min-cosine C, or --analyze")
    if eval_data is None:
        raise UsageError(
            "accuracy-aware quantization measures on --eval-data DATA (e.g. builtin:digits32:test)"
        )


def _search(
    prep: Any, base: Any, goal: AccuracyGoal, threads: int | None, analyze: bool, log: Callable[[str], None]
) -> tuple[AutoQuantResult, Any, _Tuner]:
    """Sensitivity of every quantizable layer, then (unless ``analyze``) the search for a candidate."""
    from ptopt.compress import quant_engine as engine
    from ptopt.core.errors import UnsupportedModelError

    with engine.quantize_context(base.backend):
        tuner = _Tuner(prep.module, base, prep.calib, prep.evald, prep.example, goal, threads, log)
        tuner.specs, tuner.style = list(prep.loaded.input_specs), prep.loaded.input_style
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
        found.candidates, found.chosen = search.candidates, search.choose()
        found.budget_exhausted = search.exhausted
        found.met = bool(search.holding())
    assert found.best is not None  # the first candidate is always tried
    found.reason = _explain(found, names)
    found.seconds = tuner.elapsed()
    return found, search, tuner


def _search_both(
    prep: Any, base: Any, goal: AccuracyGoal, threads: int | None, log: Callable[[str], None]
) -> tuple[AutoQuantResult, Any, _Tuner, Any, dict[str, Any]]:
    """``engine="auto"``: the search on fx, then on pt2e; the faster answer meeting the goal (else
    the one meeting it, else fx's) with its search, tuner and base, and why it was chosen."""
    runs = {}
    for name in ("fx", "pt2e"):
        log(f"engine {name}")
        one = base.replace(engine=name)
        runs[name] = (*_search(prep, one, goal, threads, False, log), one)
    met = {k: r[0].met for k, r in runs.items()}
    ms = {k: r[0].best.latency_ms for k, r in runs.items()}
    holding = [k for k in runs if met[k]] or list(runs)
    chosen = min(holding, key=lambda k: ms[k])
    why = (
        f"faster at batch {goal.latency_batch_size} within the goal"
        if all(met.values())
        else ("the only engine meeting the goal" if any(met.values()) else "neither meets the goal; faster")
    )
    choice = {"chosen": chosen, "why": why, "search_latency_ms": ms, "goal_met": met}
    found, search, tuner, chosen_base = runs[chosen]
    found.reason = f"engine {chosen} ({why}; search p50 ms {ms}). {found.reason}"
    return found, search, tuner, chosen_base, choice


def _chosen_result(
    found: AutoQuantResult, search: Any, tuner: _Tuner, base: Any, prep: Any, refs: dict[str, Any]
) -> Any:
    """The chosen candidate quantized for good (a Result), its search recorded in the sidecar."""
    from ptopt.compress import quant_engine as engine
    from ptopt.compress.quant_steps import quantize_prepared

    best = found.best
    final = search.config(best.scheme_key, best.float_layers)
    if best.smooth:
        with engine.quantize_context(base.backend):
            prep = dataclasses.replace(prep, module=tuner.smoothed(final, best.smooth).eval())
    res = quantize_prepared(final, prep, refs, progress=False)
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


def _logger(progress: bool) -> Callable[[str], None]:
    if not progress:
        return lambda msg: None
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return lambda msg: console.print(f"[dim]autoquant:[/dim] {msg}")
