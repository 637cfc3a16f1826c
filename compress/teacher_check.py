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
        message = (
            f"{head}, and no labelled data shows whether it is trained: unless the factory loads trained "
            f"weights itself, the student learns from random weights (give {flag} FILE, its state dict)"
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
    """At most :data:`CHECK_SAMPLES` of ``data``'s samples, drawn over all of it (seeded), not its first
    ones: a file sorted by label starts with one class, on which a trained model is at "chance"."""
    import torch

    if len(data) <= CHECK_SAMPLES:
        return data
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
    return data.select(order[:CHECK_SAMPLES].sort().values)


def chance_accuracy(module: Any, data: Any) -> dict[str, Any] | None:
    """``module``'s top-1 accuracy on labelled ``data`` against chance: ``accuracy``, ``chance`` (the
    most frequent label's share, at least 1/classes), ``bound`` (chance plus three standard errors of
    a guess at that rate, at least :data:`MIN_MARGIN`), ``classes``, ``samples``. None when the
    outputs are not class scores the labels index (regression, one output, other shapes)."""
    import torch

    from ptopt.compress.trainer import model_logits

    correct = total = 0
    classes = None
    module.eval()
    with torch.inference_mode():
        for batch in data.batches(128):
            logits = model_logits(module, batch.x)
            y = batch.y
            if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] < 2:
                return None
            if y.dim() != 1 or y.dtype.is_floating_point or y.shape[0] != logits.shape[0] or int(y.min()) < 0:
                return None
            classes = int(logits.shape[1])
            correct += int((logits.argmax(-1) == y).sum())
            total += int(y.shape[0])
    if not total:
        return None
    labels = data.y.long()
    chance = max(1.0 / classes, float(torch.bincount(labels).max()) / total)
    margin = max(MIN_MARGIN, 3 * math.sqrt(chance * (1 - chance) / total))
    accuracy = correct / total
    return {
        "accuracy": accuracy,
        "chance": chance,
        "bound": chance + margin,
        "classes": classes,
        "samples": total,
    }
