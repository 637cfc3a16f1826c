"""The shared training loop: zoo recipes, QAT, pruning fine-tuning and distillation all use it.

AdamW, linear warmup then cosine decay, gradient clipping and accumulation, evaluation after each
epoch on held-out data keeping the best weights, a rich progress bar. Deterministic for a seed.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Callable, Sequence

from ptopt.core.config import Config, register_config
from ptopt.core.data import Batch, Dataset
from ptopt.core.errors import UsageError
from ptopt.core.inputspec import batch_size_of, call_model

#: loss_fn(model, batch) -> (loss, logits); logits may be None when accuracy makes no sense.
LossFn = Callable[[Any, Batch], "tuple[Any, Any]"]
#: hook(epoch, model), called before each epoch (QAT freezes observers / BN through these).
EpochHook = Callable[[int, Any], None]


@register_config
@dataclasses.dataclass(frozen=True)
class TrainConfig(Config):
    """Options of the shared trainer."""

    type_name = "train"
    epochs: int = 3
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    #: fraction of all optimizer steps spent warming the learning rate up linearly from 0
    warmup_fraction: float = 0.05
    #: max gradient norm; None disables clipping
    grad_clip: float | None = 1.0
    grad_accum_steps: int = 1
    seed: int = 0
    #: after training, restore the weights of the epoch with the best eval accuracy
    keep_best: bool = True
    eval_batch_size: int = 256

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise UsageError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise UsageError("batch sizes must be >= 1")
        if self.lr <= 0:
            raise UsageError(f"learning rate must be > 0, got {self.lr}")
        if not 0 <= self.warmup_fraction < 1:
            raise UsageError(f"warmup fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.grad_accum_steps < 1:
            raise UsageError(f"grad_accum_steps must be >= 1, got {self.grad_accum_steps}")


@dataclasses.dataclass
class TrainResult:
    model: Any
    history: list[dict[str, Any]]
    best_epoch: int | None
    best_accuracy: float | None


def cross_entropy_loss(model: Any, batch: Batch) -> tuple[Any, Any]:
    import torch.nn.functional as F

    logits = call_model(model, batch.x)
    return F.cross_entropy(logits, batch.y), logits


def warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear 0→1 over ``warmup_steps``, then cosine 1→0 until ``total_steps``."""
    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


def evaluate_accuracy(model: Any, data: Dataset, batch_size: int = 256) -> float:
    """Top-1 accuracy (fraction) of ``model`` on labelled ``data``, in eval mode without grad."""
    import torch

    data.require_labels("accuracy")
    was_training = getattr(model, "training", False)
    model.eval()
    correct = 0
    with torch.inference_mode():
        for b in data.batches(batch_size):
            correct += int((call_model(model, b.x).argmax(-1) == b.y).sum())
    if was_training:
        model.train()
    return correct / len(data)


def train(model: Any, train_data: Dataset, config: TrainConfig = TrainConfig(), eval_data: Dataset | None = None,
          loss_fn: LossFn | None = None, epoch_hooks: Sequence[EpochHook] = (), progress: bool = True,
          description: str = "train", params: Sequence[Any] | None = None) -> TrainResult:
    """Train ``model`` in place and return it with per-epoch history.

    ``params`` (default: the model's parameters) lets callers add trainable parts outside the model,
    such as distillation projections.
    """
    import torch

    loss_fn = loss_fn or cross_entropy_loss
    if loss_fn is cross_entropy_loss:
        train_data.require_labels("training with cross-entropy")
    torch.manual_seed(config.seed)
    params = list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(train_data.num_batches(config.batch_size) / config.grad_accum_steps)
    total = steps_per_epoch * config.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total, int(total * config.warmup_fraction)))

    history: list[dict[str, Any]] = []
    best_acc, best_epoch, best_state = None, None, None
    with _progress(progress) as bar:
        task = bar.add_task(description, total=config.epochs * train_data.num_batches(config.batch_size)) if bar else None
        for epoch in range(config.epochs):
            for hook in epoch_hooks:
                hook(epoch, model)
            model.train()
            t0, seen, loss_sum, correct = time.perf_counter(), 0, 0.0, 0
            opt.zero_grad(set_to_none=True)
            for i, batch in enumerate(train_data.batches(config.batch_size, shuffle=True, seed=config.seed + epoch)):
                loss, logits = loss_fn(model, batch)
                (loss / config.grad_accum_steps).backward()
                last = i + 1 == train_data.num_batches(config.batch_size)
                if (i + 1) % config.grad_accum_steps == 0 or last:
                    if config.grad_clip is not None:
                        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                n = batch_size_of(batch.x)
                seen += n
                loss_sum += float(loss.detach()) * n
                if logits is not None and batch.y is not None:
                    correct += int((logits.detach().argmax(-1) == batch.y).sum())
                if bar:
                    bar.update(task, advance=1, description=f"{description} epoch {epoch + 1}/{config.epochs} "
                                                            f"loss {loss_sum / seen:.4f}")
            record: dict[str, Any] = {
                "epoch": epoch + 1,
                "loss": loss_sum / max(seen, 1),
                "train_accuracy": correct / seen if train_data.has_labels and seen else None,
                "lr": sched.get_last_lr()[0],
                "samples_per_s": seen / max(time.perf_counter() - t0, 1e-9),
            }
            if eval_data is not None and eval_data.has_labels:
                acc = evaluate_accuracy(model, eval_data, config.eval_batch_size)
                record["eval_accuracy"] = acc
                if best_acc is None or acc > best_acc:
                    best_acc, best_epoch = acc, epoch + 1
                    if config.keep_best:
                        best_state = copy.deepcopy(model.state_dict())
            history.append(record)
    if config.keep_best and best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return TrainResult(model, history, best_epoch, best_acc)


class _NoBar:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _progress(enabled: bool):
    if not enabled:
        return _NoBar()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)
