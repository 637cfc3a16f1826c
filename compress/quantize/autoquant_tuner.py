"""Accuracy-aware quantization: the tuner, which quantizes candidates through the technique table
(each row's ``candidate``: the eager int8 module alone), measures them against cached fp32 outputs
and times them (see ``ptopt.compress.quantize.autoquant``). Also what the fx rows' advice asks of
it: the fewest float layers that make an int8 model hold (:func:`float_layers_that_hold`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from ptopt.compress.quantize.autoquant_result import AccuracyGoal, Measurement
from ptopt.compress.quantize.base import Prepared
from ptopt.compress.quantize.measure import layer_macs
from ptopt.compress.quantize.registry import TECHNIQUES
from ptopt.core.data import rebatch
from ptopt.core.search import rank
from ptopt.core.timing import torch_threads

EVAL_BATCH = 64
#: seconds the fp32 model is timed (once), and each candidate's interleaved timing beside it (all rounds)
FP32_TIMING_SECONDS = 1.0
CANDIDATE_TIMING_SECONDS = 0.3


class Tuner:
    """Quantizes candidates of ``prep``'s model through the technique table, measures them on
    ``evald`` against cached fp32 outputs."""

    def __init__(
        self,
        prep: Prepared,
        base: Any,
        evald: Any,
        goal: AccuracyGoal,
        threads: int | None,
        log: Callable[[str], None],
    ):
        import torch

        module = prep.module
        self.prep, self.module, self.base, self.goal = prep, module, base, goal
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
        self.cost = layer_macs(module, prep.example)
        self.layers: list[str] = []
        self._absmax: dict[str, Any] | None = None

    @functools.cached_property
    def fp32_latency(self) -> float:
        """p50 ms of the fp32 model (timed on first use: a sensitivity ranking alone needs no timing)."""
        return self.latency(self.module)

    # quantize / measure ---------------------------------------------------------------------------
    def quantize(self, config: Any, smooth: float | None = None) -> Any:
        """The eager int8 module of ``config`` (its row's ``candidate``; pt2e: the converted q/dq
        graph, measured eagerly, timed compiled), of the model smoothed first with ``smooth``."""
        src = (
            self.prep if not smooth else dataclasses.replace(self.prep, module=self.smoothed(config, smooth))
        )
        return TECHNIQUES[(config.mode, config.engine)].candidate(config, src)

    @property
    def smoothable(self) -> list[str]:
        """Quantizable Linears (dynamic mode): SmoothQuant candidates."""
        import torch

        if self.base.mode != "dynamic":
            return []
        return [n for n in self.layers if isinstance(self.module.get_submodule(n), torch.nn.Linear)]

    def smoothed(self, config: Any, alpha: float) -> Any:
        """The fp32 model with its int8-bound Linears smoothed (float layers stay as they are)."""
        from ptopt.compress.quantize import smoothquant

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

    def measure(self, model: Any, ds: Any, ref_outputs: list[Any] | None = None) -> Measurement:
        """``model`` against the fp32 model on ``ds`` (the search's data, whose fp32 outputs are
        kept; for other data, such as the held-out samples, give ``ref_outputs``). The worst cosine is
        also projected to 1000 samples (``ptopt.core.tail``): a ``min_cosine`` goal is held to that."""
        import torch

        from ptopt.core.tail import project_worst_cosine

        ref = torch.cat(self.ref if ref_outputs is None else ref_outputs)[: len(ds)]
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
        projected = project_worst_cosine(cos).projected
        return Measurement(int(len(got)), float(cos.min()), float(cos.mean()), acc, drop, projected)

    def fp32_outputs(self, ds: Any) -> list[Any]:
        """The fp32 model's outputs on ``ds`` (samples the search never saw: the held-out split)."""
        import torch

        with torch.no_grad(), torch_threads(self.threads):
            return self._outputs(self.module, ds)

    def measure_unseen(self, model: Any, ds: Any) -> Measurement:
        """``model`` against the fp32 model on samples the search never saw (the held-out split)."""
        return self.measure(model, ds, self.fp32_outputs(ds))

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
                    min_seconds=FP32_TIMING_SECONDS,
                    warmup_iters=2,
                    warmup_seconds=0.0,
                )["p50_ms"]
            fns = {"fp32": lambda: call_model(self.module, x), "candidate": lambda: call_model(model, x)}
            st = measure_interleaved(
                fns,
                rounds=3,
                min_iters=6,
                min_seconds=CANDIDATE_TIMING_SECONDS,
                warmup_iters=2,
                warmup_seconds=0.0,
            )
        return st["candidate"]["p50_ms"] / st["fp32"]["p50_ms"] * self.fp32_latency

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    # layers and sensitivity ----------------------------------------------------------------------------
    def quantizable_layers(self) -> list[str]:
        """Layers the base scheme turns int8 (user-excluded ones are not candidates, and neither
        are embeddings: weight-only int8 rows cost no accuracy to speak of and no time)."""
        import torch

        from ptopt.compress.quantize.engine_fx import is_quantized_module

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
            if is_quantized_module(qm):
                out.append(name)
        self.layers = out
        return out

    def sensitivity(self, layers: list[str]) -> list[dict[str, Any]]:
        """Each layer quantized alone (``goal.sensitivity == "alone"``: the others float) or left float
        while the rest is int8 (``"float"``), measured and ranked most harmful first
        (``ptopt.core.search.rank``); one row per layer."""
        base_float = tuple(self.base.float_modules)
        total = sum(self.cost.get(n, 0.0) for n in layers) or 1.0
        alone = self.goal.sensitivity == "alone"
        full = None if alone else self.measure(self.quantize(self.base), self.sens_eval)
        done = iter(range(1, len(layers) + 1))

        def measure(name: str) -> tuple[dict[str, Any], Any]:
            floats = base_float + (tuple(n for n in layers if n != name) if alone else (name,))
            m = self.measure(self.quantize(self.base.replace(float_modules=floats)), self.sens_eval)
            row = {"layer": name, "type": self.types.get(name, "?"), "params": self.params.get(name, 0),
                   "macs_share": round(self.cost.get(name, 0.0) / total, 4), **m.to_dict()}  # fmt: skip
            if alone:
                row["breaks_budget"] = self.goal.has_target and not m.holds(self.goal)
                key = m.error(self.by_accuracy)
            else:
                fe, me = full.error(self.by_accuracy), m.error(self.by_accuracy)
                row["saves"] = round(fe[0] - me[0], 9)
                key = (fe[0] - me[0], fe[1] - me[1])
            self.log(
                f"sensitivity {next(done)}/{len(layers)}: {name}  min cos {m.min_cosine:.5f}"
                + (f"  drop {m.accuracy_drop:+.2f}" if m.accuracy_drop is not None else "")
            )
            return row, key

        return [row for _, (row, _) in rank(layers, measure, lambda measured: measured[1])]


def _compiled_int8(converted: Any, x: Any) -> Any:
    """A PT2E candidate the way it is deployed: Inductor with freezing (int8 kernels from its
    lowering; the q/dq graph run eagerly is slower than fp32), compiled here by one call at ``x``'s
    (fixed) batch, so the timing that follows measures no compilation."""
    import torch
    from torch._inductor import config as inductor_config

    from ptopt.compress.quantize.pt2e_package import int8_conv_layout
    from ptopt.core.inputspec import call_model
    from ptopt.core.quiet import silenced

    compiled = torch.compile(converted)
    with inductor_config.patch(freezing=True), int8_conv_layout(), silenced(("torch._inductor", "torchao")):
        for _ in range(3):  # the first call compiles; the next ones settle (constants, allocations)
            call_model(compiled, x)
    return compiled


#: a sensitivity ranking quantizes every layer once: past this many layers, only the search is suggested
MAX_RANKED_LAYERS = 48


def float_layers_that_hold(prep: Any, config: Any, data: Any, max_float: int = 8) -> Any:
    """The layers to keep in float so that ``config``'s int8 model holds export's parity rule against
    the fp32 model on ``data`` (``ptopt.compress.fidelity``): the layers ranked by sensitivity, most
    sensitive first (:func:`_ranked_for_advice`); the fewest of them that hold (``ptopt.core.search.ladder``,
    up to ``max_float``), then as few as hold (``drop_unneeded``). The most allowed float is built first:
    when it misses, the advice is none, for one int8 build instead of a ladder of them (more float is
    usually, not always, closer: a smaller set that holds where the largest misses is not looked for).
    Returns ``(layers, fidelity record)``, or None when no quantizable layer can be ranked or ``max_float``
    float layers are not enough."""
    from ptopt.compress.fidelity import INT8_VS_FP32, measure_fidelity
    from ptopt.compress.quantize.engine_fx import quantize_context
    from ptopt.core import progress
    from ptopt.core.search import drop_unneeded, ladder

    goal = AccuracyGoal(min_cosine=0.0, sensitivity_samples=max(len(data), 1), latency_batch_size=1)
    ranking: list[Any] = []  # the open step the ranking advances, one layer per log line
    with quantize_context(config.backend):
        tuner = Tuner(prep, config, data, goal, None, lambda msg: [s.advance() for s in ranking])
        names = tuner.quantizable_layers()
        if not names or len(names) > MAX_RANKED_LAYERS:
            return None
        with progress.step("ranking layers by int8 sensitivity", len(names), "layers", announce=False) as st:
            ranking.append(st)
            ranked = _ranked_for_advice(tuner, prep, config, names, data)
        ranking.clear()
        progress.note(
            f"  ranked {len(ranked)} layers by int8 sensitivity; most sensitive: {', '.join(ranked[:3])}"
        )
        records: dict[tuple[str, ...], Any] = {}

        def holds(floats: list[str], *_: Any) -> bool:
            if tuple(floats) not in records:
                candidate = config.replace(float_modules=tuple(config.float_modules) + tuple(floats))
                try:
                    records[tuple(floats)] = measure_fidelity(
                        prep.module, tuner.quantize(candidate), data, **INT8_VS_FP32
                    )
                except (RuntimeError, NotImplementedError):  # a float/int8 mix graph mode cannot run
                    records[tuple(floats)] = None
                rec = records[tuple(floats)]
                said = f"min cosine {rec['min_cosine']:.4f}" if rec else "does not run"
                progress.note(
                    f"  {len(floats)} float ({', '.join(floats[:3])}{', ...' if len(floats) > 3 else ''}): {said}"
                )
            return bool(records[tuple(floats)] and records[tuple(floats)]["passed"])

        most = min(max_float, len(ranked) - 1)
        if most < 1 or not holds(ranked[:most]):
            return None
        k = ladder(lambda k: holds(ranked[:k]), most)
        floats = drop_unneeded(ranked[:k], holds)
        return floats, records[tuple(floats)]


def _ranked_for_advice(tuner: Tuner, prep: Any, config: Any, names: list[str], data: Any) -> list[str]:
    """``names`` most harmful in int8 first. Static int8: its Linear / Conv layers simulated, each alone
    fake-quantized as graph mode does (``ptopt.optimize.float_layers.Simulated``, what ``--engine auto``
    ranks with: one forward pass per layer, no int8 model built), then the layers the simulation does not
    model (a LayerNorm...) in the model's order: tried float only when the ranked ones are not enough.
    Otherwise each layer quantized alone by the engine (``Tuner.sensitivity``: one int8 build per layer)."""
    from ptopt.optimize.float_layers import Simulated, layer_kinds

    simulated = [n for n in names if isinstance(tuner.module.get_submodule(n), layer_kinds())]
    if config.mode != "static" or prep.calib is None or not len(prep.calib) or not simulated:
        return [row["layer"] for row in tuner.sensitivity(names)]
    sim = Simulated(prep.module, prep.calib, data, {n: [n] for n in simulated}, outputs=True)
    return [name for name, _ in sim.ranked()] + [n for n in names if n not in simulated]


def _as_matrix(y: Any) -> Any:
    """Model output → N × features float tensor (tuples/dicts of tensors are concatenated)."""
    import torch

    if isinstance(y, dict):
        y = list(y.values())
    if isinstance(y, (tuple, list)):
        ts = [t for t in y if isinstance(t, torch.Tensor)]
        return torch.cat([t.reshape(t.shape[0], -1).float() for t in ts], dim=1)
    return y.reshape(y.shape[0], -1).float()
