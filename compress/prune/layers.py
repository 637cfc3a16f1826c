"""The layers structured pruning rewrites: what they are (by ``isinstance``, so subclasses such as
timm's ``BatchNormAct2d``, ``Conv2dSame`` or EfficientNet-Lite's ``Conv2dStaticSamePadding`` count),
which weight dimension holds their output and input channels, and how a dimension is cut.

=============  ======================================================================================
kind           modules
=============  ======================================================================================
``conv``       ``nn.Conv1d/2d/3d`` and subclasses (weight ``[out, in/groups, ...]``)
``linear``     ``nn.Linear`` and subclasses (weight ``[out, in]``)
``conv1d_t``   transformers' ``Conv1D`` (GPT-2: weight ``[in, out]``, ``addmm``), recognised by its
               ``nf`` attribute and transposed weight
``batch_norm`` ``nn.BatchNorm1d/2d/3d`` and subclasses (timm ``BatchNormAct2d``)
``layer_norm`` ``nn.LayerNorm``, ``nn.RMSNorm`` and subclasses
``group_norm`` ``nn.GroupNorm`` and subclasses
``embedding``  ``nn.Embedding`` and subclasses (weight ``[rows, dim]``: its output channels are the
               columns, dim 1; a producer only when the hidden size is pruned)
=============  ======================================================================================
"""

from __future__ import annotations

from typing import Any


def kind(module: Any) -> str | None:
    """The layer kind of ``module`` (table above), or None."""
    from torch import nn

    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return "conv"
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return "batch_norm"
    if isinstance(module, (nn.LayerNorm, getattr(nn, "RMSNorm", nn.LayerNorm))):
        return "layer_norm"
    if isinstance(module, nn.GroupNorm):
        return "group_norm"
    if isinstance(module, nn.Embedding):
        return "embedding"
    w = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(w, "dim", lambda: 0)() == 2:
        return "conv1d_t"
    return None


def plain_norm(module: Any) -> bool:
    """torch's own LayerNorm / RMSNorm forward (normalising the last dims of the module's input)."""
    from torch import nn

    classes = [nn.LayerNorm, *([nn.RMSNorm] if hasattr(nn, "RMSNorm") else [])]
    return type(module).forward in [c.forward for c in classes]


def is_layer(module: Any) -> bool:
    """A conv / linear whose output channels can be removed."""
    return kind(module) in ("conv", "linear", "conv1d_t")


def weight_dims(module: Any) -> tuple[int, int]:
    """(output-channel dim, input-channel dim) of the module's weight."""
    return (1, 0) if kind(module) in ("conv1d_t", "embedding") else (0, 1)


def out_size(module: Any) -> int:
    k = kind(module)
    if k == "linear":
        return module.out_features
    if k == "conv1d_t":
        return module.nf
    if k == "embedding":
        return module.embedding_dim
    return module.out_channels


def in_size(module: Any) -> int:
    return module.weight.shape[weight_dims(module)[1]] * (getattr(module, "groups", 1) or 1)


def owner_of_type(modules: dict[str, Any], path: str, types: Any) -> str | None:
    """The innermost of ``path`` and its parents (module names in ``modules``) whose class name is in
    ``types``, or None."""
    parts = path.split(".") if path else []
    for i in range(len(parts), -1, -1):
        name = ".".join(parts[:i])
        if name in modules and type(modules[name]).__name__ in types:
            return name
    return None


def inside_type(modules: dict[str, Any], path: str, cls: str) -> bool:
    """Module ``path`` is of class ``cls`` or inside one."""
    return owner_of_type(modules, path, (cls,)) is not None


def output_channels(model: Any) -> dict[str, int]:
    """Output channels / features of every conv and linear (and embedding width), by name."""
    return {n: out_size(m) for n, m in model.named_modules() if is_layer(m) or kind(m) == "embedding"}


def slice_param(mod: Any, attr: str, dim: int, idx: Any) -> None:
    """Keep the entries ``idx`` of ``mod.attr`` along ``dim`` (a Parameter stays a Parameter)."""
    import torch
    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(mod, attr):  # weight norm: cut the tensors the weight is made of
        size = getattr(mod, attr).shape[dim]
        originals = getattr(mod.parametrizations, attr)
        for name, t in list(originals.named_parameters(recurse=False)):
            if t.dim() > dim and t.shape[dim] == size and size > 1:
                slice_param(originals, name, dim, idx)
        return
    t = getattr(mod, attr, None)
    if not isinstance(t, torch.Tensor):
        return
    new = t.detach().index_select(dim, idx).clone()
    if isinstance(t, torch.nn.Parameter):
        setattr(mod, attr, torch.nn.Parameter(new, requires_grad=t.requires_grad))
    else:
        setattr(mod, attr, new)


def dim_size(mod: Any, role: str, attr: str = "", axis: int = 0) -> int:
    """Length of the dimension ``role`` cuts (before cutting)."""
    if role == "param":
        return getattr(mod, attr).shape[axis]
    if role == "in":
        return mod.weight.shape[weight_dims(mod)[1]]
    if role in ("out", "depthwise", "grouped"):
        return mod.weight.shape[weight_dims(mod)[0]]
    t = mod.weight if getattr(mod, "weight", None) is not None else mod.running_mean
    return t.shape[0]


def cut(mod: Any, role: str, idx: Any, attr: str = "", axis: int = 0) -> None:
    """Keep the positions ``idx`` of the dimension ``role`` names, and the size attributes that say it."""
    k = kind(mod)
    out_dim, in_dim = weight_dims(mod) if k else (0, 1)
    if role == "param":
        slice_param(mod, attr, axis, idx)
        if type(mod).__name__ == "Embedding" and attr == "weight" and axis == 1:
            mod.embedding_dim = len(idx)
    elif role == "out":
        slice_param(mod, "weight", out_dim, idx)
        slice_param(mod, "bias", 0, idx)
        _set_out(mod, k, len(idx))
    elif role == "in":
        slice_param(mod, "weight", in_dim, idx)
        if k == "linear":
            mod.in_features = len(idx)
        elif k == "conv":
            mod.in_channels = len(idx)
    elif role in ("depthwise", "grouped"):
        per_group = mod.out_channels // mod.groups
        slice_param(mod, "weight", 0, idx)
        slice_param(mod, "bias", 0, idx)
        groups = len(idx) // per_group
        mod.in_channels = mod.in_channels // mod.groups * groups
        mod.out_channels = len(idx)
        mod.groups = groups
    elif role == "norm":
        _cut_norm(mod, k, idx)


def sync_sizes(mod: Any) -> None:
    """Set a layer's size attributes from its weight (a tied weight replaced by its cut twin)."""
    k = kind(mod)
    if k in ("linear", "embedding", "conv1d_t"):
        out_dim, in_dim = weight_dims(mod)
        _set_out(mod, k, mod.weight.shape[out_dim])
        if k == "linear":
            mod.in_features = mod.weight.shape[in_dim]


def _set_out(mod: Any, k: str | None, n: int) -> None:
    if k == "linear":
        mod.out_features = n
    elif k == "conv1d_t":
        mod.nf = n
    elif k == "embedding":
        mod.embedding_dim = n
    else:
        mod.out_channels = n


def _cut_norm(mod: Any, k: str | None, idx: Any) -> None:
    for attr in ("weight", "bias", "running_mean", "running_var"):
        slice_param(mod, attr, 0, idx)
    if k == "layer_norm":
        mod.normalized_shape = (len(idx),)
    elif k == "group_norm":
        mod.num_groups = len(idx) // (mod.num_channels // mod.num_groups)
        mod.num_channels = len(idx)
    else:
        mod.num_features = len(idx)
