"""The shared training loop: zoo recipes, QAT, pruning fine-tuning and distillation all use it.

AdamW, linear warmup then cosine decay, gradient clipping and accumulation, mixed precision (bf16
autocast on CPU; fp16 with a GradScaler or bf16 on CUDA), evaluation after each epoch on held-out data
keeping the best weights, a rich progress bar (loss, accuracy, throughput), TensorBoard logs and a
JSONL metrics file, a checkpoint after every epoch that ``resume`` continues from (a resumed run ends
with the same weights as an uninterrupted one), and data-parallel training under ``torchrun``.
Deterministic for a seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ptopt.compress import distributed as dist_util
from ptopt.core.config import Config, register_config
from ptopt.core.data import Batch, Dataset
from ptopt.core.errors import UsageError
from ptopt.core.inputspec import batch_size_of, call_model

#: loss_fn(model, batch) -> (loss, logits); logits may be None when accuracy makes no sense.
#: A loss_fn that is an nn.Module is moved to the training device, and its parameters are trained too.
LossFn = Callable[[Any, Batch], "tuple[Any, Any]"]
#: hook(epoch, model), called before each epoch (QAT freezes observers / BN through these). On resume,
#: the hooks of the epochs already done are replayed in order before the checkpoint is loaded, so
#: hooks that change the model's structure or flags leave it as the killed run had it.
EpochHook = Callable[[int, Any], None]

PRECISIONS = ("fp32", "bf16", "fp16")


@register_config
@dataclasses.dataclass(frozen=True)
class TrainConfig(Config):
    """Options of the shared trainer."""

    type_name = "train"
    epochs: int = 3
    #: per process: under torchrun the global batch is batch_size × processes
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
    #: fp32, or mixed precision: bf16 (autocast; CPU or CUDA) or fp16 (CUDA, with a GradScaler)
    precision: str = "fp32"
    #: cpu, cuda, cuda:N or auto (CUDA when available); the model comes back on its original device
    device: str = "cpu"

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
        if self.precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")


@dataclasses.dataclass
class TrainResult:
    model: Any
    history: list[dict[str, Any]]
    best_epoch: int | None
    best_accuracy: float | None
    #: epochs already done by the checkpoint this run resumed from (None: started from scratch)
    resumed_from_epoch: int | None = None
    world_size: int = 1


def cross_entropy_loss(model: Any, batch: Batch) -> tuple[Any, Any]:
    import torch.nn.functional as F

    logits = call_model(model, batch.x)
    return F.cross_entropy(logits.float(), batch.y), logits


def warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear 0→1 over ``warmup_steps``, then cosine 1→0 until ``total_steps``."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def to_device(x: Any, device: Any) -> Any:
    """A tensor, tuple/list or dict of tensors (or a Batch) on ``device``."""
    if isinstance(x, Batch):
        return Batch(to_device(x.x, device), to_device(x.y, device))
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(v, device) for v in x)
    return x.to(device) if hasattr(x, "to") else x


def evaluate_accuracy(model: Any, data: Dataset, batch_size: int = 256, device: Any = None) -> float:
    """Top-1 accuracy (fraction) of ``model`` on labelled ``data``, in eval mode without grad.

    Under torchrun each rank scores its share of the samples and the counts are summed.
    """
    import torch
    import torch.distributed as dist

    data.require_labels("accuracy")
    was_training = getattr(model, "training", False)
    model.eval()
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    indices = range(dist.get_rank(), len(data), dist.get_world_size()) if distributed else None
    correct = total = 0
    with torch.inference_mode():
        for b in data.batches(batch_size, indices=indices):
            b = to_device(b, device) if device is not None else b
            correct += int((call_model(model, b.x).argmax(-1) == b.y).sum())
            total += int(b.y.shape[0])
    if distributed:
        correct, total = dist_util.all_reduce_sum([correct, total], _device_of(model))
    if was_training:
        model.train()
    return correct / max(total, 1)


def train(
    model: Any,
    train_data: Dataset,
    config: TrainConfig = TrainConfig(),
    eval_data: Dataset | None = None,
    loss_fn: LossFn | None = None,
    epoch_hooks: Sequence[EpochHook] = (),
    progress: bool = True,
    description: str = "train",
    params: Sequence[Any] | None = None,
    *,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    log_dir: str | os.PathLike | None = None,
    metrics_file: str | os.PathLike | None = None,
    fingerprint_extra: dict[str, Any] | None = None,
) -> TrainResult:
    """Train ``model`` in place and return it with per-epoch history.

    ``params`` (default: the model's trainable parameters plus those of an nn.Module ``loss_fn``) lets
    callers add trainable parts outside the model, such as distillation projections.
    ``checkpoint_dir``: write a checkpoint there after every epoch; with ``resume``, continue from it
    (a missing checkpoint starts from scratch; another configuration's checkpoint is a UsageError).
    ``log_dir``: TensorBoard event files plus ``metrics.jsonl`` (or ``metrics_file``: one JSON record
    per epoch). ``fingerprint_extra``: what else decides the result (loss options, teacher weights),
    compared on resume.
    """
    import torch

    from ptopt.compress import checkpoint as ckpt_util

    loss_fn = loss_fn or cross_entropy_loss
    if loss_fn is cross_entropy_loss:
        train_data.require_labels("training with cross-entropy")
    if len(train_data) == 0:
        raise UsageError("no training samples")
    if resume and checkpoint_dir is None:
        raise UsageError("resume needs a checkpoint directory (--checkpoint-dir)")
    device = dist_util.resolve_device(config.device)
    if config.precision == "fp16" and device.type != "cuda":
        raise UsageError("fp16 training needs CUDA; use bf16 mixed precision on CPU")
    orig_device = _device_of(model)
    model.to(device)
    if isinstance(loss_fn, torch.nn.Module):
        loss_fn.to(device)

    with dist_util.process_group(device) as distributed:
        world = dist_util.world_size() if distributed else 1
        main = dist_util.rank() == 0
        torch.manual_seed(config.seed)
        if params is None:
            params = [p for p in model.parameters() if p.requires_grad]
            if isinstance(loss_fn, torch.nn.Module):
                params += [p for p in loss_fn.parameters() if p.requires_grad]
        params = list(params)
        own = {id(p) for p in model.parameters()}
        extra_params = [p for p in params if id(p) not in own]
        runner = model
        if distributed:
            from torch.nn.parallel import DistributedDataParallel

            runner = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        n_batches = _batches_per_epoch(train_data, config.batch_size, world)
        steps_per_epoch = math.ceil(n_batches / config.grad_accum_steps)
        total = steps_per_epoch * config.epochs
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, warmup_cosine(total, int(total * config.warmup_fraction))
        )
        scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None
        autocast = _autocast(device, config.precision)

        fp = None
        if checkpoint_dir is not None:
            fp = ckpt_util.fingerprint(config, model, train_data, eval_data, world, fingerprint_extra)
        history: list[dict[str, Any]] = []
        best_acc, best_epoch, best_state = None, None, None
        start_epoch, resumed_from = 0, None
        if resume:
            ckpt = ckpt_util.load_checkpoint(checkpoint_dir, fp)  # type: ignore[arg-type]
            if ckpt is not None:
                for epoch in range(ckpt["epoch"]):
                    for hook in epoch_hooks:
                        hook(epoch, model)
                model.load_state_dict(ckpt["model"])
                with torch.no_grad():
                    for p, saved in zip(extra_params, ckpt["extra_params"], strict=False):
                        p.copy_(saved)
                opt.load_state_dict(ckpt["optimizer"])
                sched.load_state_dict(ckpt["scheduler"])
                if scaler is not None and ckpt.get("scaler"):
                    scaler.load_state_dict(ckpt["scaler"])
                rngs = ckpt["rng"]
                ckpt_util.set_rng_state(rngs[dist_util.rank() % len(rngs)] if distributed else rngs[0])
                history = list(ckpt["history"])
                best_acc, best_epoch, best_state = (
                    ckpt["best_accuracy"],
                    ckpt["best_epoch"],
                    ckpt["best_state"],
                )
                start_epoch = resumed_from = int(ckpt["epoch"])
            elif main:
                _note(f"no checkpoint in {checkpoint_dir} yet: starting from scratch")

        logger = _Logger(log_dir, metrics_file, history, start_epoch * steps_per_epoch) if main else None
        try:
            with _progress(progress and main) as bar:
                task = (
                    bar.add_task(
                        description, total=config.epochs * n_batches, completed=start_epoch * n_batches
                    )
                    if bar
                    else None
                )
                for epoch in range(start_epoch, config.epochs):
                    for hook in epoch_hooks:
                        hook(epoch, model)
                    model.train()
                    t0, seen, loss_sum, correct, labelled = time.perf_counter(), 0, 0.0, 0, 0
                    opt.zero_grad(set_to_none=True)
                    if distributed:
                        indices = dist_util.shard_indices(len(train_data), epoch, config.seed)
                        batches = train_data.batches(config.batch_size, indices=indices)
                    else:
                        batches = train_data.batches(
                            config.batch_size, shuffle=True, seed=config.seed + epoch
                        )
                    for i, batch in enumerate(batches):
                        batch = to_device(batch, device)
                        stepping = (i + 1) % config.grad_accum_steps == 0 or i + 1 == n_batches
                        sync = runner.no_sync() if distributed and not stepping else contextlib.nullcontext()
                        with sync:
                            with autocast:
                                loss, logits = loss_fn(runner, batch)
                            scaled = loss.float() / config.grad_accum_steps
                            (scaler.scale(scaled) if scaler is not None else scaled).backward()
                        if stepping:
                            if distributed and extra_params:
                                dist_util.average_gradients(extra_params)
                            if scaler is not None:
                                scaler.unscale_(opt)
                            if config.grad_clip is not None:
                                torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                            if scaler is not None:
                                scaler.step(opt)  # skipped when the scaled gradients overflowed
                                scaler.update()
                                with warnings.catch_warnings():
                                    # the schedule follows steps taken, not steps the scaler skipped
                                    warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
                                    sched.step()
                            else:
                                opt.step()
                                sched.step()
                            opt.zero_grad(set_to_none=True)
                        n = batch_size_of(batch.x)
                        seen += n
                        loss_value = float(loss.detach())
                        loss_sum += loss_value * n
                        if logits is not None and batch.y is not None:
                            correct += int((logits.detach().argmax(-1) == batch.y).sum())
                            labelled += n
                        if logger is not None and stepping:
                            logger.step(loss_value, sched.get_last_lr()[0])
                        if bar:
                            rate = seen * world / max(time.perf_counter() - t0, 1e-9)
                            acc = f" acc {correct / labelled:.3f}" if labelled else ""
                            bar.update(
                                task,
                                advance=1,
                                description=f"{description} epoch {epoch + 1}/{config.epochs} "
                                f"loss {loss_sum / seen:.4f}{acc} {rate:.0f}/s",
                            )
                    elapsed = max(time.perf_counter() - t0, 1e-9)
                    if distributed:
                        dist_util.broadcast_buffers(model)
                        seen, loss_sum, correct, labelled = (
                            int(v) if j != 1 else v
                            for j, v in enumerate(
                                dist_util.all_reduce_sum([seen, loss_sum, correct, labelled], device)
                            )
                        )
                    record: dict[str, Any] = {
                        "epoch": epoch + 1,
                        "loss": loss_sum / max(seen, 1),
                        "train_accuracy": correct / labelled if labelled else None,
                        "lr": sched.get_last_lr()[0],
                        "samples_per_s": seen / elapsed,
                    }
                    if eval_data is not None and eval_data.has_labels:
                        acc = evaluate_accuracy(model, eval_data, config.eval_batch_size, device)
                        record["eval_accuracy"] = acc
                        if best_acc is None or acc > best_acc:
                            best_acc, best_epoch = acc, epoch + 1
                            if config.keep_best:
                                best_state = {
                                    k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()
                                }
                    history.append(record)
                    if checkpoint_dir is not None:
                        rngs = (
                            dist_util.gather_objects(ckpt_util.rng_state())
                            if distributed
                            else [ckpt_util.rng_state()]
                        )
                        if main:
                            ckpt_util.save_checkpoint(
                                checkpoint_dir,
                                {
                                    "fingerprint": fp,
                                    "epoch": epoch + 1,
                                    "model": model.state_dict(),
                                    "extra_params": [p.detach() for p in extra_params],
                                    "optimizer": opt.state_dict(),
                                    "scheduler": sched.state_dict(),
                                    "scaler": scaler.state_dict() if scaler is not None else None,
                                    "rng": rngs,
                                    "history": history,
                                    "best_accuracy": best_acc,
                                    "best_epoch": best_epoch,
                                    "best_state": best_state,
                                },
                            )
                    if logger is not None:
                        logger.epoch(record)
        finally:
            if logger is not None:
                logger.close()
        if config.keep_best and best_state is not None:
            model.load_state_dict(best_state)
    model.eval()
    if orig_device is not None:
        model.to(orig_device)
        if isinstance(loss_fn, torch.nn.Module):
            loss_fn.to(orig_device)
    return TrainResult(model, history, best_epoch, best_acc, resumed_from, world)


def _batches_per_epoch(data: Dataset, batch_size: int, world: int) -> int:
    per_rank = math.ceil(len(data) / world) if world > 1 else len(data)
    return -(-per_rank // batch_size)


def _device_of(model: Any) -> Any:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    return None


def _autocast(device: Any, precision: str):
    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _note(text: str) -> None:
    import sys

    print(text, file=sys.stderr)


class _Logger:
    """TensorBoard scalars (per optimizer step and per epoch) and one JSON line per epoch."""

    def __init__(self, log_dir: Any, metrics_file: Any, history: list[dict[str, Any]], start_step: int):
        self.writer = None
        self.step_no = start_step
        if metrics_file is None and log_dir is not None:
            metrics_file = Path(log_dir) / "metrics.jsonl"
        self.metrics_file = Path(metrics_file) if metrics_file is not None else None
        if self.metrics_file is not None:
            # a resumed run rewrites what the checkpoint knows, dropping lines of an epoch it lost
            from ptopt.core.artifact import write_text_atomic

            write_text_atomic(self.metrics_file, "".join(json.dumps(r) + "\n" for r in history))
        if log_dir is not None:
            try:
                import tensorboard  # noqa: F401 - torch.utils.tensorboard needs it
            except ImportError:
                from ptopt.core.errors import MissingDependencyError

                raise MissingDependencyError(
                    "--log-dir writes TensorBoard logs, which need the tensorboard "
                    "package: pip install 'ptopt[tensorboard]'"
                ) from None
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(log_dir), purge_step=start_step or None)

    def step(self, loss: float, lr: float) -> None:
        self.step_no += 1
        if self.writer is not None:
            self.writer.add_scalar("train/loss_step", loss, self.step_no)
            self.writer.add_scalar("train/lr", lr, self.step_no)

    def epoch(self, record: dict[str, Any]) -> None:
        if self.metrics_file is not None:
            with open(self.metrics_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for k, v in record.items():
                if k != "epoch" and isinstance(v, (int, float)):
                    self.writer.add_scalar(f"epoch/{k}", v, record["epoch"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


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

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
