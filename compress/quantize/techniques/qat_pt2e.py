"""Row ``("qat", "pt2e")``: torchao PT2E quantization-aware training (prepare_qat_pt2e → the shared
trainer → convert_pt2e), compiled by AOTInductor into a ``.pt2`` package; see
``ptopt.compress.quantize.pt2e``."""

from __future__ import annotations

from typing import Any

from ptopt.compress.quantize import pt2e
from ptopt.compress.quantize.base import Prepared, Quantized
from ptopt.compress.quantize.config import QATConfig
from ptopt.compress.quantize.registry import register_technique


# QAT trains: its numbers against fp32 are recorded, not gated
@register_technique(
    QATConfig,
    "pt2e",
    help="torchao PT2E fake-quant fine-tuning, then int8; AOTInductor package (.pt2)",
    check=pt2e.check_x86,
    gated=False,
    captures=pt2e.captures,
    captures_hint=pt2e.CAPTURES_HINT,
    tracer="torch.export",
)
def qat_pt2e(config: QATConfig, prep: Prepared, progress: bool) -> Quantized:
    specs = pt2e.specs_of(prep)
    converted, summary = _train_and_convert(config, prep, specs, progress)
    return pt2e.artifact(config, prep, converted, summary, specs)


def _train_and_convert(config: QATConfig, prep: Prepared, specs: list, progress: bool) -> tuple[Any, dict]:
    """prepare_qat_pt2e → the shared trainer → convert_pt2e; the converted graph and its summary."""
    from ptopt.compress.quantize import engine_pt2e
    from ptopt.compress.quantize.techniques.qat_fx import distill_loss
    from ptopt.compress.trainer import TrainConfig, cross_entropy_loss, train

    module, swapped = pt2e.linearized(prep.module, config.float_modules)
    graph = engine_pt2e.prepare(module, specs, prep.style, config, qat=True)
    prepared = _trainable(graph)
    tcfg = TrainConfig(
        epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
        weight_decay=config.weight_decay, seed=config.seed, keep_best=False, max_steps=config.max_steps,
    )  # fmt: skip
    data = prep.train
    teacher = prep.module.eval()
    loss = (
        cross_entropy_loss if data.has_labels else distill_loss(lambda *a, **k: pt2e.logits(teacher(*a, **k)))
    )
    result = train(prepared, data, tcfg, loss_fn=loss, progress=progress and "QAT (pt2e)")
    engine_pt2e.set_training(graph, False)
    converted = engine_pt2e.convert(graph)
    summary = {"data": data.name, "samples": len(data), "epochs": config.epochs, "max_steps": config.max_steps,
               "history": result.history}  # fmt: skip
    return converted, {"training": summary | {"engine": "pt2e"}, "conv1d_as_linear": swapped}


def _trainable(graph: Any) -> Any:
    """The prepared graph behind ``.train()``/``.eval()`` (an exported graph ignores them)."""
    import torch

    from ptopt.compress.quantize import engine_pt2e

    class Trainable(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph = graph

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return pt2e.logits(self.graph(*args, **kwargs))

        def train(self, mode: bool = True) -> Trainable:
            self.training = mode
            engine_pt2e.set_training(self.graph, mode)
            return self

    return Trainable()
