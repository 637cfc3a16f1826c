"""The weight-only engine: torchao's ``quantize_`` with its weight-only configs, the only module of
the weight-only rows that imports torchao.

===========  =====================================================================================
bits/method  torchao config (CPU)
===========  =====================================================================================
8 rtn        ``Int8WeightOnlyConfig`` (per output channel, or per ``group_size`` input columns):
             int8 weights, fp32 activations; torch's ``_weight_int8pack_mm`` on the CPU
4 rtn        ``PrototypeInt4WeightOnlyConfig`` (tinygemm qparams, asymmetric, a scale and zero per
             group): int4 packed for ``_weight_int4pack_mm_for_cpu``, bf16 activations
4 hqq        the same, scales and zeros from HQQ's half-quadratic solver (no data)
4/8 awq      ``AWQConfig`` around the above: activation-aware scales per input channel, searched on
             calibration text (``step=prepare`` -> run the text -> ``step=convert``)
4 gptq       ptopt's own (``gptq.py``), packed by :func:`int4_tensor`: torchao's GPTQ asserts CUDA
             ("GPTQ only supports CUDA currently") and its int4 needs the CUDA-only ``mslk``
===========  =====================================================================================

int4 runs bf16 activations: tinygemm's CPU kernel with fp32 activations was 5x slower than fp32
here (REFERENCE.md). On the CPU, bf16 matrix products are fast with AVX512-BF16 or AMX.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def torchao() -> Iterator[Any]:
    """torchao's quantization API, imported quietly (``core.quiet.quiet_imports``)."""
    from ptopt.core.quiet import quiet_imports

    with quiet_imports():
        import torchao.quantization as q

        yield q


def base_config(bits: int, group_size: int | None, method: str) -> Any:
    """torchao's config for plain round-to-nearest (or HQQ) weights of ``bits``."""
    with torchao():
        if bits == 8:
            return int8_config(group_size)
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
        from torchao.quantization.quantize_.workflows import Int4ChooseQParamsAlgorithm

        algo = Int4ChooseQParamsAlgorithm.HQQ if method == "hqq" else Int4ChooseQParamsAlgorithm.TINYGEMM
        return PrototypeInt4WeightOnlyConfig(group_size=group_size, int4_choose_qparams_algorithm=algo)


def int8_config(group_size: int | None) -> Any:
    """``Int8WeightOnlyConfig``: per output channel, or a scale per ``group_size`` input columns
    (torchao 0.18 takes ``granularity=PerGroup(n)``; its ``group_size=`` argument only asserts)."""
    with torchao() as q:
        if group_size is None:
            return q.Int8WeightOnlyConfig()
        from torchao.quantization.granularity import PerGroup

        return q.Int8WeightOnlyConfig(granularity=PerGroup(group_size))


def quantize_rtn(model: Any, bits: int, group_size: int | None, method: str, selected: Callable) -> None:
    """``model``'s selected Linear layers (``selected(module, name)``) to int ``bits``, in place."""
    with torchao() as q:
        q.quantize_(model, base_config(bits, group_size, method), filter_fn=selected)


def quantize_awq(
    model: Any, bits: int, group_size: int | None, selected: Callable, calibrate: Callable[[Any], None]
) -> None:
    """AWQ in place: observe the selected layers while ``calibrate(model)`` runs the text, then
    quantize each with its searched activation scales folded in."""
    with torchao() as q:
        from torchao.prototype.awq import AWQConfig

        base = base_config(bits, group_size, "rtn")
        q.quantize_(model, AWQConfig(base, step="prepare"), filter_fn=selected)
        calibrate(model)
        observed = lambda m, name: type(m).__name__ == "AWQObservedLinear"  # noqa: E731
        q.quantize_(model, AWQConfig(base, step="convert"), filter_fn=observed)


def int4_tensor(weight: Any, codes: Any, scales: Any, zeros: Any, group_size: int) -> Any:
    """An int4 tinygemm weight from integer ``codes`` (0..15, ``[out, in]``) and per-group ``scales``
    and ``zeros`` (``[out, in / group_size]``, tinygemm's convention: ``w = (code - 8) * scale +
    zero``): what ptopt's own GPTQ rounded, packed as ``PrototypeInt4WeightOnlyConfig`` packs."""
    import torch

    with torchao():
        from torchao.prototype.quantization.int4 import Int4OpaqueTensor
        from torchao.quantization.utils import pack_tinygemm_scales_and_zeros

        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        dtype = torch.bfloat16
        sz = pack_tinygemm_scales_and_zeros(scales.to(dtype), zeros.to(dtype), dtype)
        return Int4OpaqueTensor(packed, sz, [1, group_size], weight.shape)


def is_quantized(weight: Any) -> bool:
    """Whether ``weight`` is one of torchao's quantized tensors."""
    with torchao():
        from torchao.utils import TorchAOBaseTensor

        return isinstance(weight, TorchAOBaseTensor)


def inner_tensors(weight: Any) -> list[Any]:
    """The plain tensors a torchao tensor holds (its storage), or ``[weight]`` for a plain one."""
    if not hasattr(weight, "__tensor_flatten__"):
        return [weight]
    names, _ = weight.__tensor_flatten__()
    out: list[Any] = []
    for n in names:
        inner = getattr(weight, n)
        if inner is not None:
            out.extend(inner_tensors(inner))
    return out


# -- quantization-aware training of language models (``ptopt distill --qat``) ---------------------------

#: scheme -> (weight bits, group size; None: one scale per output channel); activations int8 dynamic
QAT_SCHEMES = {"8da4w": (4, 32), "8da8w": (8, None)}


def qat_base_config(scheme: str) -> Any:
    """torchao's ``Int8DynamicActivationIntxWeightConfig`` for ``scheme``: int8 activations quantized
    per token at run time, int4 (per group) or int8 (per channel) symmetric weights; its CPU path."""
    import torch

    bits, group = QAT_SCHEMES[scheme]
    with torchao() as q:
        from torchao.quantization.granularity import PerAxis, PerGroup

        granularity = PerGroup(group) if group else PerAxis(0)
        return q.Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4 if bits == 4 else torch.int8, weight_granularity=granularity
        )


def qat_step(model: Any, scheme: str, step: str, selected: Callable) -> None:
    """``QATConfig(base, step=...)``: ``prepare`` swaps the selected Linear layers for fake-quantized
    ones (training sees the rounding), ``convert`` makes them the quantized layers of ``scheme``."""
    with torchao() as q:
        from torchao.quantization.qat import QATConfig

        q.quantize_(model, QATConfig(qat_base_config(scheme), step=step), filter_fn=selected)


def torchao_config(scheme: str, tf: Any) -> dict[str, Any]:
    """``config.json``'s ``quantization_config`` (transformers' ``TorchAoConfig``) for ``scheme``."""
    with torchao():
        return tf.TorchAoConfig(qat_base_config(scheme)).to_dict()


def flat_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """A state dict holding torchao tensors as plain tensors and metadata for safetensors."""
    with torchao():
        from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

        return flatten_tensor_state_dict(state)
