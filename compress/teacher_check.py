"""Whether a distillation teacher built by a factory (``--teacher pkg.module:factory``) looks trained.

A factory returns whatever it builds: most build a fresh model (random weights) and expect
``--teacher-weights FILE``; some load their own. Distilling from random weights trains the student to
imitate noise, and without a check only the teacher's accuracy line, after the training, shows it. So
before training, a teacher that a factory built with no weights file is judged on up to
:data:`CHECK_SAMPLES` labelled samples drawn over the evaluation data, else the training data (not
their first ones: a file sorted by label starts with one class): an accuracy within the noise of a
constant guess (the most frequent label's share, at least one over the number of classes) warns;
above it, the factory evidently loaded trained weights and nothing is said. With no labelled data
there is nothing to judge by, nor where one class is (nearly) every sample, and the warning says so.
Never a refusal: the factory may load its own weights. One :class:`UntrainedTeacherWarning` (the CLI
prints a ``warning:`` line).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

__all__ = [
    "CHECK_SAMPLES",
    "UntrainedTeacherWarning",
    "chance_accuracy",
    "check_factory_teacher",
    "spread_sample",
]

#: samples the teacher's accuracy is judged on at most
CHECK_SAMPLES = 512
#: an accuracy this far (at least) above chance is a trained model's, whatever the sample
MIN_MARGIN = 0.05


class UntrainedTeacherWarning(UserWarning):
    """A teacher built by its factory with no weights file that looks untrained (module docstring)."""


def check_factory_teacher(
    loaded: Any, datasets: tuple[Any, ...], flag: str = "--teacher-weights"
) -> str | None:
    """Warn (:class:`UntrainedTeacherWarning`) when ``loaded`` was built by a factory with no weights
    file and either scores chance-level accuracy on the first labelled Dataset of ``datasets`` or no
    labelled data can tell; returns the message (None: no warning). Only the main process warns."""
    from ptopt.compress import distributed as dist_util

    if "factory" not in loaded.info or loaded.info.get("weights") or not dist_util.is_main_process():
        return None
    data = next((d for d in datasets if d is not None and d.has_labels and len(d)), None)
    judged = chance_accuracy(loaded.module, spread_sample(data)) if data is not None else None
    head = f"teacher {loaded.ref} was built by its factory with no {flag}"
    if judged is not None and judged["bound"] >= 1:  # one class is (nearly) every sample: nothing can tell
        message = (
            f"{head}, and {data.name} cannot show whether it is trained (a constant guess scores "
            f"{judged['chance']:.3f} on it): unless the factory loads trained weights itself, the student "
            f"learns from random weights (give {flag} FILE, its state dict)"
        )
    elif judged is None:
        why = (
            "no labelled data shows whether it is trained"
            if data is None
            else f"its outputs are not class scores that {data.name}'s labels index, so they cannot show "
            "whether it is trained"
        )
        message = (
            f"{head}, and {why}: unless the factory loads trained weights itself, the student learns from "
            f"random weights (give {flag} FILE, its state dict)"
        )
    elif judged["accuracy"] > judged["bound"]:
        return None
    else:
        message = (
            f"{head}, and its accuracy on {judged['samples']} samples of {data.name} is "
            f"{judged['accuracy']:.3f}, chance level for {judged['classes']} classes (a constant guess "
            f"scores {judged['chance']:.3f}): it looks untrained, and the student would learn from random "
            f"weights. Give {flag} FILE (its state dict) unless the factory is meant to load them"
        )
    warnings.warn(message, UntrainedTeacherWarning, stacklevel=3)
    return message


def spread_sample(data: Any) -> Any:
    """At most :data:`CHECK_SAMPLES` of ``data``'s samples, drawn over all of it in a shuffled order
    (seeded), not its first ones: a file sorted by label starts with one class, on which a trained model
    is at "chance", and the check may stop after its first batch (``chance_accuracy``), which must not
    be one class either."""
    import torch

    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
    return data.select(order[:CHECK_SAMPLES])


def chance_accuracy(module: Any, data: Any) -> dict[str, Any] | None:
    """``module``'s top-1 accuracy on labelled ``data`` against chance: ``accuracy``, ``chance`` (the
    most frequent label's share, at least 1/classes), ``bound`` (chance plus three standard errors of
    a guess at that rate, at least :data:`MIN_MARGIN`), ``classes``, ``samples``. None when the
    outputs are not class scores the labels index (regression, one output, other shapes). Judged in
    batches of :data:`BATCH`, stopping once the accuracy so far is above the bound at that count (a
    trained teacher: one batch, not 512 samples of a large model)."""
    import torch

    from ptopt.compress.trainer import model_logits
    from ptopt.core import progress

    correct = total = 0
    judged = None
    module.eval()
    with progress.step(f"checking the teacher on up to {len(data)} samples", announce=False):
        with torch.inference_mode():
            for batch in data.batches(BATCH):
                logits, y = model_logits(module, batch.x), batch.y
                if not _class_scores(logits, y):
                    return None
                correct += int((logits.argmax(-1) == y).sum())
                total += int(y.shape[0])
                judged = _against_chance(correct, total, int(logits.shape[1]), data.y.long())
                if judged["accuracy"] > judged["bound"]:
                    break
    return judged


#: samples per batch of the check (and the fewest it stops after)
BATCH = 128


def _class_scores(logits: Any, y: Any) -> bool:
    """Whether ``logits`` are [N, classes >= 2] scores that the integer labels ``y`` index."""
    import torch

    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] < 2:
        return False
    return (
        y.dim() == 1 and not y.dtype.is_floating_point and y.shape[0] == logits.shape[0] and int(y.min()) >= 0
    )


def _against_chance(correct: int, total: int, classes: int, labels: Any) -> dict[str, Any]:
    """The accuracy of ``correct`` of ``total`` against a constant guess on ``labels`` (the whole sample)."""
    import torch

    chance = max(1.0 / classes, float(torch.bincount(labels).max()) / len(labels))
    margin = max(MIN_MARGIN, 3 * math.sqrt(chance * (1 - chance) / total))
    return {
        "accuracy": correct / total,
        "chance": chance,
        "bound": chance + margin,
        "classes": classes,
        "samples": total,
    }
