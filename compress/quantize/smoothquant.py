"""Activation smoothing for int8 Linears (SmoothQuant): move activation outliers into the weights.

Transformer activations carry a few input channels hundreds of times larger than the rest; int8
activations quantized per tensor (dynamic int8 on x86 even uses 7 bits) then lose the small channels.
For ``y = W x`` and a per-input-channel scale ``s``: ``y = (W · diag(s)) (x / s)``, exact in float.
With ``s_j = max|x_j|^α / max|W_:,j|^(1-α)`` the activation range flattens and the weights (int8 per
output channel) absorb it. Here the division is an explicit elementwise multiply in front of the
Linear (``SmoothedLinear``), so it works after any op (GELU, residual LayerNorm) and traces to
TorchScript; it costs one multiply per activation, small next to the matmul.

``activation_absmax`` collects ``max|x_j|`` on data; ``smooth`` returns a smoothed copy of a model.
Used by accuracy-aware quantization (``ptopt.compress.quantize.autoquant``) as one more scheme to try.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

DEFAULT_ALPHA = 0.75


class SmoothedLinear(nn.Module):
    """``linear(x * inv_scale)`` where ``linear``'s weight columns were multiplied by ``1 / inv_scale``."""

    def __init__(self, linear: nn.Linear, scale: torch.Tensor):
        super().__init__()
        self.register_buffer("inv_scale", (1.0 / scale).to(linear.weight.dtype))
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.inv_scale)


def activation_absmax(
    model: nn.Module, data: Any, names: Iterable[str], batch_size: int = 64
) -> dict[str, torch.Tensor]:
    """``{name: max |input| per input channel}`` of the named Linear layers over ``data`` (a Dataset)."""
    from ptopt.core.inputspec import call_model

    stats: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        m = model.get_submodule(name)
        if not isinstance(m, nn.Linear):
            continue

        def hook(mod, inp, out, name=name):
            a = inp[0].detach().abs().reshape(-1, inp[0].shape[-1]).amax(0).float()
            stats[name] = torch.maximum(stats[name], a) if name in stats else a

        hooks.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            for b in data.batches(batch_size):
                call_model(model, b.x)
    finally:
        for h in hooks:
            h.remove()
    return stats


def smooth(
    model: nn.Module,
    absmax: dict[str, torch.Tensor],
    alpha: float = DEFAULT_ALPHA,
    layers: Iterable[str] | None = None,
) -> nn.Module:
    """A copy of ``model`` whose Linears in ``layers`` (default: all in ``absmax``) are SmoothedLinear.

    The module keeps its name (``layers.0.ff2`` is the wrapper, ``layers.0.ff2.linear`` the Linear).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"smoothing alpha must be in (0, 1), got {alpha}")
    out = copy.deepcopy(model)  # the caller's model is left as it is
    for name in absmax if layers is None else layers:
        if name not in absmax:
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = out.get_submodule(parent_name) if parent_name else out
        lin = getattr(parent, leaf)
        if not isinstance(lin, nn.Linear):
            continue
        w = lin.weight.detach().abs().amax(0).float()
        # a channel that was ~0 on the calibration data must not get a huge 1/s: floor both maxima
        a = absmax[name].clamp(min=float(absmax[name].max()) * 1e-2 + 1e-8)
        s = a**alpha / w.clamp(min=float(w.max()) * 1e-2 + 1e-8) ** (1 - alpha)
        with torch.no_grad():
            lin.weight.mul_(s.to(lin.weight.dtype))
        setattr(parent, leaf, SmoothedLinear(lin, s))
    return out
