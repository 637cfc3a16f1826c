"""GPTQ to int4 for the CPU, ptopt's own: torchao's int4 GPTQ needs the CUDA-only ``mslk``
package, and no other maintained library runs GPTQ on the CPU here.

The algorithm of Frantar et al. (2022), as the reference implementation does it: for each selected
Linear layer, the Hessian of its reconstruction error ``H = 2 X^T X / n`` is accumulated over the
calibration tokens (its inputs in the float model: the non-sequential variant, as torchao's GPTQ);
then the weight is rounded one input column at a time, each column's rounding error spread over the
columns not yet rounded through the Cholesky factor of ``H^-1`` (dampened by 1% of its mean
diagonal), in blocks of one group, with tinygemm's asymmetric rule (``scale = (max - min) / 15``,
``w = (code - 8) * scale + zero``), so the result packs into the same int4 CPU layout as
round-to-nearest (``engine_torchao.int4_tensor``).

Column order (``act_order``, on by default): the columns are rounded in decreasing order of
``diag(H)``, the inputs that carry the most energy first, while the most columns remain to absorb
their error (the reference's ``--act-order``); each group's scale and zero are then fixed beforehand
from its own unrounded columns (the reference's ``--static-groups``), so groups stay contiguous runs
of input columns, as the int4 layout needs. Without it, each group's scale and zero are chosen when
its first column is reached, from the weights as updated so far. Measured on SmolLM2-135M int4 g64
(16 calibration windows of 256 tokens, perplexity on held-out standard-library docstrings, neither
the calibration nor the evaluation text): round-to-nearest +25.8%, GPTQ in column order +17.1%,
GPTQ with ``act_order`` +11.0%.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PERCDAMP = 0.01


def gptq_int4(model: Any, names: list[str], group: int, calibrate: Callable[[Any], None]) -> None:
    """Quantize the Linear layers ``names`` of ``model`` to int4 in place (module docstring)."""
    import torch

    from ptopt.compress.quantize import engine_torchao as engine

    hessians = _observe(model, names, calibrate)
    for name in names:
        layer = model.get_submodule(name)
        h, n = hessians[name]
        if n == 0:
            raise RuntimeError(f"GPTQ: the calibration text never reached {name}")
        w = layer.weight.detach().float()
        codes, scales, zeros = gptq_round(w, h * (2.0 / n), group)
        qw = engine.int4_tensor(layer.weight, codes, scales, zeros, group)
        layer.weight = torch.nn.Parameter(qw, requires_grad=False)


def _observe(model: Any, names: list[str], calibrate: Callable[[Any], None]) -> dict[str, list]:
    """``{name: [X^T X, tokens]}`` of each layer's inputs while ``calibrate(model)`` runs."""
    found: dict[str, list] = {}
    hooks = []

    def hook(name: str) -> Callable:
        def record(module: Any, args: tuple, _out: Any) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            entry = found.setdefault(name, [0.0, 0])
            entry[0] = entry[0] + x.t() @ x
            entry[1] += x.shape[0]

        return record

    for name in names:
        hooks.append(model.get_submodule(name).register_forward_hook(hook(name)))
    try:
        calibrate(model)
    finally:
        for h in hooks:
            h.remove()
    return found


def _qparams(w: Any) -> tuple[Any, Any]:
    """tinygemm's asymmetric scale and zero of the rows of ``w`` (one group of columns)."""
    lo, hi = w.min(dim=1).values, w.max(dim=1).values
    scale = ((hi - lo) / 15).clamp(min=1e-6)
    return scale, lo + scale * 8


def gptq_round(w: Any, h: Any, group: int, act_order: bool = True) -> tuple[Any, Any, Any]:
    """``(codes [out, in] int32 0..15, scales, zeros [out, in / group])`` of ``w`` (float32) rounded
    by GPTQ with Hessian ``h`` (module docstring; ``act_order``: its column order)."""
    import torch

    w = w.clone()
    rows, cols = w.shape
    h = h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += PERCDAMP * torch.mean(torch.diag(h)) * torch.eye(cols)
    scales = torch.zeros(rows, cols // group)
    zeros = torch.zeros(rows, cols // group)
    if act_order:
        for g in range(cols // group):
            scales[:, g], zeros[:, g] = _qparams(w[:, g * group : (g + 1) * group])
        perm = torch.argsort(torch.diag(h), descending=True, stable=True)
        w, h = w[:, perm], h[perm][:, perm]
    else:
        perm = torch.arange(cols)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    codes = torch.zeros(rows, cols, dtype=torch.int32)
    for start in range(0, cols, group):
        end = start + group
        block, hblock = w[:, start:end].clone(), hinv[start:end, start:end]
        errors = torch.zeros_like(block)
        if not act_order:  # chosen from the weights as updated so far
            scales[:, start // group], zeros[:, start // group] = _qparams(block)
        for i in range(group):
            g = int(perm[start + i]) // group
            scale, zero = scales[:, g], zeros[:, g]
            col = block[:, i]
            code = torch.clamp(torch.round((col - zero) / scale + 8), 0, 15)
            codes[:, start + i] = code.to(torch.int32)
            err = (col - ((code - 8) * scale + zero)) / hblock[i, i]
            block[:, i:] -= err.unsqueeze(1) @ hblock[i, i:].unsqueeze(0)
            errors[:, i] = err
        w[:, end:] -= errors @ hinv[start:end, end:]
    return codes[:, torch.argsort(perm)], scales, zeros
