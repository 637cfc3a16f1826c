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

from ptopt.compress import checkpoint as ckpt_util
from ptopt.compress import distributed as dist_util
from ptopt.core.config import Config, register_config
from ptopt.core.data import Batch, Dataset
from ptopt.core.errors import UsageError
from ptopt.core.inputspec import batch_size_of, call_model
from ptopt.core.options import option

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
    epochs: int = option(3, help="Training epochs.")
    batch_size: int = option(64, help="Training batch size (per process under torchrun).")
    lr: float = option(1e-3, help="Peak learning rate (AdamW, warmup + cosine).")
    weight_decay: float = option(0.01, help="AdamW weight decay.")
    warmup_fraction: float = option(
        0.05, help="Fraction of all optimizer steps spent warming the learning rate up linearly from 0."
    )
    grad_clip: float | None = option(1.0, help="Max gradient norm (0: off).")
    grad_accum_steps: int = option(1, help="Batches whose gradients add up before each optimizer step.")
    seed: int = option(0, help="Seed of the shuffling and of any fresh weights.")
    keep_best: bool = option(
        True,
        help="After training, restore the weights of the epoch with the best eval accuracy.",
        toggle=True,
    )
    eval_batch_size: int = 256
    precision: str = option(
        "fp32",
        help="Mixed precision: bf16 autocast (CPU or CUDA), fp16 with a GradScaler (CUDA).",
        choices=PRECISIONS,
    )
    device: str = option("cpu", help="auto (CUDA when available), cpu, cuda or cuda:N.")

    def __post_init__(self) -> None:
        if self.grad_clip is not None and self.grad_clip <= 0:  # 0: off, as the CLI spells it
            object.__setattr__(self, "grad_clip", None)
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
    progress: bool | str = True,
    *,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    log_dir: str | os.PathLike | None = None,
    metrics_file: str | os.PathLike | None = None,
    fingerprint_extra: dict[str, Any] | None = None,
) -> TrainResult:
    """Train ``model`` in place and return it with per-epoch history.

    Trained: the model's parameters plus those of an nn.Module ``loss_fn`` (distillation projections).
    ``progress``: a rich bar named "train", or named by the string given; False: none.
    ``checkpoint_dir``: write a checkpoint there after every epoch; with ``resume``, continue from it
    (a missing checkpoint starts from scratch; another configuration's checkpoint is a UsageError).
    ``log_dir``: TensorBoard event files plus ``metrics.jsonl`` (or ``metrics_file``: one JSON record
    per epoch). ``fingerprint_extra``: what else decides the result (loss options, teacher weights),
    compared on resume.
    """
    import torch

    loss_fn = loss_fn or cross_entropy_loss
    _check_request(train_data, loss_fn, resume, checkpoint_dir)
    device = dist_util.resolve_device(config.device)
    if config.precision == "fp16" and device.type != "cuda":
        raise UsageError("fp16 training needs CUDA; use bf16 mixed precision on CPU")
    orig_device = _device_of(model)
    movable = [model, loss_fn] if isinstance(loss_fn, torch.nn.Module) else [model]
    for m in movable:
        m.to(device)

    with dist_util.process_group(device) as distributed:
        run = _Training(model, train_data, eval_data, config, loss_fn, device, distributed)
        if checkpoint_dir is not None:
            run.use_checkpoints(checkpoint_dir, fingerprint_extra)
        if resume:
            run.resume(epoch_hooks)
        logger = (
            _Logger(log_dir, metrics_file, run.history, run.start_epoch * run.steps_per_epoch)
            if run.main
            else None
        )
        try:
            with _progress(bool(progress) and run.main) as bar:
                description = progress if isinstance(progress, str) else "train"
                run.fit(epoch_hooks, logger, _EpochBar(bar, description, run))
        finally:
            if logger is not None:
                logger.close()
        if config.keep_best and run.best_state is not None:
            model.load_state_dict(run.best_state)
    model.eval()
    if orig_device is not None:
        for m in movable:
            m.to(orig_device)
    return TrainResult(model, run.history, run.best_epoch, run.best_acc, run.resumed_from, run.world)


def _check_request(train_data: Dataset, loss_fn: Any, resume: bool, checkpoint_dir: Any) -> None:
    """Refuse what cannot train before anything moves: no labels for cross-entropy, no samples, a
    resume without a checkpoint directory."""
    if loss_fn is cross_entropy_loss:
        train_data.require_labels("training with cross-entropy")
    if len(train_data) == 0:
        raise UsageError("no training samples")
    if resume and checkpoint_dir is None:
        raise UsageError("resume needs a checkpoint directory (--checkpoint-dir)")


class _Training:
    """One run of :func:`train`: optimizer, schedule and scaler, the best-so-far record, the epoch and
    step loops, and the checkpoint that resumes them.

    The order of every random draw (seed, shuffles, dropout) and of every optimizer/scheduler call is
    what makes a resumed run end bit for bit where an uninterrupted one does: keep it when editing.
    """

    def __init__(
        self,
        model: Any,
        data: Dataset,
        eval_data: Dataset | None,
        config: TrainConfig,
        loss_fn: Any,
        device: Any,
        distributed: bool,
    ):
        import torch

        self.model, self.data, self.eval_data, self.config = model, data, eval_data, config
        self.loss_fn, self.device, self.distributed = loss_fn, device, distributed
        self.world = dist_util.world_size() if distributed else 1
        self.main = dist_util.rank() == 0
        torch.manual_seed(config.seed)
        self.params = _trainable_params(model, loss_fn)
        own = {id(p) for p in model.parameters()}
        #: trained parts outside the model (distillation projections): checkpointed and averaged by hand
        self.extra_params = [p for p in self.params if id(p) not in own]
        self.runner = _data_parallel(model, device) if distributed else model
        self.opt = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay)
        self.n_batches = _batches_per_epoch(data, config.batch_size, self.world)
        self.steps_per_epoch = math.ceil(self.n_batches / config.grad_accum_steps)
        total = self.steps_per_epoch * config.epochs
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, warmup_cosine(total, int(total * config.warmup_fraction))
        )
        self.scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None
        self.autocast = _autocast(device, config.precision)
        self.checkpoint_dir: Any = None
        self.fingerprint: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self.best_acc: float | None = None
        self.best_epoch: int | None = None
        self.best_state: dict[str, Any] | None = None
        self.start_epoch, self.resumed_from = 0, None

    # -- resume and checkpoint ---------------------------------------------------------------------
    def use_checkpoints(self, checkpoint_dir: Any, fingerprint_extra: dict[str, Any] | None) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.fingerprint = ckpt_util.fingerprint(
            self.config, self.model, self.data, self.eval_data, self.world, fingerprint_extra
        )

    def resume(self, epoch_hooks: Sequence[EpochHook]) -> None:
        """Continue from the checkpoint, if there is one yet (another configuration's is refused)."""
        import torch

        ckpt = ckpt_util.load_checkpoint(self.checkpoint_dir, self.fingerprint)  # type: ignore[arg-type]
        if ckpt is None:
            if self.main:
                _note(f"no checkpoint in {self.checkpoint_dir} yet: starting from scratch")
            return
        for epoch in range(ckpt["epoch"]):
            for hook in epoch_hooks:
                hook(epoch, self.model)
        self.model.load_state_dict(ckpt["model"])
        with torch.no_grad():
            for p, saved in zip(self.extra_params, ckpt["extra_params"], strict=False):
                p.copy_(saved)
        self.opt.load_state_dict(ckpt["optimizer"])
        self.sched.load_state_dict(ckpt["scheduler"])
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        rngs = ckpt["rng"]
        ckpt_util.set_rng_state(rngs[dist_util.rank() % len(rngs)] if self.distributed else rngs[0])
        self.history = list(ckpt["history"])
        self.best_acc, self.best_epoch = ckpt["best_accuracy"], ckpt["best_epoch"]
        self.best_state = ckpt["best_state"]
        self.start_epoch = self.resumed_from = int(ckpt["epoch"])

    def save_checkpoint(self, epochs_done: int) -> None:
        """Every rank's RNG state, everything else from rank 0 (only rank 0 writes)."""
        rngs = (
            dist_util.gather_objects(ckpt_util.rng_state()) if self.distributed else [ckpt_util.rng_state()]
        )
        if not self.main:
            return
        ckpt_util.save_checkpoint(
            self.checkpoint_dir,
            {
                "fingerprint": self.fingerprint,
                "epoch": epochs_done,
                "model": self.model.state_dict(),
                "extra_params": [p.detach() for p in self.extra_params],
                "optimizer": self.opt.state_dict(),
                "scheduler": self.sched.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": rngs,
                "history": self.history,
                "best_accuracy": self.best_acc,
                "best_epoch": self.best_epoch,
                "best_state": self.best_state,
            },
        )

    # -- epochs ------------------------------------------------------------------------------------
    def fit(self, epoch_hooks: Sequence[EpochHook], logger: _Logger | None, bar: _EpochBar) -> None:
        for epoch in range(self.start_epoch, self.config.epochs):
            for hook in epoch_hooks:
                hook(epoch, self.model)
            record = self.run_epoch(epoch, logger, bar)
            self.evaluate(epoch, record)
            self.history.append(record)
            if self.checkpoint_dir is not None:
                self.save_checkpoint(epoch + 1)
            if logger is not None:
                logger.epoch(record)

    def run_epoch(self, epoch: int, logger: _Logger | None, bar: _EpochBar) -> dict[str, Any]:
        """One pass over this rank's shard; the epoch's record (loss, accuracy, lr, throughput)."""
        self.model.train()
        stats = _EpochStats()
        self.opt.zero_grad(set_to_none=True)
        for i, batch in enumerate(self._batches(epoch)):
            batch = to_device(batch, self.device)
            stepping = (i + 1) % self.config.grad_accum_steps == 0 or i + 1 == self.n_batches
            loss, logits = self.forward_backward(batch, stepping)
            if stepping:
                self.optimizer_step()
            loss_value = stats.add(batch, loss, logits)
            if logger is not None and stepping:
                logger.step(loss_value, self.sched.get_last_lr()[0])
            bar.advance(epoch, stats, self.world)
        elapsed = max(time.perf_counter() - stats.t0, 1e-9)
        if self.distributed:
            dist_util.broadcast_buffers(self.model)
            stats.sum_over_ranks(self.device)
        return {
            "epoch": epoch + 1,
            "loss": stats.loss_sum / max(stats.seen, 1),
            "train_accuracy": stats.correct / stats.labelled if stats.labelled else None,
            "lr": self.sched.get_last_lr()[0],
            "samples_per_s": stats.seen / elapsed,
        }

    def _batches(self, epoch: int) -> Any:
        if self.distributed:
            indices = dist_util.shard_indices(len(self.data), epoch, self.config.seed)
            return self.data.batches(self.config.batch_size, indices=indices)
        return self.data.batches(self.config.batch_size, shuffle=True, seed=self.config.seed + epoch)

    def evaluate(self, epoch: int, record: dict[str, Any]) -> None:
        """Held-out accuracy into ``record``; remember the best epoch (and its weights with keep_best)."""
        if self.eval_data is None or not self.eval_data.has_labels:
            return
        acc = evaluate_accuracy(self.model, self.eval_data, self.config.eval_batch_size, self.device)
        record["eval_accuracy"] = acc
        if self.best_acc is None or acc > self.best_acc:
            self.best_acc, self.best_epoch = acc, epoch + 1
            if self.config.keep_best:
                self.best_state = {
                    k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
                }

    # -- steps -------------------------------------------------------------------------------------
    def forward_backward(self, batch: Batch, stepping: bool) -> tuple[Any, Any]:
        """Loss and gradients of one batch; DDP syncs gradients only on the batch that steps."""
        sync = self.runner.no_sync() if self.distributed and not stepping else contextlib.nullcontext()
        with sync:
            with self.autocast:
                loss, logits = self.loss_fn(self.runner, batch)
            scaled = loss.float() / self.config.grad_accum_steps
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return loss, logits

    def optimizer_step(self) -> None:
        import torch

        if self.distributed and self.extra_params:
            dist_util.average_gradients(self.extra_params)
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        if self.config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.opt)  # skipped when the scaled gradients overflowed
            self.scaler.update()
            with warnings.catch_warnings():
                # the schedule follows steps taken, not steps the scaler skipped
                warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
                self.sched.step()
        else:
            self.opt.step()
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)


def _trainable_params(model: Any, loss_fn: Any) -> list[Any]:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(loss_fn, torch.nn.Module):
        params += [p for p in loss_fn.parameters() if p.requires_grad]
    return params


def _data_parallel(model: Any, device: Any) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


@dataclasses.dataclass
class _EpochStats:
    """Running sums of one epoch on this rank (summed over ranks at the epoch's end)."""

    t0: float = dataclasses.field(default_factory=time.perf_counter)
    seen: int = 0
    loss_sum: float = 0.0
    correct: int = 0
    labelled: int = 0

    def add(self, batch: Batch, loss: Any, logits: Any) -> float:
        """Count one batch; returns its loss as a float."""
        n = batch_size_of(batch.x)
        self.seen += n
        loss_value = float(loss.detach())
        self.loss_sum += loss_value * n
        if logits is not None and batch.y is not None:
            self.correct += int((logits.detach().argmax(-1) == batch.y).sum())
            self.labelled += n
        return loss_value

    def sum_over_ranks(self, device: Any) -> None:
        seen, loss_sum, correct, labelled = dist_util.all_reduce_sum(
            [self.seen, self.loss_sum, self.correct, self.labelled], device
        )
        self.seen, self.correct, self.labelled = int(seen), int(correct), int(labelled)
        self.loss_sum = loss_sum


class _EpochBar:
    """The progress line: epoch, running loss and accuracy, samples per second over all ranks."""

    def __init__(self, bar: Any, description: str, run: _Training):
        self.bar, self.description, self.epochs = bar, description, run.config.epochs
        self.task = (
            bar.add_task(
                description, total=self.epochs * run.n_batches, completed=run.start_epoch * run.n_batches
            )
            if bar
            else None
        )

    def advance(self, epoch: int, stats: _EpochStats, world: int) -> None:
        if not self.bar:
            return
        rate = stats.seen * world / max(time.perf_counter() - stats.t0, 1e-9)
        acc = f" acc {stats.correct / stats.labelled:.3f}" if stats.labelled else ""
        self.bar.update(
            self.task,
            advance=1,
            description=f"{self.description} epoch {epoch + 1}/{self.epochs} "
            f"loss {stats.loss_sum / stats.seen:.4f}{acc} {rate:.0f}/s",
        )


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
