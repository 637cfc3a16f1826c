"""Unstructured magnitude pruning: per-layer L1 (every layer to the same sparsity) and global (one
ranking across all layers, so layers end up with different sparsity).

Both use ``torch.nn.utils.prune``: while fine-tuning, the masks stay active (pruned weights stay
zero); ``make_permanent`` then folds them into plain ``weight`` tensors. The result is a *dense*
model full of zeros: the file is as large as before and dense kernels run no faster. What the zeros
save is the compressed (gzip) size, i.e. what the model costs to ship. Use structured pruning for a
model that is really smaller and faster.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ptopt.compress.prune.config import GlobalPruneConfig, L1UnstructuredConfig, matches
from ptopt.compress.prune.registry import register_pruner

DENSE_NOTE = (
    "unstructured sparsity: zeros are stored densely, so the file is as large as before and dense "
    "kernels run no faster; the zeros only shrink the compressed (gzip) size. For a smaller, faster "
    "model use --method structured."
)


def prunable_layers(model: Any, exclude: Iterable[str] = ()) -> list[tuple[str, Any]]:
    """Conv and linear layers (by name) whose weights are pruned, minus the excluded ones; transformers'
    ``Conv1D`` (GPT-2's every projection: a linear with its weight transposed) is a linear, and an
    ``nn.MultiheadAttention`` gives its packed q/k/v weight (:func:`weight_name`)."""
    from ptopt.compress.prune import layers as L

    exclude = tuple(exclude)
    return [
        (n, m)
        for n, m in model.named_modules()
        if (L.kind(m) in ("conv", "linear", "conv1d_t") or weight_name(m) != "weight")
        and not matches(n, exclude)
    ]


def weight_name(module: Any) -> str:
    """The weight pruned in ``module``: ``in_proj_weight`` of an ``nn.MultiheadAttention`` (its q/k/v
    projections, packed; torchvision's ViT), else ``weight``."""
    from torch import nn

    if isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None:
        return "in_proj_weight"
    return "weight"


def make_permanent(model: Any) -> Any:
    """Fold every active pruning mask into its parameter (``weight = weight_orig * mask``)."""
    from torch.nn.utils import prune

    for m in model.modules():
        for hook in list(m._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(m, hook._tensor_name)
    return model


def sparsity_table(layers: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name, m in layers:
        w = getattr(m, weight_name(m)).detach()
        zeros = int((w == 0).sum())
        rows.append(
            {
                "layer": name,
                "type": type(m).__name__,
                "weights": w.numel(),
                "zeros": zeros,
                "sparsity": zeros / max(w.numel(), 1),
            }
        )
    return rows


def achieved_sparsity(rows: list[dict[str, Any]]) -> float:
    """Zeros over all pruned weights."""
    return sum(r["zeros"] for r in rows) / max(sum(r["weights"] for r in rows), 1)


class _UnstructuredPruner:
    """Round k: fold earlier masks in, then mask to the round's sparsity (earlier zeros rank lowest)."""

    precision = "sparse-fp32"

    def __init__(self, config: Any, model: Any, example_inputs: Any):
        self.config = config

    def layers(self, model: Any) -> list[tuple[str, Any]]:
        return prunable_layers(model, self.config.exclude)

    def step(self, model: Any, amount: float) -> Any:
        make_permanent(model)
        self._mask(model, self.layers(model), amount)
        return model

    def _mask(self, model: Any, layers: list[tuple[str, Any]], amount: float) -> None:
        raise NotImplementedError

    def finish(self, model: Any) -> tuple[Any, dict[str, Any]]:
        make_permanent(model)
        rows = sparsity_table(self.layers(model))
        return model, {"layers": rows, "sparsity": achieved_sparsity(rows), "note": DENSE_NOTE}


@register_pruner(L1UnstructuredConfig)
class L1UnstructuredPruner(_UnstructuredPruner):
    """Every conv/linear weight to ``amount`` sparsity by its own L1 magnitude ranking."""

    def _mask(self, model: Any, layers: list[tuple[str, Any]], amount: float) -> None:
        from torch.nn.utils import prune

        for _, m in layers:
            prune.l1_unstructured(m, weight_name(m), amount=amount)


@register_pruner(GlobalPruneConfig)
class GlobalPruner(_UnstructuredPruner):
    """One magnitude ranking across all conv/linear weights to a global sparsity of ``amount``."""

    def _mask(self, model: Any, layers: list[tuple[str, Any]], amount: float) -> None:
        from torch.nn.utils import prune

        prune.global_unstructured(
            [(m, weight_name(m)) for _, m in layers], pruning_method=prune.L1Unstructured, amount=amount
        )
