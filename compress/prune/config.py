"""The pruning configs (frozen, registered, round-tripping through dicts) and the layer matching
every pruner shares. No torch, no pruner: ``ptopt.compress.prune.table`` maps each config to its
pruner, filled by the files of ``techniques/``."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable
from typing import Any, Literal

from ptopt.core.config import Config, register_config
from ptopt.core.errors import UsageError
from ptopt.core.options import option

#: output suffix -> format of the saved dense model
OUTPUT_FORMATS = {".pt": "torchscript", ".pt2": "exported_program"}
CRITERIA = ("l1", "l2")
#: the unpruned model as distillation teacher
TEACHER_SELF = "self"


class PruneWarning(UserWarning):
    """Something the user should know that does not stop pruning (an --exclude matching nothing)."""


@dataclasses.dataclass(frozen=True)
class PruneConfig(Config):
    """What every pruning method shares. ``amount`` is the fraction pruned, strictly between 0 and 1."""

    amount: float = option(
        0.5,
        help="Fraction to prune, strictly between 0 and 1 (weights, or channels per layer for structured).",
        required=True,
    )
    exclude: tuple[str, ...] = option(
        (),
        help="Leave layers matching this fnmatch pattern (module name or a parent's) alone; repeatable.",
        metavar="PATTERN",
        repeat=True,
    )
    steps: int = option(1, help="Prune gradually in this many rounds, fine-tuning between them.")

    def __post_init__(self) -> None:
        if (
            isinstance(self.amount, bool)
            or not isinstance(self.amount, (int, float))
            or not 0 < self.amount < 1
        ):
            raise UsageError(f"--amount must be a fraction strictly between 0 and 1, got {self.amount!r}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise UsageError(f"--steps must be an integer >= 1, got {self.steps!r}")
        object.__setattr__(self, "exclude", tuple(self.exclude))


@register_config
@dataclasses.dataclass(frozen=True)
class L1UnstructuredConfig(PruneConfig):
    """Per-layer L1 magnitude pruning of conv and linear weights to exactly ``amount`` sparsity."""

    type_name = "prune-l1-unstructured"
    method = "l1-unstructured"


@register_config
@dataclasses.dataclass(frozen=True)
class GlobalPruneConfig(PruneConfig):
    """One L1 magnitude ranking across all conv and linear weights to a global sparsity of ``amount``."""

    type_name = "prune-global"
    method = "global"


@register_config
@dataclasses.dataclass(frozen=True)
class StructuredPruneConfig(PruneConfig):
    """Remove ``amount`` of each layer's output channels (lowest L1/L2 filter norm), rewriting the model."""

    type_name = "prune-structured"
    method = "structured"
    criterion: Literal["l1", "l2"] = option(
        "l1", help="Channel ranking: L1 or L2 norm of each filter.", choices=CRITERIA
    )
    prune_first_last: bool = option(
        False, help="Also prune the first layer and the last linear (classifier outputs never are)."
    )
    prune_hidden: bool = option(
        True,
        help="Prune a transformer's hidden size too: the residual stream its embeddings start (embeddings, "
        "every block's input/output projections, norms, a tied output head) as one group; "
        "--no-prune-hidden keeps it (and the width of a base model's output).",
        toggle=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.criterion not in CRITERIA:
            raise UsageError(f"--criterion must be one of {', '.join(CRITERIA)}, got {self.criterion!r}")


def matches(name: str, patterns: Iterable[str]) -> bool:
    """fnmatch of a module name, or of one of its parents (``layers.0`` covers ``layers.0.conv1``)."""
    parts = name.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(p, pat) for pat in patterns for p in prefixes)


def unmatched_patterns(model: Any, patterns: Iterable[str]) -> list[str]:
    names = [n for n, _ in model.named_modules() if n]
    return [p for p in patterns if not any(matches(n, [p]) for n in names)]


@dataclasses.dataclass(frozen=True)
class FineTuneOptions:
    """Recovery after each pruning round: ``epochs`` of fine-tuning on ``fine_tune_data`` (0: none),
    by distillation from ``teacher`` when given (``"self"``: the unpruned model). The trainer's
    ``lr``, ``batch_size`` and ``seed`` and the loss's ``temperature`` and ``alpha`` are the options
    of ``TrainConfig`` and ``DistillConfig``."""

    epochs: int = option(0, help="Fine-tuning epochs (per round with --steps).")
    teacher: Any = option(
        None,
        help="Fine-tune by distillation from this MODEL ('self': the unpruned model).",
        metavar="MODEL|self",
        path="in",
    )
    teacher_weights: Any = option(
        None,
        help="State dict (.pt or .safetensors) for a pkg.module:factory --teacher (without it the "
        "factory's own weights: fresh ones, unless it loads trained ones itself).",
        metavar="FILE",
        path="in",
    )
