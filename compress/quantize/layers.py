"""Model surgery the quantization engines share, in plain torch (no torch.ao): transformers'
``Conv1D`` as the ``nn.Linear`` it is, the MultiheadAttention fast path switched off while an int8
model runs, and the check that ``--exclude`` names modules of the model."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ptopt.core.errors import UsageError


def check_module_names(model: nn.Module, names: Any, option: str = "--exclude") -> None:
    """UsageError for a float-module name that is not a submodule of ``model``."""
    known = {n for n, _ in model.named_modules() if n}
    bad = [n for n in names if n not in known]
    if bad:
        sample = ", ".join(sorted(known, key=len)[:8])
        raise UsageError(
            f"{option} {', '.join(bad)}: no such module in the model (modules include: {sample})"
        )


@contextlib.contextmanager
def mha_fastpath_disabled() -> Iterator[None]:
    """Dynamic int8 replaces Linear weights by methods; the fused MultiheadAttention / encoder fast
    path reads ``linear1.weight`` and crashes, so it must be off while the model runs or is traced."""
    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        yield
        return
    prev = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(prev)


def is_conv1d_linear(m: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's attention and MLP): a linear layer whose weight is stored
    transposed (in × out), despite its name. Recognized by shape, without importing transformers."""
    w, b = getattr(m, "weight", None), getattr(m, "bias", None)
    return (
        type(m).__name__ == "Conv1D"
        and not isinstance(m, nn.modules.conv._ConvNd)
        and isinstance(w, torch.Tensor)
        and w.dim() == 2
        and getattr(m, "nf", w.shape[1]) == w.shape[1]
        and (b is None or tuple(b.shape) == (w.shape[1],))
    )


def linearize_conv1d(model: nn.Module, skip: Any = ()) -> list[str]:
    """Swap each transformers ``Conv1D`` in ``model`` (in place) for the ``nn.Linear`` it is (weight
    transposed), checked numerically on a random input; names in ``skip`` (float modules, and what
    is under them) are left alone. Returns the swapped names."""
    skip = tuple(skip or ())
    swapped = []
    for name, m in list(model.named_modules()):
        if not name or not is_conv1d_linear(m) or any(name == s or name.startswith(s + ".") for s in skip):
            continue
        w = m.weight.detach()
        # built on the meta device: no random initialisation (the caller's random state stays as it was)
        lin = nn.Linear(w.shape[0], w.shape[1], bias=m.bias is not None, dtype=w.dtype, device="meta")
        lin = lin.to_empty(device=w.device)
        with torch.no_grad():
            lin.weight.copy_(w.t())
            if m.bias is not None:
                lin.bias.copy_(m.bias.detach())
            g = torch.Generator().manual_seed(0)
            x = torch.randn(3, 5, w.shape[0], generator=g).to(dtype=w.dtype, device=w.device)
            if not torch.allclose(lin(x), m(x), rtol=1e-4, atol=1e-5):
                continue  # not the linear layer it looks like: leave it as it is
        lin.train(m.training)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, lin)
        swapped.append(name)
    return swapped


def uncalled(model: nn.Module, kinds: tuple[type, ...], example: Any) -> list[str]:
    """The layers of ``kinds`` that one forward pass on ``example`` never calls as modules: a parent
    reads their weight itself (torchvision's Swin attention: ``F.linear(x, self.qkv.weight)``).
    Swapped for an int8 layer, whose ``weight`` is a method, the parent would fail; they stay float."""
    from ptopt.core.inputspec import call_model

    layers = {m: n for n, m in model.named_modules() if n and isinstance(m, kinds)}
    called: set[str] = set()
    hooks = [m.register_forward_pre_hook(lambda mod, args: called.add(layers[mod])) for m in layers]
    try:
        with torch.no_grad(), mha_fastpath_disabled():
            call_model(model, example)
    finally:
        for h in hooks:
            h.remove()
    return [n for n in layers.values() if n not in called]
