"""Dynamic int8 of a tied embedding and output layer (GPT-2's ``wte`` / ``lm_head``, one matrix): the
int8 matrix is stored once.

The fp32 model stores the tied matrix once. Quantized as two layers, an int8 Embedding and an int8
Linear, it would be stored twice, and for a small language model that matrix is most of the file.
Here both layers read one :class:`Int8Table`: int8 rows with a float scale each (symmetric, per row,
as the per-channel dynamic Linear weight). The embedding gathers and scales rows; the output layer
runs the same int8 kernel as a dynamic int8 Linear (``quantized::linear_dynamic``) on weights packed
from the table. The table saves only its int8 rows and scales (``__getstate__``) and packs them again
when loaded (``__setstate__``), so TorchScript writes the matrix once. Freezing would fold the packed
weights into a second constant, so a model holding a table is written unfrozen (``export.writers``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: the model-level marker ``quant_engine.is_quantized_module`` reads
INT8_MARK = "ptopt_int8"


class Int8Table(nn.Module):
    """An int8 matrix ``[rows, dim]`` with a scale per row, read as an embedding (:meth:`lookup`)
    and as the weight of a linear layer (``forward``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        import torch.ao.quantization as tq

        obs = tq.per_channel_dynamic_qconfig.weight()
        w = weight.detach().float()
        obs(w)
        scale, zero = obs.calculate_qparams()
        wq = torch.quantize_per_channel(w, scale.double(), zero.long(), 0, torch.qint8)
        self.register_buffer("w_int8", wq.int_repr())
        self.register_buffer("scale", wq.q_per_channel_scales().double())
        rows = w.shape[0]  # no bias: zeros (one TorchScript type for the state)
        self.register_buffer("bias", torch.zeros(rows) if bias is None else bias.detach().float().clone())
        self.packed = torch.ops.quantized.linear_prepack(self._qweight(), self.bias)

    def _qweight(self) -> torch.Tensor:
        zero = torch.zeros(self.scale.shape[0], dtype=torch.long)
        return torch._make_per_channel_quantized_tensor(self.w_int8, self.scale, zero, 0)

    @torch.jit.export
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.w_int8[ids].float() * self.scale[ids].float().unsqueeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        return (self.w_int8, self.scale, self.bias, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]) -> None:
        self.w_int8 = state[0]
        self.scale = state[1]
        self.bias = state[2]
        self.training = state[3]
        self.packed = torch.ops.quantized.linear_prepack(self._qweight(), self.bias)


class TiedInt8Embedding(nn.Module):
    """The embedding half: rows of the shared table."""

    ptopt_int8 = True

    def __init__(self, table: nn.Module):
        super().__init__()
        self.table = table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.lookup(ids)


class TiedInt8Linear(nn.Module):
    """The output-layer half: a dynamic int8 linear layer on the shared table."""

    ptopt_int8 = True

    def __init__(self, table: nn.Module):
        super().__init__()
        self.table = table

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table(x)


def tied_pairs(model: nn.Module, float_modules: Any = ()) -> list[tuple[str, str]]:
    """``(embedding, linear)`` names whose weight is one tensor (``linear.weight is embedding.weight``),
    neither kept float by ``float_modules`` (nor under one) and the embedding a plain lookup (no
    ``max_norm``, which rewrites the rows it reads)."""
    skip = tuple(float_modules or ())

    def kept(name: str) -> bool:
        return not any(name == s or name.startswith(s + ".") for s in skip)

    mods = [(n, m) for n, m in model.named_modules(remove_duplicate=False) if n and kept(n)]
    embeddings = [(n, m) for n, m in mods if type(m) is nn.Embedding and m.max_norm is None]
    linears = [(n, m) for n, m in mods if type(m) is nn.Linear]
    return [(en, ln) for en, e in embeddings for ln, lin in linears if lin.weight is e.weight]


def tie_int8(model: nn.Module, pairs: list[tuple[str, str]]) -> None:
    """Replace each pair of ``model`` (in place, still float there) by the two halves of one scripted
    :class:`Int8Table`."""
    for emb_name, lin_name in pairs:
        lin = model.get_submodule(lin_name)
        table = torch.jit.script(Int8Table(lin.weight, lin.bias))
        model.set_submodule(emb_name, TiedInt8Embedding(table))
        model.set_submodule(lin_name, TiedInt8Linear(table))
