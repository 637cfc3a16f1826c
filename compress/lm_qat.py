"""Quantization-aware training of a causal language model's student (``ptopt distill --qat``), through
torchao's QAT (``QATConfig``, ``ptopt.compress.quantize.engine_torchao``) on the shared trainer: the
student's Linear layers (its output layer excepted: tied to the embedding in most small models) train
with fake quantization, then become the quantized layers of the scheme:

=========  ===============================================================================================
scheme     what the student becomes (``Int8DynamicActivationIntxWeightConfig``, its CPU path)
=========  ===============================================================================================
``8da4w``  int8 activations quantized per token at run time, int4 weights (a scale per 32 input columns)
``8da8w``  int8 activations quantized per token at run time, int8 weights (a scale per output channel)
=========  ===============================================================================================

QAT of an LM is distillation from its own float weights: ``--teacher hf:M --student hf:M --qat 8da4w``
(``--alpha 1``: the language-model loss alone). The output is ptopt's quantized folder
(``hf_weight_only``, ``ptopt.formats.hf``): ``config.json`` with transformers' ``TorchAoConfig``,
``model.safetensors`` in torchao's layout, ``quantization.json``, the tokenizer; ``from_pretrained``
loads it with torchao installed, and so does ``ptopt.load_model``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: what each scheme records, beside ``engine_torchao.QAT_SCHEMES``' bits and group size
ACTIVATIONS = "int8 dynamic (per token)"


def precision(scheme: str) -> str:
    from ptopt.compress.quantize.engine_torchao import QAT_SCHEMES

    return f"int{QAT_SCHEMES[scheme][0]}"


def _selected(model: Any) -> Any:
    """The Linear layers QAT trains: all but the output layer."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return lambda m, name: type(m) is torch.nn.Linear and m is not head


def prepare(model: Any, scheme: str) -> None:
    """Fake-quantize ``model``'s selected Linear layers in place (before training, on every rank)."""
    from ptopt.compress.quantize import engine_torchao as engine

    engine.qat_step(model, scheme, "prepare", _selected(model))


def convert(model: Any, scheme: str) -> None:
    """The trained fake-quantized layers as quantized ones, in place."""
    from ptopt.compress.quantize import engine_torchao as engine

    engine.qat_step(model, scheme, "convert", lambda m, name: type(m).__name__ == "FakeQuantizedLinear")


def write_folder(module: Any, path: Path, tokenizer_dir: Any, scheme: str) -> dict[str, Any]:
    """The quantized student as ptopt's quantized folder (module docstring), loaded back with
    ``ptopt.formats.hf.load_weight_only`` and its logits compared first."""
    import torch
    from safetensors.torch import save_file

    from ptopt.compress.quantize import engine_torchao as engine
    from ptopt.core.hf import import_transformers
    from ptopt.formats.hf import INT8_WEIGHTS, QUANT_FILE, copy_companions, load_weight_only

    bits, group = engine.QAT_SCHEMES[scheme]
    path.mkdir(parents=True, exist_ok=True)
    state = module.state_dict()
    for name in _tied_keys(module):
        state.pop(name, None)  # stored once, under the embedding's name; tied again when loaded
    tensors, metadata = engine.flat_state(state)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / INT8_WEIGHTS), metadata=metadata)
    config = module.config.to_dict() | {
        "quantization_config": engine.torchao_config(scheme, import_transformers())
    }
    (path / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n", encoding="utf-8")
    record = {"bits": bits, "group_size": group, "method": "qat", "scheme": scheme, "activations": ACTIVATIONS,
              "weights": INT8_WEIGHTS, "dtype": "float32"}  # fmt: skip
    (path / QUANT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    files = copy_companions(tokenizer_dir, path)
    ids = torch.arange(min(16, module.config.vocab_size)).unsqueeze(0)
    with torch.inference_mode():
        want = module(input_ids=ids, use_cache=False).logits
        got = load_weight_only(path)(input_ids=ids, use_cache=False).logits
    diff = float((want - got).abs().max())
    if diff > 1e-3:
        raise RuntimeError(
            f"{path}: the saved folder computes other logits than the trained model (max diff {diff})"
        )
    return {"files": files, "extra": {"weight_only": record, "reload_max_abs_diff": diff}}


def _tied_keys(module: Any) -> list[str]:
    if not getattr(module.config, "tie_word_embeddings", False):
        return []
    tied = getattr(module, "_tied_weights_keys", None) or {}
    return list(tied.keys() if isinstance(tied, dict) else tied)
