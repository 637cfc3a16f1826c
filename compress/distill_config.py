"""The distillation configs, without torch: ``ptopt distill --help`` and ``ptopt prune --help`` read
their options (the loss is ``ptopt.compress.distill_loss``, a language model's ``distill_lm``)."""

from __future__ import annotations

import dataclasses

from ptopt.compress.quantize.engine_torchao import QAT_SCHEMES
from ptopt.core.config import Config, register_config
from ptopt.core.errors import UsageError
from ptopt.core.options import option

#: the textbook defaults (Hinton et al., 2015): soft targets at T=4 carry the teacher's "dark
#: knowledge" (which wrong classes look alike), and α=0.5 keeps the labels as an anchor. They were
#: NOT tuned here: benchmarks/bench_distill.py, choosing on a validation split for a 4-epoch budget
#: on digits, picked T=1, α=0.1 (docs/distill.md); pick T and α on a validation split for your run.
DEFAULT_TEMPERATURE = 4.0
DEFAULT_ALPHA = 0.5


#: ``--output-loss``: how the student's output follows the teacher's (``DistillLoss.forward``)
OUTPUT_LOSSES = ("auto", "kl", "cosine")


@register_config
@dataclasses.dataclass(frozen=True)
class DistillConfig(Config):
    """Options of the distillation loss."""

    type_name = "distill"
    temperature: float = option(
        DEFAULT_TEMPERATURE,
        help="Softmax temperature T (the textbook default; benchmarks/bench_distill.py chose 1 with --alpha 0.1 "
        "for a 4-epoch budget, on a validation split).",
        short="-T",
    )
    alpha: float = option(
        DEFAULT_ALPHA,
        help="Weight of the label loss; 1-alpha weighs the teacher's soft targets (0: soft targets only).",
    )
    feature_pairs: tuple[tuple[str, str], ...] = option(
        (),
        help="Also match an intermediate layer's output (a learned projection when widths differ). Repeatable.",
        flag="--feature-pair",
        metavar="TEACHER_LAYER=STUDENT_LAYER",
        repeat=True,
        applies=("classifier",),
        note="language models distil token by token",
    )
    feature_weight: float = option(1.0, help="Weight of each feature loss.", applies=("classifier",))
    output_loss: str = option(
        "auto",
        help="How the student's output follows the teacher's: kl (softened class scores, --temperature), "
        "cosine (1 - cosine similarity: features such as sentence embeddings or hidden states), or auto: "
        "kl for class scores, cosine for features (read from the teacher's last layer; labels mean classes).",
        choices=OUTPUT_LOSSES,
        applies=("classifier",),
        note="language models distil token by token",
    )

    def __post_init__(self) -> None:
        pairs = tuple(parse_feature_pair(p) if isinstance(p, str) else tuple(p) for p in self.feature_pairs)
        object.__setattr__(self, "feature_pairs", pairs)
        if not self.temperature > 0:
            raise UsageError(f"temperature must be > 0, got {self.temperature}")
        if not 0 <= self.alpha <= 1:
            raise UsageError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.feature_weight < 0:
            raise UsageError(f"feature weight must be >= 0, got {self.feature_weight}")
        if self.output_loss not in OUTPUT_LOSSES:
            raise UsageError(
                f"--output-loss must be one of {', '.join(OUTPUT_LOSSES)}, got {self.output_loss!r}"
            )


def parse_feature_pair(text: str) -> tuple[str, str]:
    """``teacher.layer=student.layer`` → ("teacher.layer", "student.layer")."""
    t, sep, s = text.partition("=")
    if not sep or not t.strip() or not s.strip():
        raise UsageError(f"feature pair {text!r}: write TEACHER_LAYER=STUDENT_LAYER, e.g. layers.2=layers.2")
    return t.strip(), s.strip()


#: tokens per training window unless told
DEFAULT_SEQ_LEN = 256


@dataclasses.dataclass(frozen=True)
class LMOptions:
    """The options of a causal language model's distillation (``ptopt.distill``'s ``lm`` kind)."""

    seq_len: int | None = option(
        None,
        help=f"Language models: tokens per training window (default {DEFAULT_SEQ_LEN}).",
        metavar="N",
        applies=("lm",),
    )
    qat: str | None = option(
        None,
        help="Language models: quantization-aware training of the student (torchao): int8 dynamic activations "
        "with int4 (groups of 32) or int8 (per channel) weights; OUT holds the quantized student.",
        choices=tuple(QAT_SCHEMES),
        applies=("lm",),
        note="a classifier's QAT is ptopt quantize --mode qat",
    )

    def __post_init__(self) -> None:
        if self.seq_len is not None and self.seq_len < 2:
            raise UsageError(
                f"--seq-len must be >= 2 (a token and the next one it predicts), got {self.seq_len}"
            )
        if self.qat is not None and self.qat not in QAT_SCHEMES:
            raise UsageError(f"--qat must be one of {', '.join(QAT_SCHEMES)}, got {self.qat!r}")
