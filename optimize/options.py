"""The options of ``ptopt optimize`` / ``ptopt.optimize``, declared once (``ptopt.core.options``):
``OptimizeOptions`` (the budget, what to search, how long) and validate's ``LatencyOptions`` (how the
survivors are timed). A causal language model searched under ``max_perplexity_increase`` is the
``lm`` kind (``ptopt.optimize.lm``); everything else is ``model``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ptopt.core.errors import UsageError
from ptopt.core.options import Options, Selector, option
from ptopt.validate.latency import LatencyOptions

_MODEL = ("model",)
#: the old spelling of the accuracy budget: validate's gate has that name (one meaning per name)
_OLD_BUDGET = {
    spelling: "the budget a search aims at is --accuracy-budget / accuracy_budget= (the same points of top-1); "
    "--max-accuracy-drop is validate's gate on a measured artifact"
    for spelling in ("--max-accuracy-drop", "max_accuracy_drop")
}


def _runtimes() -> tuple[str, ...]:
    from ptopt.optimize.candidates import runtime_filters

    return tuple(runtime_filters())


@dataclasses.dataclass(frozen=True)
class OptimizeOptions:
    """What ``optimize`` searches for, among what, and for how long."""

    accuracy_budget: float | None = option(
        None,
        help="Accuracy budget: points of top-1 below the fp32 model on --eval-data (needs labels).",
        deprecated=_OLD_BUDGET,
        metavar="PTS",
        applies=_MODEL,
    )
    min_cosine: float | None = option(
        None,
        help="Accuracy budget: the worst sample's cosine with the fp32 outputs (for unlabelled data), "
        "projected to 1000 samples.",
        metavar="C",
        applies=_MODEL,
    )
    max_perplexity_increase: float | None = option(
        None,
        help="Budget for a causal language model: % perplexity over fp32 on --eval-data text; searches the "
        "weight-only int8/int4 candidates for the fastest decode.",
        metavar="PCT",
        applies=("lm",),
    )
    batch_sizes: tuple[int, ...] = option(
        (1, 32), help="Batch sizes to time; the largest ranks.", flag="--batch-size", csv=True, applies=_MODEL
    )
    runtime: str = option(
        "any", help="Only candidates that run on this runtime (torch includes AOTInductor).", applies=_MODEL
    )
    device: str = option(
        "cpu",
        help="cpu | cuda[:N]: where the candidates are built, evaluated and timed (cuda: the GPU catalogue).",
        applies=_MODEL,
        note="the language-model search runs on the CPU: its candidates are CPU weight-only int8/int4 builds",
    )
    #: 9 minutes by default, so that the whole run (loading, the search, writing the folder, and a build that
    #: runs past its estimate) ends within 10 minutes on a 2-core machine (all-MiniLM-L6-v2's took 1415 s of
    #: a 1200 s budget before the slow builds went last and the output folder was budgeted for)
    time_budget: float | str = option(
        "9m",
        help="Wall time for the whole search, writing -o included (600, 90s, 10m); candidates that do not fit "
        "are skipped.",
    )
    candidates: tuple[str, ...] | None = option(
        None, help="Only these candidates (comma-separated names; the fp32 reference always runs).", csv=True
    )
    skip: tuple[str, ...] | None = option(
        None, help="Leave these candidates out (comma-separated names), e.g. fp32-aoti,int8-pt2e.", csv=True
    )
    threads: int | None = option(None, help="Intra-op threads for every runtime (default: all usable cores).")
    isa: tuple[str, ...] = option(
        (),
        help="CPU levels the artifact will run on, comma-separated (avx2, avx512_vnni, amx, ...; see ptopt "
        "validate --isa): a candidate is within the budget only if it holds at every one (each judged in a "
        "child process with the kernel libraries capped there). Default: this CPU only.",
        csv=True,
        metavar="LEVELS",
        applies=_MODEL,
    )

    def __post_init__(self) -> None:
        from ptopt.validate.options import parse_batch_sizes

        object.__setattr__(self, "batch_sizes", parse_batch_sizes(self.batch_sizes))
        if self.threads is not None and int(self.threads) < 1:
            raise UsageError(f"--threads must be >= 1, got {self.threads}")
        if self.max_perplexity_increase is not None and not self.max_perplexity_increase >= 0:
            raise UsageError("--max-perplexity-increase must be a percentage >= 0")
        if self.isa:
            from ptopt.core.isa import check_levels

            if not str(self.device).startswith("cpu"):
                raise UsageError(f"--isa judges CPU levels; it does not apply to --device {self.device}")
            object.__setattr__(self, "isa", tuple(check_levels(self.isa)))
        if self.max_perplexity_increase is not None:
            return
        drop, cos = self.accuracy_budget, self.min_cosine
        if (drop is None) == (cos is None):
            raise UsageError(
                "give exactly one accuracy budget: --accuracy-budget PTS (labelled eval data) or "
                "--min-cosine C (outputs compared with the fp32 model's)"
            )
        if drop is not None and drop < 0:
            raise UsageError(f"--accuracy-budget {drop}: a budget cannot be below zero")
        if cos is not None and not -1 <= cos <= 1:
            raise UsageError(f"--min-cosine {cos}: a cosine lies in [-1, 1]")
        if self.runtime not in _runtimes():
            raise UsageError(f"--runtime {self.runtime!r}: choose one of {', '.join(_runtimes())}")


_KINDS = {
    "model": "the search of a model on tensor data (--accuracy-budget or --min-cosine)",
    "lm": "the language-model search (--max-perplexity-increase)",
}

#: the options of ``ptopt optimize``
OPTIONS = Options(
    "optimize",
    lambda: (OptimizeOptions, LatencyOptions),
    Selector("kind", "what is searched", lambda: tuple(_KINDS), describe=_KINDS.__getitem__, cli=False),
)


def resolve(options: Mapping[str, Any], latency: Any) -> tuple[str, OptimizeOptions, LatencyOptions]:
    """The kind of search (``lm`` with a perplexity budget), its options and its timing options
    (``latency``: a ``LatencyOptions`` or a mapping of its fields instead of them, not both)."""
    kind = "lm" if options.get("max_perplexity_increase") is not None else "model"
    given = OPTIONS.check(options, kind)
    if kind == "lm":
        if latency is not None:
            raise UsageError(
                "latency= is not an option of the language-model search (--max-perplexity-increase)"
            )
        from ptopt.validate.lm import DEFAULT_ROUNDS  # generations per model, as validate times them

        given = {"rounds": DEFAULT_ROUNDS} | given
    return (
        kind,
        OPTIONS.build(OptimizeOptions, given),
        OPTIONS.merge(LatencyOptions, latency, given, "latency"),
    )
