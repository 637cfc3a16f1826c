"""The shared training loop: zoo recipes, QAT, pruning fine-tuning and distillation all use it.

AdamW, linear warmup then cosine decay, gradient clipping and accumulation, mixed precision (bf16
autocast on CPU; fp16 with a GradScaler or bf16 on CUDA), evaluation after each epoch on held-out data
keeping the best weights, a rich progress bar (loss, accuracy, throughput), TensorBoard logs and a
JSONL metrics file, sharded checkpoints (``torch.distributed.checkpoint``) after every epoch and every ``checkpoint_every``
steps that ``resume`` continues from, on the same or another number of processes (a resumed run ends
with the same weights as an uninterrupted one; resumed with a larger ``max_steps`` or ``epochs``, it trains
on to the new total), and training across processes under ``torchrun`` with
torch's DistributedDataParallel or FSDP2 (``ptopt.compress.distributed``). Deterministic for a seed;
the global batch, its order and the loss are the same whatever the number of processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.compress import checkpoint as ckpt_util
from ptopt.compress import distributed as dist_util
from ptopt.compress import train_state
from ptopt.core.config import Config, register_config
from ptopt.core.data import Batch, Dataset
from ptopt.core.errors import UsageError
from ptopt.core.inputspec import batch_size_of, call_model
from ptopt.core.options import option

#: loss_fn(model, batch) -> (loss, logits); logits may be None when accuracy makes no sense. The loss is
#: a mean over the batch's samples, or over what ``loss_fn.weight(batch)`` counts (an LM loss: the
#: tokens it scores), so that slices of a global batch on several processes add up to its loss.
#: A loss_fn that is an nn.Module is moved to the training device, and its parameters are trained too;
#: ``loss_fn.frozen_modules()`` (a teacher) are sharded with FSDP like the model.
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
    batch_size: int = option(
        64,
        help="Training batch size: the global batch, all processes together (each trains on an equal slice).",
    )
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
    max_steps: int | None = option(
        None,
        help="Stop after this many optimizer steps (the learning-rate schedule spans them).",
        metavar="N",
    )
    strategy: str = option(
        "auto",
        help="Across processes (torchrun or --nproc): ddp (DistributedDataParallel) or fsdp (FSDP2 fully_shard); "
        "auto: ddp under torchrun, else one process (none).",
        choices=dist_util.STRATEGIES,
    )
    shard_modules: tuple[str, ...] = option(
        (),
        help="FSDP wrap unit: a module path, a pattern (layers.*) or a class name; repeatable (default: a "
        "Hugging Face model's transformer blocks).",
        flag="--shard-module",
        metavar="NAME",
        repeat=True,
    )
    fsdp_param_dtype: str = option(
        "fp32",
        help="FSDP MixedPrecisionPolicy: the dtype parameters are gathered and computed in.",
        choices=dist_util.DTYPES,
    )
    fsdp_reduce_dtype: str = option(
        "fp32",
        help="FSDP MixedPrecisionPolicy: the dtype gradients are reduced in.",
        choices=dist_util.DTYPES,
    )
    cpu_offload: bool = option(
        False,
        help="FSDP CPUOffloadPolicy: sharded parameters, gradients and optimizer state live on the CPU.",
    )
    checkpoint_every: int | None = option(
        None,
        help="Also write a checkpoint every this many optimizer steps (with --checkpoint-dir; default: after every "
        "epoch only).",
        metavar="N",
    )

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
        for name in ("max_steps", "checkpoint_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.strategy not in dist_util.STRATEGIES:
            raise UsageError(
                f"strategy must be one of {', '.join(dist_util.STRATEGIES)}, got {self.strategy!r}"
            )
        for name in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
            if getattr(self, name) not in dist_util.DTYPES:
                raise UsageError(
                    f"{name} must be one of {', '.join(dist_util.DTYPES)}, got {getattr(self, name)!r}"
                )
        dtypes = (self.fsdp_param_dtype, self.fsdp_reduce_dtype)
        if (self.shard_modules or self.cpu_offload or dtypes != ("fp32", "fp32")) and self.strategy != "fsdp":
            raise UsageError(
                "--shard-module, --fsdp-param-dtype, --fsdp-reduce-dtype and --cpu-offload apply to --strategy fsdp"
            )
        object.__setattr__(self, "shard_modules", tuple(self.shard_modules))


@dataclasses.dataclass
class TrainResult:
    model: Any
    history: list[dict[str, Any]]
    best_epoch: int | None
    best_accuracy: float | None
    #: epochs already done by the checkpoint this run resumed from (None: started from scratch)
    resumed_from_epoch: int | None = None
    world_size: int = 1
    #: the loss of every optimizer step (the global batch's, averaged over its accumulated batches)
    step_losses: list[float] = dataclasses.field(default_factory=list)
    #: optimizer steps the checkpoint this run resumed from had done (None: started from scratch)
    resumed_from_step: int | None = None
    strategy: str = "none"
    #: under FSDP, the sharded model (every rank); ``model`` is the gathered one on rank 0
    sharded: Any = None

    def summary(self) -> dict[str, Any]:
        """What a sidecar records of the run: history, processes, strategy, steps, resumption."""
        last = self.history[-1] if self.history else {}
        return {
            "history": self.history,
            "world_size": self.world_size,
            "strategy": self.strategy,
            "steps": len(self.step_losses),
            "final_step_loss": self.step_losses[-1] if self.step_losses else None,
            "step_losses": self.step_losses,
            "peak_rss_mb_per_rank": last.get("peak_rss_mb"),
            "tokens_per_s": last.get("tokens_per_s"),
            "resumed_from_epoch": self.resumed_from_epoch,
            "resumed_from_step": self.resumed_from_step,
        }


def model_logits(model: Any, x: Any) -> Any:
    """``model(x)``'s primary output (``core.tensors.primary_output``: a Hugging Face model's
    ``logits``, the first of a tuple), the tensor losses and accuracy read; anything else as it is."""
    from ptopt.core.tensors import primary_output

    out = call_model(model, x)
    try:
        return primary_output(out)
    except TypeError:
        return out


def cross_entropy_loss(model: Any, batch: Batch) -> tuple[Any, Any]:
    import torch.nn.functional as F

    logits = model_logits(model, batch.x)
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

    Under torchrun each rank scores its share of the samples (every rank the same number of batches:
    a sharded model's forward is collective) and the counts are summed.
    """
    import torch

    data.require_labels("accuracy")
    was_training = getattr(model, "training", False)
    model.eval()
    distributed = dist_util.is_distributed()
    correct = total = 0
    with torch.no_grad() if distributed else torch.inference_mode():
        for b, counts in eval_batches(data, batch_size, distributed):
            b = to_device(b, device) if device is not None else b
            if counts:
                correct += int((model_logits(model, b.x).argmax(-1) == b.y).sum())
                total += int(b.y.shape[0])
            else:
                call_model(model, b.x)  # a rank out of samples still takes part
    if distributed:
        correct, total = dist_util.all_reduce_sum([correct, total], _device_of(model))
    if was_training:
        model.train()
    return correct / max(total, 1)


def eval_batches(data: Dataset, batch_size: int, distributed: bool) -> Iterator[tuple[Batch, bool]]:
    """(batch, counts) over ``data``: all of it, or under torchrun this rank's contiguous share, in as
    many batches as every other rank (a rank past its share runs one sample that does not count)."""
    import torch

    if not distributed:
        for b in data.batches(batch_size):
            yield b, True
        return
    world, r, n = dist_util.world_size(), dist_util.rank(), len(data)
    per = -(-n // world)
    start, end = min(r * per, n), min((r + 1) * per, n)
    for lo in range(start, start + max(per, 1), batch_size):
        hi = min(lo + batch_size, end)
        idx = torch.arange(lo, hi) if lo < hi else torch.zeros(1, dtype=torch.long)
        b = data.select(idx)
        yield Batch(b.x, b.y), lo < hi


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
    ``checkpoint_dir``: write a checkpoint there after every epoch (and every ``checkpoint_every``
    steps); with ``resume``, continue from it (a missing checkpoint starts from scratch; another
    configuration's checkpoint is a UsageError; without ``resume`` an existing one is refused, never
    written over). ``log_dir``: TensorBoard event files plus ``metrics.jsonl`` (or ``metrics_file``:
    one JSON record per epoch). ``fingerprint_extra``: what else decides the result (loss options,
    teacher weights), compared on resume. Under ``strategy="fsdp"`` the model given is sharded in
    place; the returned ``model`` (rank 0) is a new module holding the gathered weights.
    """
    import torch

    loss_fn = loss_fn or cross_entropy_loss
    _check_request(train_data, loss_fn, resume, checkpoint_dir)
    strategy = dist_util.resolve_strategy(config.strategy)
    device = dist_util.resolve_device(config.device)
    if config.precision == "fp16" and device.type != "cuda":
        raise UsageError("fp16 training needs CUDA; use bf16 mixed precision on CPU")
    policies = (
        dist_util.fsdp_policies(config.fsdp_param_dtype, config.fsdp_reduce_dtype, config.cpu_offload, device)
        if strategy == "fsdp"
        else {}
    )
    dist_util.check_batch(config.batch_size, dist_util.env_world_size())
    if checkpoint_dir is not None and not resume and dist_util.is_main_process():
        ckpt_util.refuse_existing(checkpoint_dir)
    orig_device = _device_of(model)
    movable = [model, loss_fn] if isinstance(loss_fn, torch.nn.Module) else [model]
    for m in movable:
        m.to(device)

    with dist_util.process_group(device):
        run = _Training(model, train_data, eval_data, config, loss_fn, device, strategy, policies)
        if checkpoint_dir is not None:
            run.use_checkpoints(checkpoint_dir, fingerprint_extra)
        if resume:
            run.resume(epoch_hooks)
        _fit_logged(run, epoch_hooks, progress, log_dir, metrics_file)
        trained = run.finish()
    if trained is not None:
        trained.eval()
        if orig_device is not None and trained is model:
            for m in movable:
                m.to(orig_device)
    return TrainResult(
        trained, run.history, run.best_epoch, run.best_acc, run.resumed_from, run.world,
        run.step_losses, run.resumed_step, strategy, run.step.model if strategy == "fsdp" else None,
    )  # fmt: skip


def _fit_logged(
    run: _Training, epoch_hooks: Sequence[EpochHook], progress: Any, log_dir: Any, metrics_file: Any
) -> None:
    logger = _Logger(log_dir, metrics_file, run.history, run.step_no) if run.main else None
    try:
        with _progress(bool(progress)) if run.main else _NoBar() as bar:
            description = progress if isinstance(progress, str) else "train"
            run.fit(epoch_hooks, logger, _EpochBar(bar, description, run))
    finally:
        if logger is not None:
            logger.close()


def _check_request(train_data: Dataset, loss_fn: Any, resume: bool, checkpoint_dir: Any) -> None:
    """Refuse what cannot train before anything moves: no labels for cross-entropy, no samples, a
    resume without a checkpoint directory."""
    if loss_fn is cross_entropy_loss:
        train_data.require_labels("training with cross-entropy")
    if len(train_data) == 0:
        raise UsageError("no training samples")
    if resume and checkpoint_dir is None:
        raise UsageError("resume needs a checkpoint directory (--checkpoint-dir)")


def _step_module(model: Any, loss_fn: Any) -> Any:
    """The trained model and the trained parts of the loss as one module, so that DDP and the state
    dicts see every trained parameter; calling it runs the loss on a batch."""
    import torch

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            if isinstance(loss_fn, torch.nn.Module):
                self.loss = loss_fn
            self._loss_fn = [loss_fn]  # a list: the loss is called, never registered twice

        def forward(self, batch: Batch) -> Any:
            return self._loss_fn[0](self.model, batch)

    return Step()


class _Training:
    """One run of :func:`train`: the wrapped modules, optimizer, schedule and scaler, the best-so-far
    record, the epoch and step loops, and the checkpoint that resumes them.

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
        strategy: str,
        policies: dict[str, Any],
    ):
        import torch

        self.data, self.eval_data, self.config = data, eval_data, config
        self.loss_fn, self.device, self.strategy = loss_fn, device, strategy
        self.distributed = dist_util.is_distributed()
        self.world = dist_util.world_size() if self.distributed else 1
        self.main = dist_util.rank() == 0
        torch.manual_seed(config.seed)
        self.step = _step_module(model, loss_fn)
        self.fingerprint_model = model
        self.shell = dist_util.skeleton(model) if strategy == "fsdp" and self.main else None
        self.runner = self._wrap(policies)
        self.params = [p for p in self.step.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay)
        self.n_batches = -(-len(data) // config.batch_size)
        self.steps_per_epoch = math.ceil(self.n_batches / config.grad_accum_steps)
        self.total_steps = self.steps_per_epoch * config.epochs
        if config.max_steps is not None:
            self.total_steps = min(self.total_steps, config.max_steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, warmup_cosine(self.total_steps, int(self.total_steps * config.warmup_fraction))
        )
        self.scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None
        self.autocast = _autocast(device, config.precision)
        self.checkpoint_dir: Any = None
        self.fingerprint: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self.step_losses: list[float] = []
        self.best_acc: float | None = None
        self.best_epoch: int | None = None
        self.best_state: dict[str, Any] | None = None
        self.start_epoch, self.start_batch, self.step_no = 0, 0, 0
        self.resumed_from: int | None = None
        self.resumed_step: int | None = None
        self.carried: dict[str, Any] | None = None  # the epoch stats a mid-epoch checkpoint carried
        self.cut: tuple[int, dict[str, Any]] | None = None  # (next batch, sums) of an epoch max_steps ended

    def _wrap(self, policies: dict[str, Any]) -> Any:
        """The module each step calls: the step module, in DDP, or with its parts sharded by FSDP."""
        if self.strategy == "ddp":
            return dist_util.data_parallel(self.step)
        if self.strategy == "fsdp":
            if self.device.type == "cpu":
                dist_util.return_freed_memory()
            model = self.step.model
            dist_util.shard(model, dist_util.shard_units(model, self.config.shard_modules), policies)
            loss = getattr(self.step, "loss", None)
            if loss is not None and any(p.requires_grad for p in loss.parameters()):
                dist_util.shard(loss, [], policies)
            for frozen in _frozen_modules(self.loss_fn):
                units = dist_util.shard_units(frozen, self.config.shard_modules, strict=False)
                dist_util.shard(frozen, units, policies, frozen=True)
        return self.step

    # -- resume and checkpoint ---------------------------------------------------------------------
    def use_checkpoints(self, checkpoint_dir: Any, fingerprint_extra: dict[str, Any] | None) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.fingerprint = ckpt_util.fingerprint(
            self.config, self.fingerprint_model, self.data, self.eval_data, fingerprint_extra
        )

    def resume(self, epoch_hooks: Sequence[EpochHook]) -> None:
        """Continue from the checkpoint, if there is one yet (another configuration's is refused)."""
        folder = ckpt_util.latest_checkpoint(self.checkpoint_dir)
        if folder is None:
            if self.main:
                _note(f"no checkpoint in {self.checkpoint_dir} yet: starting from scratch")
            return
        state = ckpt_util.read_trainer_state(folder, self.fingerprint)  # type: ignore[arg-type]
        pos = state["position"]
        for epoch in range(pos["epoch"] + (1 if pos["batch"] else 0)):
            for hook in epoch_hooks:
                hook(epoch, self.step.model)
        train_state.load(self, folder, state)
        self.start_epoch, self.start_batch, self.step_no = pos["epoch"], pos["batch"], pos["step"]
        self.resumed_from, self.resumed_step = pos["epoch"], pos["step"]
        self._new_length(state["fingerprint"]["train"])
        cut = bool(pos["batch"]) and bool(self.history) and self.history[-1]["epoch"] == pos["epoch"] + 1
        if cut and self.step_no < self.total_steps:
            self.history.pop()  # the epoch --max-steps ended early now runs on to its end: recorded anew

    def _new_length(self, saved: dict[str, Any]) -> None:
        """A resumed run whose length (``epochs``, ``max_steps``) is the checkpoint's continues as it
        was. A longer one trains on from the checkpoint's step to the new total, its learning-rate
        schedule spanning the new total from here on (the checkpoint's run had set the rate of its own
        schedule, which ends at 0 where it stopped). One the checkpoint already reached trains nothing:
        the result is the checkpoint's model."""
        now = {k: getattr(self.config, k) for k in ckpt_util.LENGTH_FIELDS}
        by_steps = (
            self.config.max_steps is not None
            and self.config.max_steps <= self.steps_per_epoch * self.config.epochs
        )
        limit = f"--max-steps {self.config.max_steps}" if by_steps else f"--epochs {self.config.epochs}"
        if self.step_no >= self.total_steps:
            if self.main:
                _note(
                    f"the run in {self.checkpoint_dir} already reached step {self.step_no}, and {limit} "
                    f"({self.total_steps} optimizer steps) asks for no more: nothing is trained, the result is "
                    "the checkpoint's model (a larger --max-steps or --epochs trains on)"
                )
            return
        if all(saved.get(k) == v for k, v in now.items()):
            return
        for i, group in enumerate(self.opt.param_groups):
            group["lr"] = self.sched.base_lrs[i] * self.sched.lr_lambdas[i](self.sched.last_epoch)
        if self.main:
            was = ", ".join(
                f"{k} {'unset' if saved.get(k) is None else saved[k]}" for k in ckpt_util.LENGTH_FIELDS
            )
            _note(
                f"training on from step {self.step_no} to {self.total_steps} ({limit}; the checkpoint's run "
                f"had {was}); the learning-rate schedule now spans {self.total_steps} steps"
            )

    def save_checkpoint(self, epoch: int, batch: int, stats: _EpochStats | None) -> None:
        """Every rank writes its shard; rank 0 the rest (``ptopt.compress.checkpoint``)."""
        position = {"epoch": epoch, "batch": batch, "step": self.step_no}
        self._write_checkpoint(position, self._global_stats(stats) if stats is not None else None)

    def _write_checkpoint(self, position: dict[str, int], stats: dict[str, Any] | None) -> None:
        """``train_state.save`` as a step of its own: a slow write's heartbeat names it (it repeated the
        epoch's last batch count, as if training had stalled)."""
        from ptopt.core import progress

        name = ckpt_util.step_name(position["step"])
        with progress.step(f"writing checkpoint {name} in {self.checkpoint_dir}", announce=False):
            train_state.save(self, position, stats)

    def _global_stats(self, stats: _EpochStats) -> dict[str, Any]:
        """An unfinished epoch's running sums over every rank (collective): rank 0 carries them on resume
        and the other ranks start from zero (``train_state.load``), on any number of processes. Rank 0's
        own sums alone made a resumed epoch's loss and accuracy count its slice twice and the others'
        not at all."""
        record = dataclasses.replace(stats)
        if self.distributed:
            record.sum_over_ranks(self.device)
        return dataclasses.asdict(record)

    # -- epochs ------------------------------------------------------------------------------------
    def fit(self, epoch_hooks: Sequence[EpochHook], logger: _Logger | None, bar: _EpochBar) -> None:
        for epoch in range(self.start_epoch, self.config.epochs):
            if self.step_no >= self.total_steps:
                break
            if not (epoch == self.start_epoch and self.start_batch):
                for hook in epoch_hooks:
                    hook(epoch, self.step.model)
            record = self.run_epoch(epoch, logger, bar)
            self.evaluate(epoch, record)
            self.history.append(record)
            if self.checkpoint_dir is not None:
                cut, self.cut = self.cut, None
                # an epoch that max_steps ended early resumes (with a larger max_steps) at its next batch
                position = {"epoch": epoch, "batch": cut[0]} if cut else {"epoch": epoch + 1, "batch": 0}
                self._write_checkpoint(position | {"step": self.step_no}, cut[1] if cut else None)
            if logger is not None:
                logger.epoch(record)

    def run_epoch(self, epoch: int, logger: _Logger | None, bar: _EpochBar) -> dict[str, Any]:
        """One pass over this rank's share of the epoch's global batches; the epoch's record."""
        self.step.train()
        first = self.start_batch if epoch == self.start_epoch else 0
        stats = _EpochStats(**self.carried) if first and self.carried else _EpochStats()
        stats.t0, stats.carried = time.perf_counter() - stats.elapsed, (stats.seen, stats.tokens)
        self.opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for i, (batch, weight, total) in self._batches(epoch, first):
            stepping = (i + 1) % self.config.grad_accum_steps == 0 or i + 1 == self.n_batches
            loss, logits = self.forward_backward(batch, stepping, weight * self.world / total)
            step_loss += float(loss.detach()) * weight / total
            stats.add(batch, loss, logits, weight)
            bar.advance(epoch, stats, self.world)
            if not stepping:
                continue
            lr = self.opt.param_groups[0]["lr"]  # the rate this step uses (after it, the next one's)
            self.optimizer_step()
            self._step_done(step_loss / ((i % self.config.grad_accum_steps) + 1), lr, logger)
            step_loss = 0.0
            if self._checkpoint_due(i):
                stats.elapsed = time.perf_counter() - stats.t0
                self.save_checkpoint(epoch, i + 1, stats)
            if self.step_no >= self.total_steps:
                if i + 1 < self.n_batches and self.checkpoint_dir is not None:
                    stats.elapsed = time.perf_counter() - stats.t0
                    self.cut = (i + 1, self._global_stats(stats))
                break
        return self._epoch_record(epoch, stats)

    def _step_done(self, local_loss: float, lr: float, logger: _Logger | None) -> None:
        """Count the step; its loss over every rank's slice and the rate it used into the step record
        (and the log)."""
        self.step_no += 1
        loss = dist_util.all_reduce_sum([local_loss], self.device)[0] if self.distributed else local_loss
        self.step_losses.append(loss)
        if logger is not None:
            logger.step(loss, lr)

    def _checkpoint_due(self, i: int) -> bool:
        every = self.config.checkpoint_every
        last_of_epoch = i + 1 == self.n_batches or self.step_no >= self.total_steps
        return (
            self.checkpoint_dir is not None
            and every is not None
            and self.step_no % every == 0
            and not last_of_epoch
        )

    def _epoch_record(self, epoch: int, stats: _EpochStats) -> dict[str, Any]:
        elapsed = max(time.perf_counter() - stats.t0, 1e-9)
        memory = dist_util.peak_memory(self.device)
        if self.distributed:
            stats.sum_over_ranks(self.device)
            memory = {k: [m[k] for m in dist_util.gather_objects(memory)] for k in memory}
        else:
            memory = {k: [v] for k, v in memory.items()}
        record = {
            "epoch": epoch + 1,
            "loss": stats.loss_sum / max(stats.weight, 1e-12),
            "train_accuracy": stats.correct / stats.labelled if stats.labelled else None,
            "lr": self.sched.get_last_lr()[0],
            "samples_per_s": stats.seen / elapsed,
            "steps": self.step_no,
        }
        if stats.tokens:
            record["tokens_per_s"] = stats.tokens / elapsed
        return record | memory

    def _batches(self, epoch: int, first: int) -> Iterator[tuple[int, tuple[Batch, float, float]]]:
        """(index, (this rank's batch, its weight, the global batch's weight)) for each global batch of
        the epoch from ``first`` on: the single-process order, each rank its slice (``distributed``)."""
        shuffle_seed = self.config.seed + epoch
        batches = dist_util.global_batches(len(self.data), self.config.batch_size, True, shuffle_seed)
        for i in range(first, len(batches)):
            idx = batches[i]
            part, counts = (
                dist_util.rank_part(idx, self.world, dist_util.rank()) if self.distributed else (idx, True)
            )
            local = to_device(_as_batch(self.data.select(part)), self.device)
            weight = _weight(self.loss_fn, local) if counts else 0.0
            total = _weight(self.loss_fn, _as_batch(self.data.select(idx))) if self.distributed else weight
            yield i, (local, weight, max(total, 1e-12))

    def evaluate(self, epoch: int, record: dict[str, Any]) -> None:
        """Held-out accuracy into ``record``; remember the best epoch (and its weights with keep_best)."""
        if self.eval_data is None or not self.eval_data.has_labels:
            return
        from ptopt.core import progress

        title = f"evaluating epoch {epoch + 1} on {self.eval_data.name} ({len(self.eval_data)} samples)"
        with progress.step(title, announce=False):  # a heartbeat names it, not the epoch's last batch count
            acc = evaluate_accuracy(self.step.model, self.eval_data, self.config.eval_batch_size, self.device)
        record["eval_accuracy"] = acc
        if self.best_acc is None or acc > self.best_acc:
            self.best_acc, self.best_epoch = acc, epoch + 1
            if self.config.keep_best:
                self.best_state = train_state.copy_state(self.step.model)

    # -- steps -------------------------------------------------------------------------------------
    def forward_backward(self, batch: Batch, stepping: bool, share: float) -> tuple[Any, Any]:
        """Loss and gradients of this rank's slice of one global batch, weighed by ``share`` (its part
        of the global batch, times the world size that DDP and FSDP divide the summed gradients by);
        DDP syncs gradients only on the batch that steps."""
        quiet = self.strategy == "ddp" and not stepping
        with self.runner.no_sync() if quiet else contextlib.nullcontext():
            with self.autocast:
                loss, logits = self.runner(batch)
            scaled = loss.float() * share / self.config.grad_accum_steps
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        return loss, logits

    def optimizer_step(self) -> None:
        import torch

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

    def finish(self) -> Any:
        """The trained model after the run: the best epoch's weights with keep_best; under FSDP the
        weights gathered into a new unsharded module on rank 0 (collective; None on other ranks). The
        optimizer's state (AdamW: twice the parameters) goes first: the run is over, and rank 0's
        gathered copy of the model would otherwise come on top of it."""
        self.opt.state.clear()
        if self.config.keep_best and self.best_state is not None:
            self.step.model.load_state_dict(self.best_state)
        if self.strategy != "fsdp":
            return self.step.model
        full = dist_util.full_state_dict(self.step.model)
        return dist_util.materialize(self.shell, full) if self.main else None


def _frozen_modules(loss_fn: Any) -> list[Any]:
    """The modules a loss runs without training them (a teacher): FSDP shards them too."""
    get = getattr(loss_fn, "frozen_modules", None)
    return list(get()) if callable(get) else []


def _weight(loss_fn: Any, batch: Batch) -> float:
    """What ``loss_fn``'s mean is over in ``batch``: ``loss_fn.weight(batch)`` or the samples."""
    get = getattr(loss_fn, "weight", None)
    return float(get(batch)) if callable(get) else float(batch_size_of(batch.x))


def _as_batch(ds: Dataset) -> Batch:
    return Batch(ds.x, ds.y)


def _tokens(x: Any) -> int:
    """Tokens in a language-model batch (attention mask, else every id); 0 for other inputs. A batch
    that carries the teacher's logits (``distill_loss.with_teacher_logits``) names its inputs
    ``__ptopt_input:dict:input_ids``: counted the same (tokens/s showed under FSDP only, which runs
    the teacher per batch)."""
    if not isinstance(x, dict):
        return 0
    named = {k.rsplit(":", 1)[-1] if k.startswith("__ptopt_input:dict:") else k: v for k, v in x.items()}
    if "input_ids" not in named:
        return 0
    mask = named.get("attention_mask")
    return int(mask.sum()) if mask is not None else int(named["input_ids"].numel())


@dataclasses.dataclass
class _EpochStats:
    """Running sums of one epoch on this rank (summed over ranks at the epoch's end)."""

    t0: float = dataclasses.field(default_factory=time.perf_counter)
    seen: int = 0
    #: sum of loss × weight, and of the weights (samples, or the tokens an LM loss scores)
    loss_sum: float = 0.0
    weight: float = 0.0
    correct: int = 0
    labelled: int = 0
    tokens: int = 0
    #: seconds spent before a checkpoint this epoch resumed from
    elapsed: float = 0.0
    #: (samples, tokens) the checkpoint carried: every rank's, on rank 0 (``train_state._carried``)
    carried: tuple[int, int] = (0, 0)

    def add(self, batch: Batch, loss: Any, logits: Any, weight: float) -> float:
        """Count one batch (``weight`` 0: a stand-in that does not count); returns its loss."""
        loss_value = float(loss.detach())
        if not weight:
            return loss_value
        n = batch_size_of(batch.x)
        self.seen += n
        self.tokens += _tokens(batch.x)
        self.loss_sum += loss_value * weight
        self.weight += weight
        if logits is not None and batch.y is not None:
            self.correct += int((logits.detach().argmax(-1) == batch.y).sum())
            self.labelled += n
        return loss_value

    def sum_over_ranks(self, device: Any) -> None:
        summed = dist_util.all_reduce_sum([float(getattr(self, f)) for f in train_state.SUMS], device)
        for f, v in zip(train_state.SUMS, summed, strict=True):
            setattr(self, f, v if f in ("loss_sum", "weight") else int(v))


class _EpochBar:
    """The progress line: epoch, running loss and accuracy, samples per second over all ranks."""

    def __init__(self, bar: Any, description: str, run: _Training):
        reached = min(run.config.epochs, math.ceil(run.total_steps / max(run.steps_per_epoch, 1)))
        cut = (
            f" (--max-steps {run.total_steps})"
            if run.total_steps < run.steps_per_epoch * run.config.epochs
            else ""
        )
        self.bar, self.description, self.epochs = bar, description, f"{reached}{cut}"  # 1/4 ended in epoch 1
        per_step = run.config.grad_accum_steps
        total = min(run.config.epochs * run.n_batches, run.total_steps * per_step)
        self.task = bar.add_task(description, total=total, completed=run.step_no * per_step) if bar else None

    def advance(self, epoch: int, stats: _EpochStats, world: int) -> None:
        if not self.bar:
            return
        acc = f" acc {stats.correct / stats.labelled:.3f}" if stats.labelled else ""
        loss = stats.loss_sum / stats.weight if stats.weight else float("nan")
        self.bar.update(
            self.task,
            advance=1,
            description=f"{self.description} epoch {epoch + 1}/{self.epochs} loss {loss:.4f}{acc} {_rate(stats, world)}",
        )


def _rate(stats: _EpochStats, world: int) -> str:
    """Throughput over all ranks with its unit: tokens/s for token inputs (a language model's window of
    hundreds of tokens is one sample: it read '0/s'), else samples/s; 2 significant digits below 10."""
    which = 1 if stats.tokens else 0
    count, unit = (stats.tokens, "tokens") if which else (stats.seen, "samples")
    before = stats.carried[which]  # already over every rank; what this run counted, on each rank alike
    rate = (before + (count - before) * world) / max(time.perf_counter() - stats.t0, 1e-9)
    return f"{rate:.0f} {unit}/s" if rate >= 10 else f"{rate:.2g} {unit}/s"


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

            # a resumed run logs from start_step + 1 on: the killed run's events from there are purged
            self.writer = SummaryWriter(str(log_dir), purge_step=start_step + 1 if start_step else None)

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
            # at the optimizer step the epoch ended, as the per-step scalars: a resume purges by step, so an
            # epoch that --max-steps cut short and a resume finished is two points, not one step twice
            self.writer.add_scalar("epoch/index", record["epoch"], self.step_no)
            for k, v in record.items():
                if k != "epoch" and isinstance(v, (int, float)):
                    self.writer.add_scalar(f"epoch/{k}", v, self.step_no)
                elif isinstance(v, list):  # one value per rank (peak memory)
                    for r, value in enumerate(v):
                        self.writer.add_scalar(f"epoch/{k}/rank{r}", value, self.step_no)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _NoBar:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _progress(enabled: bool) -> Any:
    """The training bar over ``ptopt.core.progress`` (a bar on a terminal, plain lines with the epoch,
    loss and throughput in a log; silent unless reporting is on). ``enabled`` False (a caller that
    trains as one step of its own): no line of its own, a heartbeat when an epoch is long."""
    return _StepBar(enabled)


class _StepBar:
    """The part of rich's ``Progress`` that ``_EpochBar`` uses, over one ``progress.step``."""

    def __init__(self, announce: bool) -> None:
        self.announce, self._cm, self._step = announce, None, None

    def __enter__(self) -> _StepBar:
        return self

    def add_task(self, description: str, total: int, completed: int = 0) -> int:
        from ptopt.core import progress

        self._cm = progress.step(description, total, "batches", announce=self.announce)
        self._step = self._cm.__enter__()
        self._step.done = completed
        return 0

    def update(self, task: int, advance: int = 0, description: str | None = None) -> None:
        if self._step is not None:
            self._step.title = description or self._step.title
            self._step.advance(advance)

    def __exit__(self, *exc: Any) -> bool:
        if self._cm is not None:
            self._cm.__exit__(*exc)
        return False
