"""Rows ``("static", "auto")`` and ``("qat", "auto")``.

Static: the engines in order, the first whose int8 model
holds the int8 rule, whole or with the fewest float modules found (``auto_int8``). QAT: every other
engine's row, each timed at the opt batch in the same interleaved rounds; the faster is kept when its
accuracy drop (with ``eval_data``) stays within ``AUTO_MAX_DROP`` points of fp32 (else the other). An
engine that cannot take the model (torch.fx cannot trace it) drops out, and the choice says why. The
choice and the measurements go into the sidecar (``engine_choice``)."""

from __future__ import annotations

from typing import Any

from ptopt.compress.quantize import auto_int8, fx_support, pt2e
from ptopt.compress.quantize.base import Prepared, Quantized
from ptopt.compress.quantize.config import MIN_STATIC_SHARE, QATConfig, StaticQuantConfig, refuse_no_compile
from ptopt.compress.quantize.registry import CHOOSER, TECHNIQUES, engines_loaded, register_technique

#: auto keeps the faster engine only within this many accuracy points of fp32 (with eval data)
AUTO_MAX_DROP = 0.5


def _check(config: Any) -> None:
    refuse_no_compile(config)
    pt2e.check_x86(config)


@register_technique(
    StaticQuantConfig,
    CHOOSER,
    help="fx, then pt2e; the first whose int8 holds the int8 rule, with float layers if needed",
    requires=fx_support.require_backend,
    min_int8_share=MIN_STATIC_SHARE,
    advise=lambda config, prep: auto_int8.ADVICE,
)
def static_auto(config: Any, prep: Prepared, progress: bool) -> Quantized:
    return auto_int8.first_that_holds(config, prep, progress)


@register_technique(
    QATConfig,
    CHOOSER,
    help="both engines timed; the faster within 0.5 accuracy points",
    check=_check,
    requires=fx_support.require_backend,
    gated=False,
)
def qat_auto(config: Any, prep: Prepared, progress: bool) -> Quantized:
    return choose(config, prep, progress)


def choose(config: Any, prep: Prepared, progress: bool) -> Quantized:
    """Each engine's artifact of ``config.mode``; the faster within the accuracy budget, its
    ``summary["engine_choice"]`` saying why. The first engine (the default) may refuse the model
    (UnsupportedModelError: torch.fx cannot trace it): the next one is then the answer, and says so."""
    from ptopt.compress.quantize.measure import accuracy
    from ptopt.core.choice import fastest_within
    from ptopt.core.errors import UnsupportedModelError

    batch = prep.specs[0].opt_shape[0] if prep.specs else 1
    made: dict[str, Quantized] = {}
    refused: list[tuple[str, str]] = []
    for engine in engines_loaded(config.mode):
        if engine == CHOOSER:
            continue
        try:
            made[engine] = TECHNIQUES[(config.mode, engine)].handler(
                config.replace(engine=engine), prep, progress
            )
        except UnsupportedModelError as e:
            if made or refused:
                raise
            refused.append((engine, str(e).split(": ", 1)[-1].split(". ")[0][:160]))
    if refused:
        (lost, reason), (engine, only) = refused[0], next(iter(made.items()))
        tracers = TECHNIQUES[(config.mode, lost)].tracer, TECHNIQUES[(config.mode, engine)].tracer
        why = f"{tracers[0]} cannot trace the model ({reason}); {tracers[1]} can"
        only.summary["engine_choice"] = {"chosen": engine, "why": why, "p50_ms": {}, "batch": batch}
        return only
    ms = _timed(made, prep)
    drop = {
        k: accuracy(prep.module, q.model, prep.evald, None, q.eval_batch).get("accuracy_drop_points")
        for k, q in made.items()
    }
    fast = min(ms, key=ms.get)  # type: ignore[arg-type]
    chosen, ok = fastest_within(ms, ms.get, lambda k: drop[k] is None or drop[k] <= AUTO_MAX_DROP)
    if chosen is None:  # neither holds: the one that drops least
        chosen = min(drop, key=lambda k: drop[k])  # type: ignore[arg-type, return-value]
    why = (
        f"faster at batch {batch}"
        if chosen == fast
        else f"{fast} drops {drop[fast]} points (> {AUTO_MAX_DROP})"
    )
    winner = made[chosen]
    winner.summary["engine_choice"] = {
        "chosen": chosen, "why": why, "p50_ms": ms, "accuracy_drop_points": drop, "batch": batch,
    }  # fmt: skip
    return winner


def _timed(made: dict[str, Quantized], prep: Prepared) -> dict[str, float]:
    """p50 ms of each artifact at the opt batch, timed in the same interleaved rounds."""
    import torch

    from ptopt.core.inputspec import call_model, make_inputs
    from ptopt.core.timing import measure_interleaved

    x = make_inputs(prep.specs, prep.style, which="opt")

    def runner(model: Any) -> Any:
        def run() -> Any:
            with torch.no_grad():
                return call_model(model, x)

        return run

    runs = {k: runner(q.model) for k, q in made.items()}
    stats = measure_interleaved(runs, rounds=3, min_iters=6, min_seconds=0.6)
    return {k: round(v["p50_ms"], 3) for k, v in stats.items()}
