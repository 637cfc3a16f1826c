"""Dynamic int8 of a tied embedding and output layer (GPT-2's ``wte`` / ``lm_head``, one matrix): the
int8 matrix is stored once.

The fp32 model stores the tied matrix once. Quantized as two layers, an int8 Embedding and an int8
Linear, it would be stored twice, and for a small language model that matrix is most of the file.
Here every layer holding that weight reads one :class:`Int8Table`: int8 rows with a float scale each
(symmetric, per row, as the per-channel dynamic Linear weight; one scale for all rows with
``per_channel=False``). The embeddings gather and scale rows (symmetric where torch's int8 Embedding
is asymmetric per row: slightly coarser rows); the output layer runs the same int8 kernel as a
dynamic int8 Linear (``quantized::linear_dynamic``, identical results) on weights packed from the
table. The table saves only its int8 rows, scales and bias (``__getstate__``) and packs them again
when loaded (``__setstate__``), so TorchScript writes the matrix once; the TorchScript writer keeps
such submodules out of freezing (``preserved_attrs``), which would fold a second copy into the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: the model-level marker ``engine_fx.is_quantized_module`` reads
INT8_MARK = "ptopt_int8"


class Int8Table(nn.Module):
    """An int8 matrix ``[rows, dim]`` with a scale per row, read as an embedding (:meth:`lookup`)
    and as the weight of a linear layer (``forward``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, observer: Any):
        """``observer``: the weight observer torch's dynamic int8 Linear uses (symmetric qint8, per
        output channel or one scale: ``engine_fx.dynamic_weight_observer``), so that the output layer
        computes exactly what a dynamic int8 Linear would."""
        super().__init__()
        w = weight.detach().float()
        observer(w)
        scale, _ = observer.calculate_qparams()
        scale = scale.double().reshape(-1).expand(w.shape[0]).contiguous()  # per-tensor: one for every row
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        wq = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        self.register_buffer("w_int8", wq.int_repr())
        self.register_buffer("scale", scale)
        rows = w.shape[0]  # no bias: zeros (one TorchScript type for the state)
        self.register_buffer("bias", torch.zeros(rows) if bias is None else bias.detach().float().clone())
        self.repack()

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
        self.repack()

    @torch.jit.export
    def ptopt_self_serializing(self) -> bool:
        """The marker ptopt's TorchScript writer looks for: freezing must keep this module as it is."""
        return True

    @torch.jit.export
    def repack(self) -> None:
        """Pack the int8 rows again for the linear kernel (after a load or a ``load_state_dict``)."""
        self.packed = torch.ops.quantized.linear_prepack(self._qweight(), self.bias)


class _TableHalf(nn.Module):
    ptopt_int8 = True

    def __init__(self, table: nn.Module):
        super().__init__()
        self.table = table
        # new rows (load_state_dict) must reach the packed weights too, as torch's int8 Linear repacks
        self.register_load_state_dict_post_hook(lambda module, _: module.table.repack())


class TiedInt8Embedding(_TableHalf):
    """The embedding half: rows of the shared table."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.lookup(ids)


class TiedInt8Linear(_TableHalf):
    """The output-layer half: a dynamic int8 linear layer on the shared table."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table(x)


def tied_groups(model: nn.Module, float_modules: Any = ()) -> list[tuple[list[str], list[str]]]:
    """``(embeddings, linears)`` per weight tensor that at least one ``nn.Embedding`` and one
    ``nn.Linear`` of ``model`` share (GPT-2's ``wte`` / ``lm_head``; T5's ``shared``, both
    ``embed_tokens`` and ``lm_head``), every path of each. A group is left out when any of its layers
    is kept float by ``float_modules`` (or is under one: the matrix is then float for all of them),
    when an embedding has ``max_norm`` (it rewrites the rows it reads), or when the linears' biases
    differ (one table holds one bias)."""
    skip = tuple(float_modules or ())
    groups: dict[int, tuple[list[tuple[str, nn.Module]], list[tuple[str, nn.Module]]]] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        if name and type(m) in (nn.Embedding, nn.Linear):
            embs, lins = groups.setdefault(id(m.weight), ([], []))
            (embs if type(m) is nn.Embedding else lins).append((name, m))
    out = []
    for embs, lins in groups.values():
        names = [n for n, _ in embs + lins]
        if not embs or not lins or any(n == s or n.startswith(s + ".") for n in names for s in skip):
            continue
        if any(e.max_norm is not None for _, e in embs) or len({id(lin.bias) for _, lin in lins}) > 1:
            continue
        out.append(([n for n, _ in embs], [n for n, _ in lins]))
    return out


def tied_partners(model: nn.Module, float_modules: Any) -> dict[str, str]:
    """``{layer: the float module it is tied to}``: the other layers holding the weight of a layer
    ``float_modules`` keeps float; they stay float too, so the matrix is stored once."""
    skip = tuple(float_modules or ())
    out = {}
    for embs, lins in tied_groups(model):
        names = embs + lins
        held = [s for s in skip for n in names if n == s or n.startswith(s + ".")]
        out.update(
            {n: held[0] for n in names if held and not any(n == h or n.startswith(h + ".") for h in held)}
        )
    return out


def tie_int8(
    model: nn.Module, groups: list[tuple[list[str], list[str]]], observer: Callable[[], Any]
) -> None:
    """Replace the layers of each group of ``model`` (in place, still float there) by the halves of
    one scripted :class:`Int8Table` (``observer()``: a fresh weight observer for each table)."""
    for embs, lins in groups:
        lin = model.get_submodule(lins[0])
        table = torch.jit.script(Int8Table(lin.weight, lin.bias, observer()))
        for name in embs:
            model.set_submodule(name, TiedInt8Embedding(table))
        for name in lins:
            model.set_submodule(name, TiedInt8Linear(table))


def tied_names(model: nn.Module) -> list[str]:
    """``"embedding + linear"`` for each table of a quantized ``model`` (its layers, in order)."""
    tables: dict[int, list[str]] = {}
    for name, m in model.named_modules():
        if isinstance(m, _TableHalf):
            tables.setdefault(id(m.table), []).append(name)
    return [" + ".join(names) for names in tables.values()]
