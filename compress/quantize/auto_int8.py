"""Static int8 that gets an artifact: ``--mode static --engine auto``.

The engines are tried in order (``CHAIN``: torch.fx, then torchao's PT2E on torch.export's graph, then
NNCF's int8 of the OpenVINO IR: an ``.xml`` artifact, run by OpenVINO instead of torch; an output named
``.xml`` asks for that engine alone, ``writing``).
An engine that cannot take the model (fx cannot trace it, torch.export cannot capture it, its
calibration or its artifact fails inside torch) drops out, saying why. On the first engine that
takes it, the whole-model int8 is judged by the int8 fidelity rule (``ptopt.compress.fidelity``);
when it misses, the parts whose int8 costs the most are kept float until it holds:

1. **ranked**: each Linear / Conv layer fake-quantized alone (int8 weights per channel, int8 inputs
   and outputs over their calibration range), the outputs' mean deviation from fp32 on ``RANK_SAMPLES``
   of the calibration data (``ptopt.optimize.float_layers.Simulated``: one forward pass per unit);
2. **predicted**: the same simulation with all but the k highest-ranked fake-quantized, k bisected: the
   fewest with which it holds, and the most float ``MIN_STATIC_SHARE`` allows (no build);
3. **kept float**: the engine's real int8 model (its ``candidate``: no artifact built) with the predicted
   k float, k doubling up to the most allowed until one holds, then the gap halved, within
   ``MAX_BUILDS``; each judged on the calibration data and then on the evaluation data it
   never fitted. Every build after an engine's first reuses its calibration (``observed``);
4. **blocks**: when no k of single layers holds (fx quantizes the functional ops between layers,
   ``x + y``, ``x * s``, whatever the layers around them), the same over blocks: the children of
   the model's ``Sequential`` / ``ModuleList`` containers, each kept float whole (not traced into).

The first engine where one holds writes the artifact (float modules named in ``float_layers`` with
why); when none holds, one refusal names what each engine reached (UnsupportedModelError, exit 2).
A set of float layers leaving under ``MIN_STATIC_SHARE`` of the parameters int8 does not count:
that file would be fp32's size and speed.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ptopt.compress.quantize.base import Prepared, Quantized
from ptopt.compress.quantize.config import MIN_STATIC_SHARE
from ptopt.core.errors import clip

#: the engines auto tries, in order: the torch engines first (their artifacts run in torch), then
#: OpenVINO's (random-weight MobileViT-S, worst-sample cosine: PT2E's best 0.975 with 48 of 72 layers
#: float; NNCF 0.951 whole, 1.000 with 32 float, on 64 evaluation samples)
CHAIN = ("fx", "pt2e", "openvino")
#: the format each engine writes, by the output suffix that asks for it alone (``writing``)
ONLY_FOR_SUFFIX = {".xml": "openvino"}
#: engines whose artifact costs little more than their int8 model (tracing, no compiling): their whole
#: model is built as the artifact and judged as written, so a model that holds is made once
ARTIFACT_FIRST = ("fx", "openvino")
#: what each engine keeps float, in the order tried: torch.fx quantizes the functional ops between
#: layers (``x + y``, ``x * s``) whatever their layers, so single float layers rarely make it hold
#: (ResNet-18, Swin: the blocks did); PT2E quantizes convolutions and linear layers only
LEVELS = {"fx": ("blocks",), "pt2e": ("layers", "blocks"), "openvino": ("layers",)}
#: int8 models the float search builds per engine and granularity (layers, blocks): the simulated
#: prediction first, then the most float the share allows, then halving the gap
MAX_BUILDS = 4
#: seconds the float search may take over all engines (a build already started finishes)
SEARCH_SECONDS = 600.0
#: the share of ``SEARCH_SECONDS`` the torch engines' searches may use before OpenVINO's is started (its
#: whole model and search get the rest: on MobileViT-S the PT2E search alone ran past 400 s at load 5, and
#: OpenVINO needed its own ladder: 32 of 72 layers float held where 12 missed)
TORCH_SHARE = 0.6
#: a float set the search keeps must hold the int8 rule on the acceptance data with this share of the
#: rule's allowed deviation to spare (0.25: a worst-sample cosine >= 0.9925 where the rule asks 0.99).
#: The ladder builds up to ``MAX_BUILDS`` sets and keeps the first that holds: the one kept is the one
#: its samples flattered (BERT on PT2E: 1 float layer held at 0.9918 on --eval-data, 0.9873 on 64 unseen
#: samples). The whole model is one trial, picked from none: it needs the rule only. When no set tried
#: has the headroom, the fewest float that held the rule is kept
HEADROOM = 0.25
#: samples of the search data the sensitivity ranking and the simulated int8 run on (one forward pass
#: each per unit / per prediction: the ranking's order, not the rule's verdict, is what they give)
RANK_SAMPLES = 16
#: what a refusal adds when the artifact written misses the rule the search's model held
ADVICE = (
    " (--engine auto's search held the rule with the int8 model it measured, its artifact does not: "
    "name the engine, --engine fx or --engine pt2e, with --exclude MODULE for the layers to keep float)"
)


@dataclasses.dataclass
class Attempt:
    """What one engine reached: ``floats`` (the float modules that make it hold) or why not."""

    engine: str
    holds: bool = False
    floats: tuple[str, ...] = ()
    figure: str = ""
    why: str = ""
    best: tuple[float, str] = (-2.0, "")
    log: list[str] = dataclasses.field(default_factory=list)
    ranked: list[str] = dataclasses.field(default_factory=list)
    cfg: Any = None
    trials: Any = None
    #: the whole-model int8's figure
    whole: str = ""
    #: why the engine could not take the model, as it said it
    error: BaseException | None = None
    #: what changed in the artifact the engine writes (its package fell back to its ExportedProgram)
    note: str = ""
    #: why no cosine can hold: the fp32 outputs vanish (``export.parity.vanishing``)
    vanish: str = ""

    def record(self) -> dict[str, Any]:
        out = {"engine": self.engine, "holds": self.holds, "trials": self.log}
        if self.holds:
            out |= {"float_modules": list(self.floats), "figure": self.figure}
        else:
            out |= {"why": self.why, "best": self.best[1]}
        return out


def first_that_holds(config: Any, prep: Prepared, progress: bool) -> Quantized:
    """The int8 artifact of the first engine of ``CHAIN`` whose whole-model int8 holds the int8 rule;
    else of the first where the fewest float modules found make it hold; UnsupportedModelError naming
    what each reached otherwise. The torch engines (whole, then searched) come before the others: a
    torch artifact with float layers before another runtime's file."""
    log = _logger(progress)
    data = _data(prep)
    deadline = time.perf_counter() + SEARCH_SECONDS
    attempts: list[Attempt] = []
    rankings: dict[str, Any] = {}
    tiers = _tiers()
    for n, tier in enumerate(tiers):
        share = TORCH_SHARE if n < len(tiers) - 1 else 1.0
        left = lambda share=share: deadline - (1.0 - share) * SEARCH_SECONDS - time.perf_counter()  # noqa: E731
        tried = []
        for engine in tier:  # the next engine's whole model only when this one's misses
            att = _whole(engine, config, prep, data, log, progress)
            attempts.append(att)
            tried.append(att)
            made = (att.trials.made or _built(att, prep, data, progress, log)) if att.holds else None
            if made is not None:
                return _described(made, att, attempts, data)
        for att in (a for a in tried if a.trials is not None):
            _search(att, prep, data, rankings, left, log)
            made = _built(att, prep, data, progress, log) if att.holds else None
            if made is not None:
                return _described(made, att, attempts, data)
    raise _nothing_holds(attempts)


#: the engine an output's suffix asks for alone (``writing``), None: every engine of ``CHAIN``
_ONLY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ptopt_auto_int8_only", default=None)


@contextlib.contextmanager
def writing(output: Any) -> Iterator[None]:
    """Within it ``--engine auto`` tries only the engine whose format ``output``'s suffix names (``.xml``:
    openvino, ``ONLY_FOR_SUFFIX``); a torch suffix (``.pt``, ``.pt2``) or none leaves the whole chain."""
    suffix = Path(output).suffix.lower() if output is not None else ""
    token = _ONLY.set(ONLY_FOR_SUFFIX.get(suffix))
    try:
        yield
    finally:
        _ONLY.reset(token)


def _tiers() -> list[tuple[str, ...]]:
    """``CHAIN`` in tiers (the torch engines, then each other runtime's), or the one engine asked for."""
    only = _ONLY.get()
    if only is not None:
        return [(only,)]
    torch_engines = tuple(e for e in CHAIN if e not in ONLY_FOR_SUFFIX.values())
    return [torch_engines, *((e,) for e in CHAIN if e not in torch_engines)]


def _whole(
    engine: str, config: Any, prep: Prepared, data: tuple[Any, Any], log: Any, progress: bool
) -> Attempt:
    """``engine``'s whole-model int8, judged; an engine that cannot take the model says why
    (``progress``: the calibration's progress of an ``ARTIFACT_FIRST`` engine's artifact)."""
    from ptopt.core.errors import UsageError

    att = Attempt(engine)
    try:  # fx has no --no-compile or fixed-batch models of its own; pt2e makes x86 per-channel int8 only
        fixed = config.static_batches if engine == "pt2e" else ()
        att.cfg = config.replace(
            engine=engine, compile=config.compile or engine != "pt2e", static_batches=fixed
        )
    except UsageError as e:
        att.why = f"{engine}: {e}"
        return att
    from ptopt.compress.quantize.registry import choosing

    trials = _Trials(engine, att.cfg, prep, data, att, log)
    trials.progress = progress
    try:
        with choosing():  # the next engine is tried here, not named in this one's refusal
            ok, figure = trials.holds([])
    except Exception as e:  # noqa: BLE001 - fx cannot trace / torch.export cannot capture / calibration fails in torch
        att.why, att.error = _cannot(engine, e), e
        log(att.why)
        return att
    log(f"{engine}: whole model int8: {figure}{'' if ok else ' (misses the int8 rule)'}")
    att.trials, att.holds, att.figure, att.whole = trials, ok, figure, figure.split(": ", 1)[-1]
    return att


def _search(
    att: Attempt, prep: Prepared, data: tuple[Any, Any], rankings: dict[str, Any],
    seconds_left: Callable[[], float], log: Any,
) -> None:  # fmt: skip
    """The fewest float units (layers, then blocks) that make ``att``'s engine hold, ranked once for all
    engines (``rankings``: level -> (ranked names, their ``Simulated``)). An engine after one whose search
    missed starts its ladder no lower than the most float that one built (``missed:LEVEL``): MobileViT-S's
    PT2E missed with 12 and 48 of 72 layers float, and OpenVINO's search, with the time left after the
    torch engines for one build at load 5, spent it on the 12 the simulation predicted (0.974, missed)."""
    tried: list[dict[str, list[str]]] = []
    for level, units in _granularities(prep.module, att.cfg.float_modules):
        if seconds_left() <= 0 or len(units) < 2 or level not in LEVELS[att.engine] or units in tried:
            continue
        tried.append(units)
        if level not in rankings:
            rankings[level] = _ranked(prep, units, data[0])
        ranked, sim = rankings[level]
        most = _most_float(att.trials, ranked)
        start = _predicted(sim, ranked, most)
        log(
            f"{att.engine}: {len(units)} {level} ranked by int8 sensitivity; simulated int8 holds with the "
            f"worst {start} float (at most {most} float: {100 * MIN_STATIC_SHARE:.0f}% of the parameters int8)"
            if start is not None
            else f"{att.engine}: {len(units)} {level} ranked by int8 sensitivity; simulated int8 holds with none "
            f"of up to {most} float (that many tried)"
        )
        first = max(start if start is not None else most, min(rankings.get(f"missed:{level}", 0), most))
        if start is not None and first > start:
            log(f"{att.engine}: starts at {first} float, the most an earlier engine built without holding")
        k = _fewest(att.trials, ranked, first, most, seconds_left)
        if k is not None:
            att.holds, att.floats, att.ranked = True, tuple(ranked[:k]), ranked
            att.figure = att.trials.figures[tuple(ranked[:k])]
            return
        built = [len(f) for f in att.trials.figures if f and list(f) == ranked[: len(f)]]
        rankings[f"missed:{level}"] = max([rankings.get(f"missed:{level}", 0), *built])
    if att.trials.figures.keys() - {()}:
        att.why = f"{att.engine}: no set of float layers tried holds the int8 rule"
    elif seconds_left() <= 0:
        att.why = (
            f"{att.engine}: the search's time ({SEARCH_SECONDS:.0f} s over all engines, the torch engines "
            f"{100 * TORCH_SHARE:.0f}% of it when others follow) ran out before a set of float layers was built"
        )
    else:  # one unit, or any unit kept float leaves less int8 than MIN_STATIC_SHARE
        att.why = (
            f"{att.engine}: no set of float layers to try (keeping any float would leave under "
            f"{100 * MIN_STATIC_SHARE:.0f}% of the parameters int8)"
        )


def _most_float(trials: _Trials, ranked: list[str]) -> int:
    """The most of ``ranked`` that can be kept float with ``MIN_STATIC_SHARE`` of the parameters int8."""
    base = tuple(trials.cfg.float_modules)
    k = 0
    while k < len(ranked) and _int8_share(trials.params, base + tuple(ranked[: k + 1])) >= MIN_STATIC_SHARE:
        k += 1
    return k


def _predicted(sim: Any, ranked: list[str], most: int) -> int | None:
    """The fewest of ``ranked`` kept float (at most ``most``) with which the simulated int8 (the rest
    fake-quantized) holds the int8 minimum cosine on the ranking's samples; None when ``most`` does not."""
    from ptopt.export.parity import min_cosine_for

    goal = min_cosine_for("int8", None)

    def holds(k: int) -> bool:
        return float(sim.cosines(ranked[k:]).min()) >= goal

    if most < 1 or not holds(most):
        return None
    lo, hi = 0, most  # the whole model missed for real
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    return hi


def _fewest(
    trials: _Trials, ranked: list[str], start: int, most: int, seconds_left: Callable[[], float]
) -> int | None:
    """The fewest of ``ranked`` kept float with which the engine's int8 model holds: ``start`` (the
    simulation's answer) first, doubling up to ``most`` until one holds, then the gap to the largest
    that missed halved (``ptopt.core.search.ladder``), within ``MAX_BUILDS``. Not "the most allowed
    second": more float is not always closer (ResNet-18 on fx: the predicted 3 and the allowed 8 worst
    blocks float both missed, so that search refused where an earlier ladder found 5 blocks that hold)."""
    from ptopt.core.search import ladder

    builds: list[int] = []

    def holds(k: int) -> bool:
        builds.append(k)
        return trials.holds(ranked[:k])[0]

    # the prediction, once ranked, is built whatever the time left: an answer. The next build must fit
    # twice in the time left, judged by the builds after the engine's first (the whole model): that one
    # also captured or converted the model (MobileViT-S on OpenVINO at load 5: 176 s for the whole model
    # with its IR conversion, 29 s for the next build)
    def room() -> bool:
        return not builds or (
            len(builds) < MAX_BUILDS
            and seconds_left() > 2 * max(trials.seconds[1:] or trials.seconds or [0.0])
        )

    if most < 1:
        return None
    k = ladder(holds, most, start=min(max(start, 1), most), floor=0, room=room)
    if k is None:  # none with the headroom: the fewest that held the rule
        k = min((n for n in builds if tuple(ranked[:n]) in trials.plain), default=None)
    return k


def _built(att: Attempt, prep: Prepared, data: tuple[Any, Any], progress: bool, log: Any) -> Quantized | None:
    """``att``'s int8 artifact (its engine's handler), judged again as written (a traced file can differ
    from the model it was traced from); None when building it fails inside torch or it misses."""
    from ptopt.compress.fidelity import INT8_VS_FP32, measure_fidelity
    from ptopt.compress.quantize.measure import check_data
    from ptopt.compress.quantize.registry import TECHNIQUES

    final = att.cfg.replace(float_modules=tuple(att.cfg.float_modules) + att.floats)
    try:
        made = TECHNIQUES[("static", att.engine)].handler(final, prep, progress)
        with made.context():
            fid = measure_fidelity(prep.module, made.model, check_data(prep), **INT8_VS_FP32)
    except Exception as e:  # noqa: BLE001 - the engine's artifact failing inside torch: its limit, the next engine is tried
        att.holds, att.why = False, f"{att.engine}: its int8 artifact fails ({_first_line(e)})"
        log(att.why)
        if att.engine != "pt2e" or not final.compile or final.static_batches:
            return None
        # the package failed to compile (as LeViT's did before engine_pt2e._tolerate_symbolic_expand): the
        # int8 graph that held is still an artifact, as --no-compile writes it
        att.cfg, att.holds = att.cfg.replace(compile=False), True
        att.note = (
            f"its AOTInductor package fails ({clip(_first_line(e), 160)}): written as the int8 ExportedProgram "
            "(--no-compile; run it with torch.compile)"
        )
        log(f"{att.engine}: {att.note}")
        return _built(att, prep, data, progress, log)
    made.metrics["vs_fp32"] = fid  # what the flow records (measured once)
    if not fid["passed"]:
        att.holds = False
        att.why = (
            f"{att.engine}: its {made.format} artifact misses the int8 rule (min cosine {fid['min_cosine']:.4f} "
            f"on {fid['data']}) where the int8 model it was made from held"
        )
        log(att.why)
        return None
    return made


class _Trials:
    """One engine's int8 model with some modules float, judged by the int8 rule on the search data,
    then on the acceptance data (the evaluation data, never fitted on), within ``MIN_STATIC_SHARE``."""

    def __init__(self, engine: str, cfg: Any, prep: Prepared, data: tuple[Any, Any], att: Attempt, log: Any):
        from ptopt.compress.quantize.registry import TECHNIQUES

        self.log = log
        self.row, self.cfg, self.prep, self.data, self.att = (
            TECHNIQUES[("static", engine)],
            cfg,
            prep,
            data,
            att,
        )
        self.seconds: list[float] = []
        self.figures: dict[tuple[str, ...], str] = {}
        self.params = _own_params(prep.module)
        #: the whole model's artifact, when it was built first (``ARTIFACT_FIRST``)
        self.made: Quantized | None = None
        #: what the observers saw in the first calibration, reused by the trials after it (``observed``)
        self.observers: dict[str, Any] = {}
        #: whether the artifact built first shows its calibration's progress
        self.progress = False
        #: the float sets that held the rule without the search's ``HEADROOM``
        self.plain: set[tuple[str, ...]] = set()

    def holds(self, floats: list[str]) -> tuple[bool, str]:
        """Whether the engine's int8 model with ``floats`` float holds the rule (and its figure); the
        whole model of an ``ARTIFACT_FIRST`` engine is built as its artifact and judged as written."""
        from ptopt.export.parity import vanishing

        t0 = time.perf_counter()
        share = _int8_share(self.params, tuple(self.cfg.float_modules) + tuple(floats))
        if floats and share < MIN_STATIC_SHARE:
            self.seconds.append(0.0)
            return self._note(
                floats, False, f"{len(floats)} float: only {100 * share:.1f}% of the parameters int8"
            )
        cfg = self.cfg.replace(float_modules=tuple(self.cfg.float_modules) + tuple(floats))
        try:
            fids = self._measured(cfg, bool(floats))
        except Exception as e:  # noqa: BLE001 - a float/int8 mix the engine cannot run is a failed trial
            if not floats:
                raise
            self.seconds.append(time.perf_counter() - t0)
            return self._note(
                floats, False, f"{len(floats)} float: does not run ({clip(_first_line(e), 120)})"
            )
        self.seconds.append(time.perf_counter() - t0)
        ok = all(f["passed"] for f in fids)
        if not floats and not ok:
            self.att.vanish = vanishing(min(f.get("max_abs_ref", 1.0) for f in fids)) or ""
        # the search and the acceptance data the same samples (--eval-data the calibration data): said once
        said = [f"min cosine {f['min_cosine']:.4f} on {f['samples']} samples of {f['data']}" for f in fids]
        figure = "; ".join(dict.fromkeys(said))
        if ok and floats and fids[-1]["min_cosine"] < spared():
            ok = False
            self.plain.add(tuple(floats))
            figure += f" (holds the rule, not the search's headroom: {spared():.4f})"
        if fids[-1]["min_cosine"] > self.att.best[0]:
            self.att.best = (fids[-1]["min_cosine"], f"{len(floats)} float: {figure}")
        return self._note(floats, ok, f"{len(floats)} float: {figure}")

    def _measured(self, cfg: Any, search: bool) -> list[dict[str, Any]]:
        """A candidate of the search (``search``: some float): the int8 rule's record on the search data,
        then (when it holds there) the acceptance data. The whole model: on what the flow checks an int8
        model on (``measure.check_data``: the evaluation data, else the calibration data; when it is the
        artifact built first, the flow takes that record as is), then, when that was the evaluation data,
        on the search data too (up to 256 calibration samples, ranges fitted on them, so a miss there is
        a miss): ResNet-18 (random weights, PT2E, 512 calibration samples) held at 0.9909 on its 64 eval
        samples, reached 0.9783 on 256 calibration samples and 0.982-0.988 on six unseen draws of 64."""
        from ptopt.compress.fidelity import INT8_VS_FP32, measure_fidelity
        from ptopt.compress.quantize import observed
        from ptopt.compress.quantize.engine_fx import quantize_context
        from ptopt.compress.quantize.measure import check_data

        with quantize_context(cfg.backend), observed.reused(self.observers):
            if self.row.engine in ARTIFACT_FIRST and not self.figures:  # the whole model, first
                self.made = self.row.handler(cfg, self.prep, self.progress)
                q = self.made.model
            else:
                q = self.row.candidate(cfg, self.prep)
            if not search:
                fids = [measure_fidelity(self.prep.module, q, check_data(self.prep), **INT8_VS_FP32)]
                if self.made is not None and q is self.made.model:
                    self.made.metrics["vs_fp32"] = fids[0]
                if fids[0]["passed"] and self.data[1] is not None:  # and on the search data, as a float set
                    fids.append(measure_fidelity(self.prep.module, q, self.data[0], **INT8_VS_FP32))
                return fids
            fids = [measure_fidelity(self.prep.module, q, self.data[0], **INT8_VS_FP32)]
            if fids[0]["passed"] and self.data[1] is not None:
                fids.append(measure_fidelity(self.prep.module, q, self.data[1], **INT8_VS_FP32))
        return fids

    def _note(self, floats: list[str], ok: bool, figure: str) -> tuple[bool, str]:
        self.figures[tuple(floats)] = figure
        self.att.log.append(figure + ("" if ok else " (misses)"))
        if floats:
            self.log(f"{self.att.engine}: {figure}{'' if ok else ' (misses)'}: {', '.join(floats[:6])}"
                     + (f" and {len(floats) - 6} more" if len(floats) > 6 else ""))  # fmt: skip
        return ok, figure


def spared() -> float:
    """The worst-sample cosine a float set the search keeps must reach (``HEADROOM``)."""
    from ptopt.export.parity import min_cosine_for

    return 1.0 - (1.0 - min_cosine_for("int8", None)) * (1.0 - HEADROOM)


def _data(prep: Prepared) -> tuple[Any, Any]:
    """(what the search fits on: the calibration data; what accepts it: the evaluation data, or None)."""
    from ptopt.compress.fidelity import fidelity_data

    search = fidelity_data(prep.calib)
    accept = fidelity_data(prep.evald) if prep.evald is not None and len(prep.evald) else None
    return search, accept


def _ranked(prep: Prepared, units: dict[str, list[str]], data: Any) -> tuple[list[str], Any]:
    """``units`` most harmful in int8 first, and the simulation that ranked them (``RANK_SAMPLES`` of
    ``data``)."""
    from ptopt.optimize.float_layers import Simulated

    sim = Simulated(prep.module, prep.calib, data.take(min(RANK_SAMPLES, len(data))), units, outputs=True)
    return [name for name, _ in sim.ranked()], sim


def _granularities(module: Any, excluded: Any) -> list[tuple[str, dict[str, list[str]]]]:
    """The units the float search ranks: Linear / Conv layers, then the blocks holding them."""
    from ptopt.optimize.float_layers import layer_kinds

    def skip(name: str) -> bool:
        return any(name == e or name.startswith(e + ".") for e in excluded)

    layers = [n for n, m in module.named_modules() if isinstance(m, layer_kinds()) and not skip(n)]
    blocks: dict[str, list[str]] = {}
    for name in block_names(module):
        members = [n for n in layers if n == name or n.startswith(name + ".")]
        if members and not skip(name):
            blocks[name] = members
    return [("layers", {n: [n] for n in layers}), ("blocks", blocks)]


def block_names(module: Any, prefix: str = "") -> list[str]:
    """The blocks of a model: the modules its ``Sequential`` / ``ModuleList`` / ``ModuleDict``
    containers hold (a ResNet's ``layer1.0``, a ViT's ``blocks.3``, a BERT's ``encoder.layer.1``; a
    container in a container is opened: a Swin stage's blocks), and the layers outside any container
    (``conv1``, ``fc``)."""
    from torch import nn

    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    out: list[str] = []
    for name, child in module.named_children():
        full = f"{prefix}{name}"
        leaf = not any(True for _ in child.children())
        if leaf or (isinstance(module, containers) and not isinstance(child, containers)):
            out.append(full)
        else:
            out += block_names(child, full + ".")
    return out


def _own_params(module: Any) -> dict[str, int]:
    return {
        n: sum(p.numel() for p in m.parameters(recurse=False))
        for n, m in module.named_modules()
        if n and any(True for _ in m.parameters(recurse=False))
    }


def _int8_share(params: dict[str, int], floats: tuple[str, ...]) -> float:
    """The share of the parameters outside ``floats`` (modules and what they hold): at most what the
    int8 model can make int8 (norms and embeddings stay float anyway; the flow checks the real share)."""
    total = sum(params.values()) or 1
    kept = sum(v for n, v in params.items() if not any(n == f or n.startswith(f + ".") for f in floats))
    return kept / total


def _described(made: Quantized, att: Attempt, attempts: list[Attempt], data: tuple) -> Quantized:
    """``made`` with its float layers' reasons and the search in the sidecar (``extra.auto_int8``)."""
    for name in list(made.float_layers):
        unit = next((f for f in att.floats if name == f or name.startswith(f + ".")), None)
        if unit is not None:
            rank = att.ranked.index(unit) + 1
            made.float_layers[name] = (
                f"kept float by --engine auto ({unit}: #{rank} of {len(att.ranked)} by int8 sensitivity); "
                f"with {len(att.floats)} kept float the int8 rule holds: {att.figure.split(': ', 1)[-1]}"
            )
    earlier = attempts[: attempts.index(att)]
    dropped = [a.why or f"{a.engine}'s whole-model int8 misses the int8 rule" for a in earlier]
    held = "the whole-model int8 holds the int8 rule" if not att.floats else (
        f"the whole-model int8 misses the int8 rule ({att.whole}); with {len(att.floats)} module(s) kept "
        "float it holds")  # fmt: skip
    if att.note:
        held += f"; {att.note}"
    made.summary["engine_choice"] = {"chosen": att.engine, "why": "; ".join([*dropped, held]), "p50_ms": {}}
    made.summary["auto_int8"] = {
        "engines": [a.record() for a in attempts],
        "float_modules": list(att.floats),
        "search_data": data[0].name,
        "accepted_on": data[1].name if data[1] is not None else None,
    }
    return made


def _nothing_holds(attempts: list[Attempt]) -> Exception:
    """One refusal naming what each engine reached; when no engine could take the model at all, the
    first engine's own refusal (fx's names the module to keep float, ``--exclude gate``) and the rest."""
    from ptopt.core.errors import PtoptError, UnsupportedModelError

    first = attempts[0].error
    if all(a.trials is None for a in attempts) and isinstance(first, PtoptError):
        others = "; ".join(a.why for a in attempts[1:])
        return UnsupportedModelError(f"{str(first).strip()} (--engine auto tried the others: {others})")
    reached = "; ".join(a.why + (f" (best: {a.best[1]})" if a.best[1] else "") for a in attempts)
    vanish = next((f"; {a.vanish}" for a in attempts if a.vanish), "")
    return UnsupportedModelError(
        f"static int8 of this model holds the int8 rule on no engine, whole or with float layers "
        f"({reached}){vanish}. "
        "Keep it in fp32 (ptopt export MODEL --target onnx), try --mode dynamic, or search further with "
        "--eval-data DATA --min-cosine C (it writes the closest model it finds)"
    )


def _cannot(engine: str, e: BaseException) -> str:
    """Why ``engine`` cannot take the model, in one clause: its tracer's failure, else the error."""
    from ptopt.compress.quantize.registry import TECHNIQUES
    from ptopt.core.errors import UnsupportedModelError

    text = _first_line(e)
    if isinstance(e, UnsupportedModelError) and ("cannot trace" in text or "cannot capture" in text):
        short = text.split("the model", 1)[-1].lstrip(":( ").split(". ")[0].split("); ")[0]
        return f"{TECHNIQUES[('static', engine)].tracer} cannot trace the model ({clip(short, 160)})"
    return f"{engine}: its int8 model fails ({text})"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return clip(text.removeprefix("error: "), 240)


def _logger(progress: bool) -> Callable[[str], None]:
    if not progress:
        return lambda msg: None
    from ptopt.core import progress as report  # one line per message (muted by --quiet), never wrapped

    t0 = time.perf_counter()
    return lambda msg: report.note(f"auto ({time.perf_counter() - t0:.0f} s): {msg}")
