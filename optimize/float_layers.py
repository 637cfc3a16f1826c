"""``int8-openvino-float-layers``: NNCF's int8 with the layers that cost the most kept float, found cheaply.

NNCF's own accuracy control (``int8-openvino-search``) ranks the quantized ops by reverting each one and
recompiling the IR, one compile and validation per op: on all-MiniLM-L6-v2 it ran 19 minutes on 2 busy
cores, and the IR it returned failed the export's parity check (worst cosine 0.12). This candidate ranks
the model's Linear / Conv layers in PyTorch instead (``sensitivity``): each layer alone fake-quantized the
way NNCF quantizes it (int8 weights per output channel, int8 activations per tensor over the calibration
range), the outputs' mean deviation 1 - cos measured on the search's samples. Then NNCF quantizes the IR
with the k highest-ranked layers float (``export --exclude``, an ``nncf.IgnoredScope``), k found by a few
NNCF builds (doubling from 2, then halving the gap) judged by optimize's own rule on the search's samples:
the worst cosine projected to 1000 samples (``ptopt.core.tail``), aiming one standard error of it inside
the budget, or the top-1 drop, aiming at half the allowed drop. The held-out half accepts or rejects the
result like every candidate's.

On all-MiniLM-L6-v2 at 0.98 (2 busy cores, 119 s): the ranking put the feed-forward output layers of
blocks 0-3 first; 2 float projected 0.977 on the search's sentences, 3 0.983 (short of the 0.983 aimed
at), 4 0.985; held out: 0.983 projected (measured worst 0.991), where plain NNCF int8 projects to 0.972;
1.47x the speed of OpenVINO's bf16 at batch 64.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: NNCF builds the search for k makes at most (each a few seconds to a minute)
MAX_TRIALS = 5
_EVAL_BATCH = 64


def layer_kinds() -> tuple[type, ...]:
    """The layers whose int8 error is ranked: what NNCF quantizes with weights."""
    from torch import nn

    return (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


class OutOfTime(Exception):
    """The ranking stopped: at the pace of the layers ranked so far, the rest would not fit the time left."""


def sensitivity(
    module: Any,
    calib: Any,
    data: Any,
    units: dict[str, list[str]] | None = None,
    outputs: bool = False,
    seconds_left: Any = None,
) -> list[tuple[str, float]]:
    """(name, mean deviation 1 - cos of the outputs on ``data``) of each Linear / Conv layer of ``module``
    fake-quantized alone to int8, most harmful first (``ptopt.core.search.rank``). ``units``: rank groups
    of layers instead (a block's name -> the layers in it, fake-quantized together); ``outputs``: round each
    layer's output to int8 too (graph-mode int8 quantizes what a layer writes as well as what it reads).
    ``seconds_left``: a callable; OutOfTime as soon as the layers still to rank, at the pace so far, would
    not fit in what it returns (mobilenet_v3_small's 54 layers took 150 s of a 3-minute budget)."""
    return Simulated(module, calib, data, units, outputs).ranked(seconds_left)


class Simulated:
    """``module`` with some of its ``units`` fake-quantized to int8 (weights per output channel, inputs,
    and with ``outputs`` what they write, per tensor over their calibration range), its outputs on ``data``
    against fp32's: what ``sensitivity`` ranks with, and what ``--engine auto`` predicts a float set with
    (one forward pass each, no int8 model built)."""

    def __init__(
        self,
        module: Any,
        calib: Any,
        data: Any,
        units: dict[str, list[str]] | None = None,
        outputs: bool = False,
    ):
        layers = [(n, m) for n, m in module.named_modules() if isinstance(m, layer_kinds())]
        self.module, self.data, self.outputs = module, data, outputs
        self.ranges = _ranges(module, layers, calib)
        self.units = units if units is not None else {n: [n] for n, _ in layers}
        self.ref = _outputs(module, data)

    def cosines(self, int8_units: list[str]) -> Any:
        """Each sample's output cosine with fp32 when ``int8_units`` are fake-quantized (the rest float)."""
        from ptopt.validate.metrics import per_sample_cosine

        with contextlib.ExitStack() as stack:
            for member in (m for u in int8_units for m in self.units[u]):
                amax, out_amax = self.ranges.get(member, (0.0, 0.0))
                layer = self.module.get_submodule(member)
                stack.enter_context(_fake_int8(layer, amax, out_amax if self.outputs else None))
            out = _outputs(self.module, self.data)
        return per_sample_cosine(self.ref, out)

    def ranked(self, seconds_left: Any = None) -> list[tuple[str, float]]:
        import torch

        from ptopt.core.search import rank

        t0, done = time.perf_counter(), [0]

        def deviation(name: str) -> float:
            if seconds_left is not None and done[0]:
                pace = (time.perf_counter() - t0) / done[0]
                rest = pace * (len(self.units) - done[0])
                if rest > seconds_left():
                    raise OutOfTime(
                        f"ranking {len(self.units)} layers stopped after {done[0]} ({time.perf_counter() - t0:.0f} s): "
                        f"the other {len(self.units) - done[0]} need about {rest:.0f} s, {max(seconds_left(), 0):.0f} s left"
                    )
            dev = (1.0 - self.cosines([name])).clamp(min=0.0)
            done[0] += 1
            return float(dev.mean()) if torch.isfinite(dev).all() else math.inf

        return rank(list(self.units), deviation, lambda dev: dev)


def _outputs(module: Any, data: Any) -> Any:
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.formats.runner import primary_output
    from ptopt.validate.metrics import real_tokens_only

    outs = []
    with torch.inference_mode():
        for b in data.batches(_EVAL_BATCH):
            y = real_tokens_only(primary_output(call_model(module, b.x)).float(), b.x)
            outs.append(y.reshape(len(y), -1))
    return torch.cat(outs)


def _ranges(module: Any, layers: list[tuple[str, Any]], calib: Any) -> dict[str, tuple[float, float]]:
    """The largest |input| and |output| each layer sees on the calibration data (its per-tensor int8
    ranges)."""
    ranges: dict[str, tuple[float, float]] = {}
    hooks = []
    for name, layer in layers:

        def hook(mod: Any, args: Any, out: Any, name: str = name) -> None:
            seen = ranges.get(name, (0.0, 0.0))
            y = out if hasattr(out, "abs") else args[0]
            ranges[name] = (
                max(seen[0], float(args[0].detach().abs().max())),
                max(seen[1], float(y.detach().abs().max())),
            )

        hooks.append(layer.register_forward_hook(hook))
    try:
        _outputs(module, calib)
    finally:
        for h in hooks:
            h.remove()
    return ranges


def _rounded(x: Any, amax: float) -> Any:
    """``x`` rounded to int8 steps over [-amax, amax] (per tensor)."""
    step = max(amax, 1e-12) / 127.0
    return ((x / step).round().clamp(-128, 127) * step).to(x.dtype)


@contextlib.contextmanager
def _fake_int8(layer: Any, amax: float, out_amax: float | None = None) -> Iterator[None]:
    """``layer`` computing with int8-rounded weights (per output channel) and inputs (per tensor), and
    with ``out_amax`` its output rounded too."""
    import torch

    weight = layer.weight.data
    flat = weight.reshape(weight.shape[0], -1)
    scale = flat.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
    layer.weight.data = ((flat / scale).round().clamp(-127, 127) * scale).reshape(weight.shape)
    handles = [layer.register_forward_pre_hook(lambda mod, args: (_rounded(args[0], amax), *args[1:]))]
    if out_amax is not None:
        handles.append(layer.register_forward_hook(lambda mod, args, out: _rounded(out, out_amax)))
    try:
        with torch.inference_mode():
            yield
    finally:
        for h in handles:
            h.remove()
        layer.weight.data = weight


class Trials:
    """NNCF int8 of one fp32 IR with a set of layers float, judged on the search's samples."""

    def __init__(self, ctx: Any, select: Any):
        from ptopt.export.api import export
        from ptopt.formats.openvino import read_ir

        self.ctx, self.select = ctx, select
        fp32 = ctx.built.get("fp32-openvino") or export(
            ctx.module, "openvino", data=ctx.calib, input_shapes=ctx.input_shapes or None
        )
        self.dir = Path(tempfile.mkdtemp(prefix="ptopt-float-layers-"))
        fp32.save(self.dir / "fp32.xml")
        self.ir = read_ir(self.dir / "fp32.xml")
        self.ref = _outputs(ctx.module, select)
        self.goal = _goal(ctx, len(select))
        self.seconds: list[float] = []

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def holds(self, float_modules: list[str]) -> tuple[bool, str]:
        """NNCF int8 with ``float_modules`` float meets the goal on the search's samples (and its figure)."""
        import torch

        from ptopt.core.tail import project_worst_cosine
        from ptopt.formats.openvino import HINT_KEY, _feed, compile_ir, ignored_scope, quantize_ir
        from ptopt.validate.metrics import per_sample_cosine, real_tokens_only

        t0 = time.perf_counter()
        ignored = ignored_scope(self.ir, self.ctx.module, float_modules)
        q, _ = quantize_ir(self.ir.clone(), self.ctx.calib, None, ignored)
        q.set_rt_info("int8", list(HINT_KEY))  # compiled as the int8 artifact is (its float ops in f32)
        compiled = compile_ir(q, torch.get_num_threads())
        names, outs = [p.get_any_name() for p in q.inputs], []
        for b in self.select.batches(_EVAL_BATCH):
            y = real_tokens_only(
                torch.from_numpy(compiled(_feed(b.x, names))[compiled.outputs[0]].copy()).float(), b.x
            )
            outs.append(y.reshape(y.shape[0], -1))
        out = torch.cat(outs)
        self.seconds.append(time.perf_counter() - t0)
        if self.ctx.max_accuracy_drop is not None:
            y = self.select.y
            drop = 100.0 * float(
                (self.ref.argmax(-1) == y).float().mean() - (out.argmax(-1) == y).float().mean()
            )
            return drop <= self.goal, f"top-1 drop {drop:.2f} pts"
        est = project_worst_cosine(per_sample_cosine(self.ref, out))
        return (
            est.projected >= self.goal,
            f"worst cosine projected to {est.reference} samples {est.projected:.4f}",
        )


def _goal(ctx: Any, n: int) -> float:
    """What a trial must hold on the ``n`` search samples: the budget less one standard error of the
    projected worst cosine (1/sqrt(n) of the allowed deviation), or half the allowed top-1 drop."""
    if ctx.max_accuracy_drop is not None:
        return ctx.max_accuracy_drop / 2
    return 1 - (1 - ctx.min_cosine) / (1 + 1 / math.sqrt(max(n, 1)))


def fewest_float_layers(
    trials: Trials, ranked: list[str], seconds_left: Any, max_trials: int = MAX_TRIALS, start: int = 2
) -> tuple[int | None, list[str]]:
    """The fewest of the ``ranked`` layers (most harmful first) to keep float so that the trial holds
    (``ptopt.core.search.ladder``: k doubles from ``start`` until one holds, then the gap to the last that
    did not is halved), within ``max_trials`` builds and the time left; (k or None, what each trial
    measured)."""
    from ptopt.core.search import ladder

    tried: list[int] = []
    log: list[str] = []

    def attempt(k: int) -> bool:
        ok, figure = trials.holds(ranked[:k])
        tried.append(k)
        log.append(f"{k} float: {figure}{'' if ok else ' (misses)'}")
        return ok

    def room() -> bool:
        per = max(trials.seconds, default=0.0)
        return len(tried) < max_trials and seconds_left() > 2 * per

    return ladder(attempt, len(ranked), start=min(start, len(ranked)), floor=0, room=room), log
