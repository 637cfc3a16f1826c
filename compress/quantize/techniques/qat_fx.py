"""Row ``("qat", "fx")``: quantization-aware training, fake-quant fine-tuning in graph mode, then
convert to int8, written as frozen int8 TorchScript.

The model is traced and prepared for QAT (conv-bn kept as trainable fused modules, fake quantization
on weights and activations), fine-tuned with the shared trainer (AdamW, warmup + cosine, evaluation
each epoch), and converted. Late in training the BatchNorm statistics and then the quantization
ranges are frozen (``freeze_bn_after`` / ``freeze_observers_after``, fractions of all steps) so the
last steps adapt the weights to fixed ranges: the network that is converted is the one that trained.
"""

from __future__ import annotations

from typing import Any

from ptopt.compress.quantize import fx_support
from ptopt.compress.quantize.base import Prepared, Quantized, QuantResult
from ptopt.compress.quantize.config import QATConfig, refuse_no_compile
from ptopt.compress.quantize.registry import register_technique
from ptopt.compress.quantize.techniques.static_fx import float_layers
from ptopt.core.data import Batch, Dataset
from ptopt.core.inputspec import call_args


# QAT trains: its numbers against fp32 are recorded, not gated
@register_technique(
    QATConfig,
    "fx",
    help="torch.ao FX fake-quant fine-tuning, then int8; frozen int8 TorchScript (.pt)",
    check=refuse_no_compile,
    requires=fx_support.require_backend,
    tracer="torch.fx",
    gated=False,
)
def qat_fx(config: QATConfig, prep: Prepared, progress: bool) -> Quantized:
    def technique() -> QuantResult:
        return quantize_qat(prep.module, config, prep.train, prep.example, prep.evald, progress)

    return fx_support.quantized(config, prep, technique)


class FreezeSchedule:
    """Freezes BatchNorm statistics and observers after given fractions of all training steps.

    ``epoch_hook`` (for the trainer's ``epoch_hooks``) applies what is due at an epoch boundary;
    ``wrap(loss_fn)`` applies what falls due within an epoch (a one-epoch QAT still freezes late).
    BatchNorm freezing is re-applied each step because the trainer puts the model in train mode at
    every epoch start.
    """

    def __init__(self, config: QATConfig, steps_per_epoch: int):
        self.steps_per_epoch = steps_per_epoch
        total = steps_per_epoch * config.epochs
        if config.max_steps is not None:
            total = min(total, config.max_steps)
        self.bn_step = int(total * config.freeze_bn_after)
        self.observer_step = int(total * config.freeze_observers_after)
        self.step = 0
        self.bn_frozen_at: int | None = None
        self.observers_frozen_at: int | None = None

    def _apply(self, model: Any) -> None:
        from ptopt.compress.quantize import engine_fx as engine

        if self.step >= self.bn_step:
            engine.freeze_bn_stats(model)
            if self.bn_frozen_at is None:
                self.bn_frozen_at = self.step
        if self.step >= self.observer_step and self.observers_frozen_at is None:
            engine.freeze_observers(model)
            self.observers_frozen_at = self.step

    def epoch_hook(self, epoch: int, model: Any) -> None:
        self.step = epoch * self.steps_per_epoch
        self._apply(model)

    def wrap(self, loss_fn: Any) -> Any:
        def loss(model: Any, batch: Batch):
            self._apply(model)
            self.step += 1
            return loss_fn(model, batch)

        return loss

    def summary(self) -> dict[str, Any]:
        return {"bn_frozen_at_step": self.bn_frozen_at, "observers_frozen_at_step": self.observers_frozen_at}


def distill_loss(teacher: Any):
    """Without labels: match the fp32 model's output distribution (KL divergence)."""
    import torch
    import torch.nn.functional as F

    from ptopt.compress.trainer import model_logits

    def loss(model: Any, batch: Batch):
        logits = model_logits(model, batch.x)
        with torch.no_grad():
            target = F.softmax(model_logits(teacher, batch.x).float(), -1)
        return F.kl_div(F.log_softmax(logits.float(), -1), target, reduction="batchmean"), logits

    return loss


def quantize_qat(
    model: Any,
    config: QATConfig,
    train_data: Dataset,
    example: Any,
    eval_data: Dataset | None = None,
    progress: bool = True,
) -> QuantResult:
    """QAT of ``model`` (left untouched) on ``train_data``; returns the converted int8 module."""
    from ptopt.compress.quantize import engine_fx as engine
    from ptopt.compress.trainer import TrainConfig, cross_entropy_loss, train

    args, kwargs = call_args(example)
    prepared = engine.prepare_qat(model, config, args, kwargs)
    tcfg = TrainConfig(
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        weight_decay=config.weight_decay,
        seed=config.seed,
        keep_best=False,
        max_steps=config.max_steps,
    )
    schedule = FreezeSchedule(config, train_data.num_batches(tcfg.batch_size))
    base_loss = cross_entropy_loss if train_data.has_labels else distill_loss(model.eval())
    result = train(
        prepared,
        train_data,
        tcfg,
        eval_data=eval_data if eval_data is not None and eval_data.has_labels else None,
        loss_fn=schedule.wrap(base_loss),
        epoch_hooks=[schedule.epoch_hook],
        progress=progress and "QAT",
    )
    converted = engine.convert(result.model, config.backend)
    summary = {
        "training": {
            "data": train_data.name,
            "samples": len(train_data),
            "epochs": config.epochs,
            "max_steps": config.max_steps,
            "loss": "cross_entropy" if train_data.has_labels else "kl_to_fp32",
            "history": result.history,
            **schedule.summary(),
        }
    }
    return QuantResult(converted, float_layers(model, converted, config), summary)
