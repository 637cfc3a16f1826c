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
   a short timing's noise here, the one with fewer float multiply-accumulates). When none holds, the most accurate candidate is written,
   the layers that break the budget are named, and the result says so (the CLI exits 1).

Errors, measured against the fp32 model on the same samples:

- **accuracy drop** (points) = 100 × (top-1 accuracy of fp32 − top-1 accuracy of int8), with labels;
- **cosine**: cosine similarity between the flattened fp32 and int8 outputs of each sample; the goal
  ``min_cosine`` holds when the *minimum* over the samples reaches it (the mean is reported too).

Quantization itself goes through the techniques of ``ptopt.compress.quantize_static`` /
``quantize_dynamic`` (and so through ``quant_engine``): a candidate is just their config with
``float_modules``, ``per_channel`` and ``observer`` set.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any, Callable

from ptopt.compress.quantize import _rebatch
from ptopt.core.config import Config, register_config
from ptopt.core.errors import GateFailedError, UsageError

#: sensitivity: quantize each layer alone, or leave each layer float while the rest is quantized
SENSITIVITY_METHODS = ("alone", "float")
DEFAULT_TRIALS = 24
#: two latencies within this fraction are a tie, broken by fewer float multiply-accumulates: a short
#: timing on a shared CPU is good to ~10% (measured: the same candidate ±15% between searches), and
#: fewer float MACs is the better bet within that
LATENCY_TIE = 0.10
EVAL_BATCH = 64


@register_config
@dataclasses.dataclass(frozen=True)
class AccuracyGoal(Config):
    """What accuracy-aware quantization must keep, and how long it may search.

    ``max_accuracy_drop``: points of top-1 accuracy (needs labels); ``min_cosine``: minimum per-sample
    cosine similarity of the int8 outputs to the fp32 outputs. Both may be given (both must hold).
    ``trials`` / ``seconds``: tuning budget (candidates evaluated / wall time including sensitivity).
    """

    type_name = "accuracy-goal"
    max_accuracy_drop: float | None = None
    min_cosine: float | None = None
    trials: int | None = None
    seconds: float | None = None
    sensitivity: str = "alone"
    latency_batch_size: int = 32
    sensitivity_samples: int = 256

    def __post_init__(self) -> None:
        if self.max_accuracy_drop is not None and not self.max_accuracy_drop >= 0:
            raise UsageError(f"--max-accuracy-drop must be >= 0 points, got {self.max_accuracy_drop}")
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise UsageError(f"--min-cosine must be in [-1, 1], got {self.min_cosine}")
        if self.sensitivity not in SENSITIVITY_METHODS:
            raise UsageError(f"unknown sensitivity method {self.sensitivity!r} (known: {', '.join(SENSITIVITY_METHODS)})")
        if self.trials is not None and self.trials < 1:
            raise UsageError(f"--tuning-budget must allow at least 1 trial, got {self.trials}")
        if self.seconds is not None and self.seconds <= 0:
            raise UsageError(f"--tuning-budget must be a positive time, got {self.seconds}s")
        if self.latency_batch_size < 1 or self.sensitivity_samples < 1:
            raise UsageError("latency_batch_size and sensitivity_samples must be >= 1")

    @property
    def has_target(self) -> bool:
        return self.max_accuracy_drop is not None or self.min_cosine is not None

    def describe(self) -> str:
        parts = []
        if self.max_accuracy_drop is not None:
            parts.append(f"accuracy drop <= {self.max_accuracy_drop} points")
        if self.min_cosine is not None:
            parts.append(f"min cosine >= {self.min_cosine}")
        return " and ".join(parts) or "no target"


def parse_tuning_budget(text: "str | int | None") -> tuple[int | None, float | None]:
    """``"40"`` → 40 trials; ``"60s"`` / ``"2m"`` / ``"1h"`` → seconds. None → the default trials."""
    if text is None or text == "":
        return DEFAULT_TRIALS, None
    if isinstance(text, int):
        return text, None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", str(text).lower())
    if not m:
        raise UsageError(f"--tuning-budget {text!r}: give a number of trials (e.g. 30) or a time (90s, 5m)")
    value, unit = float(m.group(1)), m.group(2)
    if unit is None:
        if value != int(value):
            raise UsageError(f"--tuning-budget {text!r}: a number of trials is a whole number")
        return int(value), None
    return None, value * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}[unit]


# -- measurements --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Measurement:
    """int8 vs fp32 on the eval samples (see the module docstring for the definitions)."""

    samples: int
    min_cosine: float
    mean_cosine: float
    accuracy: float | None = None
    accuracy_drop: float | None = None

    def holds(self, goal: AccuracyGoal) -> bool:
        ok = True
        if goal.max_accuracy_drop is not None:
            ok &= self.accuracy_drop is not None and self.accuracy_drop <= goal.max_accuracy_drop + 1e-9
        if goal.min_cosine is not None:
            ok &= self.min_cosine >= goal.min_cosine
        return ok

    def error(self, by_accuracy: bool) -> tuple[float, float]:
        """Sort key, smaller is better: accuracy drop (or 1 − min cosine), then 1 − mean cosine."""
        first = self.accuracy_drop if by_accuracy and self.accuracy_drop is not None else 1.0 - self.min_cosine
        return (round(first, 9), round(1.0 - self.mean_cosine, 9))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Candidate:
    """One configuration tried by the search."""

    index: int
    per_channel: bool
    observer: str | None
    float_layers: tuple[str, ...]
    measurement: Measurement
    latency_ms: float
    holds: bool
    step: str
    seconds: float
    float_params: int = 0
    #: SmoothQuant alpha of the int8 Linears (dynamic mode), None: not smoothed
    smooth: float | None = None
    #: share of the tuned layers' multiply-accumulates that stays float (expected price in speed)
    float_macs: float = 0.0

    @property
    def scheme_key(self) -> tuple:
        return (self.per_channel, self.observer, self.smooth)

    @property
    def scheme(self) -> str:
        s = "per-channel" if self.per_channel else "per-tensor"
        s = f"{s}, {self.observer}" if self.observer else s
        return f"{s}, smoothed (alpha {self.smooth})" if self.smooth else s

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["float_layers"] = list(self.float_layers)
        d["scheme"] = self.scheme
        return d


@dataclasses.dataclass
class AutoQuantResult:
    """What the search found. ``artifact`` is None for ``analyze`` (nothing written)."""

    goal: AccuracyGoal
    mode: str
    fp32: dict[str, Any]
    sensitivity: list[dict[str, Any]]
    candidates: list[Candidate] = dataclasses.field(default_factory=list)
    chosen: int | None = None
    met: bool = False
    reason: str = ""
    breaking_layers: list[str] = dataclasses.field(default_factory=list)
    budget_exhausted: bool = False
    seconds: float = 0.0
    artifact: Any = None

    @property
    def best(self) -> Candidate | None:
        return None if self.chosen is None else self.candidates[self.chosen]

    def to_dict(self) -> dict[str, Any]:
        return {"goal": self.goal.to_dict(), "mode": self.mode, "met": self.met, "reason": self.reason,
                "chosen": self.chosen, "breaking_layers": self.breaking_layers,
                "budget_exhausted": self.budget_exhausted, "seconds": round(self.seconds, 2),
                "trials": len(self.candidates), "fp32": self.fp32, "sensitivity": self.sensitivity,
                "candidates": [c.to_dict() for c in self.candidates],
                "definitions": {"accuracy_drop": "100 x (fp32 top-1 - int8 top-1), points",
                                "cosine": "per-sample cosine of flattened int8 vs fp32 outputs; min and mean"}}

    def raise_if_missed(self) -> None:
        """GateFailedError (exit 1) when no candidate met the goal (the best one is already written)."""
        if not self.met and self.goal.has_target and self.artifact is not None:
            err = GateFailedError(self.reason)
            err.result = self  # type: ignore[attr-defined]
            raise err

    # -- tables (rich) -----------------------------------------------------------------------------
    def sensitivity_table(self, limit: int | None = None):
        from rich.table import Table

        how = "quantized alone" if self.goal.sensitivity == "alone" else "left float, rest int8"
        t = Table(title=f"Layer sensitivity ({how}; most sensitive first)",
                  caption="MACs: share of the tuned layers' multiply-accumulates; breaks: fails the goal alone")
        labels = any(r.get("accuracy_drop") is not None for r in self.sensitivity)
        for col in ("#", "layer", "type", "MACs") + (("drop",) if labels else ()) + ("min cos", "mean cos"):
            t.add_column(col, justify="left" if col in ("layer", "type") else "right",
                         overflow="fold" if col == "layer" else "ellipsis", no_wrap=col != "layer")
        if self.goal.has_target:
            t.add_column("breaks" if self.goal.sensitivity == "alone" else "saves", justify="right", no_wrap=True)
        for i, r in enumerate(self.sensitivity[:limit]):
            row = [str(i + 1), r["layer"], r["type"], f"{100 * r.get('macs_share', 0):.1f}%"]
            if labels:
                row.append(_fmt(r.get("accuracy_drop"), "{:+.2f}"))
            row += [f"{r['min_cosine']:.5f}", f"{r['mean_cosine']:.5f}"]
            if self.goal.has_target:
                row.append(("yes" if r.get("breaks_budget") else "") if self.goal.sensitivity == "alone"
                           else f"{r.get('saves', 0):.5f}")
            t.add_row(*row)
        return t

    def candidates_table(self):
        from rich.table import Table

        t = Table(title=f"Candidates tried (goal: {self.goal.describe()})",
                  caption="top k: the k most sensitive layers float (per MAC: sensitivity per multiply-"
                          "accumulate); -L: L int8 again; pc/pt: per-channel/per-tensor weights; sqA: "
                          "SmoothQuant alpha A; *: written; "
                          f"ms: p50 at batch {self.fp32.get('latency_batch_size')}, relative to fp32 timed "
                          "alongside, in fp32 ms")
        labels = any(c.measurement.accuracy_drop is not None for c in self.candidates) and \
            (self.goal.max_accuracy_drop is not None or not self.goal.has_target)
        cols = ["#", "step", "scheme", "float layers", "fl. MACs"] + (["drop"] if labels else []) + \
            ["min cos", "ms", "speedup", "holds"]
        for col in cols:
            left = col in ("step", "scheme", "float layers")
            t.add_column(col, justify="left" if left else "right", no_wrap=col != "float layers",
                         overflow="fold" if col == "float layers" else "ellipsis",
                         min_width=12 if col == "float layers" else None)
        fp32_ms = self.fp32.get("latency_ms")
        for c in self.candidates:
            mark = "yes" if c.holds else "no"
            if self.chosen == c.index:
                mark += " *"
            names = ", ".join(c.float_layers) if len(c.float_layers) <= 2 else \
                f"{c.float_layers[0]} +{len(c.float_layers) - 1}"
            scheme = ("pc" if c.per_channel else "pt") + (f" {c.observer}" if c.observer else "") + \
                (f" sq{c.smooth}" if c.smooth else "")
            row = [str(c.index + 1), c.step, scheme, names or "-", f"{100 * c.float_macs:.1f}%"]
            if labels:
                row.append(_fmt(c.measurement.accuracy_drop, "{:+.2f}"))
            row += [f"{c.measurement.min_cosine:.5f}", f"{c.latency_ms:.2f}",
                    f"{fp32_ms / c.latency_ms:.2f}x" if fp32_ms and c.latency_ms else "-", mark]
            t.add_row(*row)
        return t


def _fmt(v: Any, f: str) -> str:
    return "-" if v is None else f.format(v)


# -- the search -------------------------------------------------------------------------------------

class _Tuner:
    """Quantizes candidates through the technique functions, measures them against cached fp32 outputs."""

    def __init__(self, module: Any, base: Any, calib: Any, evald: Any, example: Any, goal: AccuracyGoal,
                 threads: int | None, log: Callable[[str], None]):
        import torch

        self.module, self.base, self.calib, self.example, self.goal = module, base, calib, example, goal
        self.log, self.threads = log, threads
        self.eval = evald
        self.by_accuracy = goal.max_accuracy_drop is not None or (not goal.has_target and evald.has_labels)
        self.sens_eval = evald.take(goal.sensitivity_samples) if len(evald) > goal.sensitivity_samples else evald
        self.started = time.perf_counter()
        with torch.no_grad():
            self.ref = self._outputs(module, evald)
        self.fp32_acc = self._accuracy(self.ref, evald)
        self.latency_x = _rebatch(evald.first_batch(min(len(evald), goal.latency_batch_size)).x,
                                  goal.latency_batch_size)
        self.fp32_latency = self.latency(module)
        self.params = {n: sum(p.numel() for p in m.parameters()) for n, m in module.named_modules() if n}
        self.types = {n: type(m).__name__ for n, m in module.named_modules() if n}
        self.cost = self._macs(module, example)
        self.layers: list[str] = []
        self._absmax: dict[str, Any] | None = None

    @staticmethod
    def _macs(module: Any, example: Any) -> dict[str, float]:
        """Multiply-accumulates per sample of each weighted layer (weights × output positions), the
        expected price of keeping it float."""
        import torch

        from ptopt.core.inputspec import batch_size_of, call_model

        out: dict[str, float] = {}
        hooks = []
        for name, m in module.named_modules():
            w = getattr(m, "weight", None) if not isinstance(m, torch.nn.RNNBase) else getattr(m, "weight_ih_l0", None)
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
        if smooth:
            from ptopt.compress.quantize_dynamic import quantize_dynamic

            return quantize_dynamic(self.smoothed(config, smooth), config).module
        if config.mode == "static":
            from ptopt.compress.quantize_static import quantize_static

            return quantize_static(self.module, config, self.calib, self.example, progress=False).module
        from ptopt.compress.quantize_dynamic import quantize_dynamic

        return quantize_dynamic(self.module, config).module

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
        return smoothquant.smooth(self.module, self._absmax, alpha, [n for n in self.smoothable if n not in floats])

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

        with torch.no_grad(), _threads(self.threads):
            outs = self._outputs(model, ds)
        ref = torch.cat(self.ref)[: len(ds)]
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
        with torch.no_grad(), _threads(self.threads):
            if model is self.module:
                return measure_latency(lambda: call_model(model, x), batch_size=self.goal.latency_batch_size,
                                       min_iters=5, min_seconds=1.0, warmup_iters=2, warmup_seconds=0.0)["p50_ms"]
            fns = {"fp32": lambda: call_model(self.module, x), "candidate": lambda: call_model(model, x)}
            st = measure_interleaved(fns, rounds=3, min_iters=6, min_seconds=0.3, warmup_iters=2, warmup_seconds=0.0)
        return st["candidate"]["p50_ms"] / st["fp32"]["p50_ms"] * self.fp32_latency

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    # layers and sensitivity ----------------------------------------------------------------------------
    def quantizable_layers(self) -> list[str]:
        """Layers the base scheme turns int8 (user-excluded ones are not candidates)."""
        from ptopt.compress import quant_engine as engine

        q = self.quantize(self.base)
        out = []
        for name, m in self.module.named_modules():
            if not name or not any(True for _ in m.parameters(recurse=False)):
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
            row = {"layer": name, "type": self.types.get(name, "?"), "params": self.params.get(name, 0),
                   "macs_share": round(self.cost.get(name, 0.0) / total, 4), **m.to_dict()}
            if self.goal.sensitivity == "alone":
                row["breaks_budget"] = self.goal.has_target and not m.holds(self.goal)
                row["_key"] = m.error(self.by_accuracy)
            else:
                fe, me = full.error(self.by_accuracy), m.error(self.by_accuracy)
                row["saves"] = round(fe[0] - me[0], 9)
                row["_key"] = (fe[0] - me[0], fe[1] - me[1])
            rows.append(row)
            self.log(f"sensitivity {i + 1}/{len(layers)}: {name}  min cos {m.min_cosine:.5f}"
                     + (f"  drop {m.accuracy_drop:+.2f}" if m.accuracy_drop is not None else ""))
        rows.sort(key=lambda r: r["_key"], reverse=True)
        for r in rows:
            r.pop("_key")
        return rows


def _layer_err(r: dict[str, Any], by_accuracy: bool) -> float:
    """The error a layer causes (method "alone") or saves ("float"), as one number."""
    if "saves" in r:
        return max(float(r["saves"]), 0.0)
    err = 1.0 - r["min_cosine"]
    if by_accuracy and r.get("accuracy_drop") is not None:
        err = max(r["accuracy_drop"], 0.0) + (1.0 - r["mean_cosine"])
    return err


def _as_matrix(y: Any) -> Any:
    """Model output → N × features float tensor (tuples/dicts of tensors are concatenated)."""
    import torch

    if isinstance(y, dict):
        y = list(y.values())
    if isinstance(y, (tuple, list)):
        ts = [t for t in y if isinstance(t, torch.Tensor)]
        return torch.cat([t.reshape(t.shape[0], -1).float() for t in ts], dim=1)
    return y.reshape(y.shape[0], -1).float()




class _threads:
    def __init__(self, n: int | None):
        self.n = n

    def __enter__(self):
        import torch

        self.prev = torch.get_num_threads()
        if self.n:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.prev)
        return False


#: SmoothQuant strengths tried on dynamic int8 Linears (0.5 is the paper's default for W8A8 per-tensor;
#: per-channel int8 weights absorb more of the activation range, so stronger migration pays off)
SMOOTH_ALPHAS = (0.75, 0.6)


def _schemes(base: Any, smoothable: bool = False) -> list[tuple[bool, str | None, float | None]]:
    """(per_channel, observer, smoothing alpha) triples, the user's own first."""
    pcs = [base.per_channel, not base.per_channel]
    if base.mode != "static":
        alphas = (None,) + (SMOOTH_ALPHAS if smoothable else ())
        return [(pc, None, a) for a in alphas for pc in pcs]
    obs = [base.observer] + [o for o in ("histogram", "minmax", "percentile") if o != base.observer]
    return [(pc, o, None) for pc in pcs for o in obs]


class _Search:
    def __init__(self, tuner: _Tuner, layers: list[str], sens: list[dict[str, Any]], goal: AccuracyGoal):
        self.t, self.layers, self.sens, self.goal = tuner, layers, sens, goal
        self.ranked = [r["layer"] for r in sens]
        self.candidates: list[Candidate] = []
        self.seen: dict[tuple, Candidate] = {}
        self.exhausted = False

    def budget_left(self) -> bool:
        if not self.candidates:
            return True  # always an answer: the first candidate is tried whatever the budget
        if self.goal.trials is not None and len(self.candidates) >= self.goal.trials:
            self.exhausted = True
        if self.goal.seconds is not None and self.t.elapsed() >= self.goal.seconds:
            self.exhausted = True
        return not self.exhausted

    def config(self, scheme: tuple, floats: tuple[str, ...]) -> Any:
        pc, obs, _ = scheme
        changes: dict[str, Any] = {"per_channel": pc, "float_modules": tuple(self.t.base.float_modules) + floats}
        if obs is not None:
            changes["observer"] = obs
        return self.t.base.replace(**changes)

    def try_(self, scheme: tuple, floats: "tuple[str, ...] | list[str]", step: str) -> Candidate | None:
        floats = tuple(n for n in self.ranked if n in set(floats))
        key = (scheme, frozenset(floats))
        if key in self.seen:
            return self.seen[key]
        if not self.budget_left():
            return None
        t0 = time.perf_counter()
        q = self.t.quantize(self.config(scheme, floats), smooth=scheme[2])
        m = self.t.measure(q, self.t.eval)
        lat = self.t.latency(q)
        c = Candidate(len(self.candidates), scheme[0], scheme[1], floats, m, round(lat, 4), m.holds(self.goal), step,
                      round(time.perf_counter() - t0, 2), sum(self.t.params.get(n, 0) for n in floats),
                      scheme[2], round(self.float_share(floats), 4))
        self.candidates.append(c)
        self.seen[key] = c
        self.t.log(f"candidate {c.index + 1} ({step}): {c.scheme}, {len(floats)} float  min cos "
                   f"{m.min_cosine:.5f}" + (f"  drop {m.accuracy_drop:+.2f}" if m.accuracy_drop is not None else "")
                   + f"  {lat:.2f} ms  {'holds' if c.holds else 'fails'}")
        return c

    def float_share(self, floats: "tuple[str, ...] | list[str]") -> float:
        total = sum(self.t.cost.get(n, 0.0) for n in self.layers) or 1.0
        return sum(self.t.cost.get(n, 0.0) for n in floats) / total

    def holding(self) -> list[Candidate]:
        return [c for c in self.candidates if c.holds]

    def run(self) -> None:
        schemes = _schemes(self.t.base, bool(self.t.smoothable))
        first = self.try_(schemes[0], (), "all int8")
        if first is None:
            return
        if not first.holds:
            # one change at a time from the user's scheme: the other weight granularity, the other observers
            for s in schemes[1:]:
                if sum(a != b for a, b in zip(s, schemes[0])) == 1:
                    self.try_(s, (), "all int8")
        tried0 = [c for c in self.candidates if not c.float_layers]
        best_scheme = min(tried0, key=lambda c: c.measurement.error(self.t.by_accuracy))
        scheme = best_scheme.scheme_key
        if not self.holding():
            self.ladder(scheme)
        if not self.holding() and scheme != schemes[0] and not self.exhausted:
            self.ladder(schemes[0])  # the ranking was measured with the user's scheme
        if not self.holding():
            return
        self.refine()

    def ladder(self, scheme: tuple, order: list[str] | None = None, what: str = "",
               lo: int = 0) -> None:
        """Smallest k (the first k of ``order`` float) that holds: doubling, then bisection."""
        order = self.ranked if order is None else order
        n_max = max(len(order) - 1, 0)  # at least one layer stays int8
        k, hi = max(1, lo), None
        while k <= n_max and hi is None:
            c = self.try_(scheme, order[:k], f"top {k}{what}")
            if c is None:
                return
            if c.holds:
                hi = k
            else:
                lo = k
                if k == n_max:
                    break
                k = min(k * 2, n_max)
        if hi is None:
            return
        while hi - lo > 1:
            mid = (lo + hi) // 2
            c = self.try_(scheme, order[:mid], f"top {mid}{what}")
            if c is None:
                return
            if c.holds:
                hi = mid
            else:
                lo = mid

    def refine(self) -> None:
        """Look for a faster candidate that holds: the sensitivity per float cost as a second ladder,
        fewer float layers (least sensitive dropped first), then the other schemes."""
        best = min(self.holding(), key=lambda c: (c.float_macs, c.latency_ms))
        scheme = best.scheme_key
        if best.float_layers:
            cheap = self.by_efficiency()
            if cheap[: len(best.float_layers)] != list(best.float_layers):
                self.ladder(scheme, cheap, " per MAC")
                if self.exhausted:
                    return
            best = min(self.holding(), key=lambda c: (c.float_macs, c.latency_ms))
        scheme, floats = best.scheme_key, list(best.float_layers)
        for name in reversed(list(floats)):  # least sensitive first
            trial = [n for n in floats if n != name]
            c = self.try_(scheme, trial, f"-{name}")
            if c is None:
                return
            if c.holds:
                floats = trial
        for s in _schemes(self.t.base, bool(self.t.smoothable)):
            if s != scheme and self.try_(s, floats, "scheme") is None:
                return

    def by_efficiency(self) -> list[str]:
        """Layers by error saved per multiply-accumulate kept float (greedy knapsack order)."""
        err = {r["layer"]: _layer_err(r, self.t.by_accuracy) for r in self.sens}
        return sorted(self.ranked, key=lambda n: err.get(n, 0.0) / max(self.t.cost.get(n, 1.0), 1.0), reverse=True)

    def choose(self) -> int | None:
        if not self.candidates:
            return None
        ok = self.holding()
        if ok:
            fastest = min(c.latency_ms for c in ok)
            near = [c for c in ok if c.latency_ms <= fastest * (1 + LATENCY_TIE)]
            return min(near, key=lambda c: (c.float_macs, c.latency_ms)).index
        return min(self.candidates, key=lambda c: (c.measurement.error(self.t.by_accuracy), c.latency_ms)).index


def autoquantize(model: Any, mode: str, output: "str | os.PathLike | None", *, eval_data: Any,
                 calib_data: Any = None, max_accuracy_drop: float | None = None, min_cosine: float | None = None,
                 tuning_budget: "str | int | None" = None, analyze: bool = False, sensitivity: str = "alone",
                 latency_batch_size: int = 32, sensitivity_samples: int = 256, threads: int | None = None,
                 backend: str = "x86", observer: str | None = None, per_channel: bool = True,
                 calibration_batches: int | None = None, batch_size: int | None = None, exclude: Any = (),
                 layers: Any = None, input_shapes: Any = (), weights: Any = None, allow_pickle: bool = False,
                 progress: bool = True) -> AutoQuantResult:
    """Accuracy-aware int8 (see the module docstring); writes ``output`` unless ``analyze``.

    Returns an :class:`AutoQuantResult` (``.artifact``, ``.candidates``, ``.sensitivity``, ``.met``);
    when no candidate meets the goal the most accurate one is still written and ``.met`` is False
    (``result.raise_if_missed()`` raises GateFailedError, exit code 1).
    """
    from pathlib import Path

    from ptopt.compress.quantize import _check_fits, _data, _quantize_context, _settle_inputs, make_config, quantize
    from ptopt.core.modelref import as_loaded

    trials, seconds = parse_tuning_budget(tuning_budget)
    goal = AccuracyGoal(max_accuracy_drop, min_cosine, trials, seconds, sensitivity, latency_batch_size,
                        sensitivity_samples)
    if mode not in ("static", "dynamic"):
        raise UsageError(f"accuracy-aware quantization searches --mode static or dynamic, not {mode!r} "
                         "(QAT trains instead of searching)")
    if not goal.has_target and not analyze:
        raise UsageError("give --max-accuracy-drop PTS (labelled eval data) or --min-cosine C, or --analyze")
    if eval_data is None:
        raise UsageError("accuracy-aware quantization measures on --eval-data DATA (e.g. builtin:digits32:test)")
    if not analyze:
        if output is None:
            raise UsageError("missing -o/--output for the quantized model (or use --analyze to write nothing)")
        if Path(output).is_dir():
            raise UsageError(f"output {output} is a folder; give a file name such as model.int8.pt")
    if mode == "static" and calib_data is None:
        raise UsageError("static quantization needs calibration data: pass --calib-data DATA "
                         "(e.g. builtin:digits32:train), or use --mode dynamic")
    opts: dict[str, Any] = {"backend": backend, "per_channel": per_channel, "float_modules": tuple(exclude or ())}
    if mode == "static":
        opts |= {"observer": observer, "calibration_batches": calibration_batches, "batch_size": batch_size}
    else:
        if observer is not None:
            raise UsageError("--observer applies to static quantization (dynamic mode observes every batch)")
        opts |= {"layers": tuple(layers) if layers else None}
    base = make_config(mode, **opts)

    evald = _data(eval_data, "evaluation", finite=True)
    if goal.max_accuracy_drop is not None:
        evald.require_labels("--max-accuracy-drop (use --min-cosine to compare outputs without labels)")
    calib = _data(calib_data, "calibration", finite=True)
    loaded = as_loaded(model, weights, allow_pickle)
    module = loaded.require_module("quantization")
    if loaded.format in ("torchscript", "exported_program"):
        from ptopt.core.errors import UnsupportedModelError

        raise UnsupportedModelError(f"{loaded.ref} is a {loaded.format} model; quantization needs the eager "
                                    "nn.Module (pkg.module:factory --weights W, a zoo:NAME, or --allow-pickle)")
    from ptopt.compress import quant_engine as engine

    engine.check_backend(base.backend)
    if base.float_modules:
        engine.check_module_names(module, base.float_modules)
    example = _settle_inputs(loaded, calib or evald, input_shapes)
    if calib is not None:
        _check_fits(loaded, evald)

    log = _logger(progress)
    with _quantize_context(base):
        tuner = _Tuner(module, base, calib, evald, example, goal, threads, log)
        names = tuner.quantizable_layers()
        if not names:
            from ptopt.core.errors import UnsupportedModelError

            raise UnsupportedModelError(f"{loaded.ref}: no layer becomes int8 in --mode {mode}; nothing to tune")
        sens = tuner.sensitivity(names)
        fp32 = {"accuracy": tuner.fp32_acc, "latency_ms": round(tuner.fp32_latency, 4),
                "latency_batch_size": goal.latency_batch_size, "eval_samples": len(evald),
                "sensitivity_samples": len(tuner.sens_eval), "threads": threads}
        result = AutoQuantResult(goal, mode, fp32, sens)
        if analyze:
            result.seconds = tuner.elapsed()
            return result
        search = _Search(tuner, names, sens, goal)
        search.run()
        result.candidates, result.chosen = search.candidates, search.choose()
        result.budget_exhausted = search.exhausted
        result.met = bool(search.holding())
    best = result.best
    assert best is not None  # the first candidate is always tried
    result.reason = _explain(result, names)
    result.seconds = tuner.elapsed()
    final = search.config(best.scheme_key, best.float_layers)
    if best.smooth:
        with _quantize_context(base):
            loaded = dataclasses.replace(loaded, module=tuner.smoothed(final, best.smooth).eval())
    # the fused attention fast path reads linear1.weight, which a SmoothedLinear wrapper does not have
    with engine.mha_fastpath_disabled():
        art = quantize(loaded, mode, output, config=final, calib_data=calib_data, eval_data=eval_data,
                       input_shapes=input_shapes, progress=False)
    art.config["accuracy_goal"] = goal.to_dict()
    art.extra["autoquant"] = result.to_dict()
    if best.smooth:
        art.extra["smoothquant"] = {"alpha": best.smooth, "layers": [n for n in tuner.smoothable
                                                                    if n not in best.float_layers],
                                    "calibrated_on": len(tuner.sens_eval)}
        art.extra.get("onnx_quantization", {})["note"] = (
            "re-quantizes the fp32 parent without SmoothQuant: accuracy differs from this artifact")
    art.metrics |= {"min_cosine": best.measurement.min_cosine, "mean_cosine": best.measurement.mean_cosine,
                    "goal_met": result.met, "search_latency_ms": best.latency_ms,
                    "fp32_search_latency_ms": fp32["latency_ms"]}
    result.artifact = art.finalize()
    return result


def _explain(result: AutoQuantResult, names: list[str]) -> str:
    best = result.best
    assert best is not None
    m = best.measurement
    got = ", ".join(x for x in (
        f"drop {m.accuracy_drop:.2f} points" if m.accuracy_drop is not None else "",
        f"min cosine {m.min_cosine:.5f}") if x)
    if result.met:
        return (f"candidate {best.index + 1} ({best.scheme}, {len(best.float_layers)} float layer(s)) meets "
                f"{result.goal.describe()}: {got}")
    breaking = [r["layer"] for r in result.sensitivity if r.get("breaks_budget")]
    result.breaking_layers = breaking
    msg = f"no candidate meets {result.goal.describe()}; wrote the most accurate one found ({got}, " \
          f"{len(best.float_layers)} float layer(s))"
    if breaking:
        shown = ", ".join(_layer_error(r) for r in result.sensitivity if r["layer"] in breaking[:5])
        more = f" and {len(breaking) - 5} more" if len(breaking) > 5 else ""
        msg += f". Quantized alone, these layers already break the budget: {shown}{more}"
    else:
        top = ", ".join(_layer_error(r) for r in result.sensitivity[:3])
        msg += f". No single layer breaks it alone; together the int8 layers do (most sensitive: {top})"
    if result.budget_exhausted:
        g = result.goal
        msg += f". The tuning budget ran out ({g.trials} trials)" if g.trials else \
            f". The tuning budget ran out ({g.seconds:g}s)"
        msg += "; a larger --tuning-budget may find one"
    return msg


def _layer_error(r: dict[str, Any]) -> str:
    if r.get("accuracy_drop") is not None:
        return f"{r['layer']} (drop {r['accuracy_drop']:.2f}, min cos {r['min_cosine']:.6f})"
    return f"{r['layer']} (min cos {r['min_cosine']:.6f})"


def _logger(progress: bool) -> Callable[[str], None]:
    if not progress:
        return lambda msg: None
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return lambda msg: console.print(f"[dim]autoquant:[/dim] {msg}")
