"""ONNX language-model folders (``onnx_lm``): what ``ptopt export hf:DIR --target onnx`` writes for a causal
LM, the layout optimum's ONNX export and onnxruntime-genai use.

``model.onnx`` (+ ``model.onnx.data`` past 1 GiB of weights) is the decoder with its KV cache as explicit
inputs and outputs (``ptopt.formats.lm_graph``): ``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.N.key/value`` -> ``logits``, ``present.N.key/value``, with optimum's symbolic dimensions
(``batch_size``, ``sequence_length``, ``past_sequence_length``, ``past_sequence_length + sequence_length``).
It is translated by torch's ONNX exporter from the ``torch.export`` program of the step, with the model's
attention as ``eager`` (torch's SDPA and its ONNX translation differ on fully masked rows: left padding).
Beside it: the source's ``config.json``, tokenizer and generation files, ``ptopt_lm.json``
(``ptopt.formats.lm_folder``) and ``genai_config.json``, which lets onnxruntime-genai run the folder
(``onnxruntime_genai.Model(folder)``).

Plain ONNX Runtime runs it: prefill with zero-length past tensors ``[batch, kv_heads, 0, head_dim]``, then
one token at a time feeding each ``present`` back as the ``past``; ``ptopt.load_model(folder)`` does that
(:class:`OnnxLM`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ptopt.core.errors import UnsupportedModelError, UsageError
from ptopt.formats.lm_folder import CachedLM, LMFolder

FILE = "model.onnx"
GENAI_FILE = "genai_config.json"
#: transformers model types onnxruntime-genai 0.18 runs as plain decoders (its ``model.type``)
GENAI_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi",
    "phi3",
    "gemma",
    "gemma2",
    "granite",
    "olmo",
    "smollm3",
)


class OnnxLM(CachedLM):
    """An ``onnx_lm`` folder in ONNX Runtime (CPU provider, torch's thread count)."""

    runtime = "onnxruntime"

    def __init__(self, path: Path, config: Any, record: dict[str, Any], threads: int | None = None) -> None:
        import torch

        from ptopt.formats.onnx_session import onnx_session

        super().__init__(config, record)
        self.session = onnx_session(path, threads or torch.get_num_threads())
        self.names = [i.name for i in self.session.get_inputs()]

    def _run(self, feeds: list[Any]) -> list[Any]:
        return self.session.run(None, dict(zip(self.names, feeds, strict=True)))

    def _native(self, t: Any) -> Any:
        return t.numpy() if hasattr(t, "numpy") else t

    def _torch(self, a: Any) -> Any:
        import torch

        return torch.from_numpy(a)


class OnnxLMFolder(LMFolder):
    name = "onnx_lm"
    label = "ONNX language-model folder (decoder with KV cache inputs/outputs)"
    runtime = "onnxruntime"
    packages = ("onnx", "onnxruntime", "transformers")
    file = FILE
    lm_target = "onnx"
    #: ONNX's attention is exported as eager (module docstring)
    attention = "eager"

    def open(self, path: Path, config: Any, record: dict[str, Any], allow_pickle: bool) -> OnnxLM:
        return OnnxLM(path / FILE, config, record)

    def write_graph(self, program: Any, folder: Path, record: dict[str, Any], config: Any) -> None:
        import onnx
        import torch

        from ptopt.formats.capture import quiet_export, torchlib_registry_reused
        from ptopt.formats.lm_graph import example, io_names
        from ptopt.formats.onnx_export import (
            DYNAMO_MIN_OPSET,
            EXTERNAL_DATA_BYTES,
            _summary,
            check_onnx,
            default_opset,
            save_onnx,
        )

        asked = record.get("opset")
        if asked is not None and asked < DYNAMO_MIN_OPSET:  # dynamo writes 18 when asked for less
            raise UsageError(
                f"--opset {asked}: a language model's ONNX export writes opset {DYNAMO_MIN_OPSET} or later"
            )
        inputs, outputs = io_names(record["layout"]["layers"])
        try:
            with quiet_export(), torchlib_registry_reused():
                onnx_program = torch.onnx.export(
                    program, example(config, batch=2 if record["batch"][1] > 1 else 1),
                    input_names=inputs, output_names=outputs, opset_version=record.get("opset"),
                    dynamo=True, verbose=False,
                )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - exporter errors come in many types
            raise UnsupportedModelError(
                f"the ONNX exporter cannot translate the decoder: {type(e).__name__}: {_summary(e)}"
            ) from None
        model = onnx_program.model_proto
        name_dims(model, record["layout"]["layers"])
        big = record["weight_bytes"] >= EXTERNAL_DATA_BYTES
        save_onnx(model, folder / FILE, big)
        check_onnx(folder / FILE)
        record |= {"opset": default_opset(model), "external_data": big,
                   "exporter": f"torch.onnx (dynamo=True), torch {torch.__version__}, onnx {onnx.__version__}"}  # fmt: skip
        genai = genai_config(config, record)
        if genai is not None:
            (folder / GENAI_FILE).write_text(json.dumps(genai, indent=2) + "\n", encoding="utf-8")


def name_dims(model: Any, layers: int) -> None:
    """optimum's names for the graph's symbolic dimensions (the exporter invents ``s0 + s43`` ...)."""
    from ptopt.formats.lm_graph import DIMS

    wanted = {"input_ids": ("batch", "sequence"), "attention_mask": ("batch", "total"),
              "position_ids": ("batch", "sequence"), "logits": ("batch", "sequence", None)}  # fmt: skip
    for i in range(layers):
        for k in ("key", "value"):
            wanted[f"past_key_values.{i}.{k}"] = ("batch", None, "past", None)
            wanted[f"present.{i}.{k}"] = ("batch", None, "total", None)
    for vi in list(model.graph.input) + list(model.graph.output):
        for d, role in zip(vi.type.tensor_type.shape.dim, wanted.get(vi.name, ()), strict=False):
            if role is not None and not d.HasField("dim_value"):
                d.dim_param = DIMS[role]


def genai_config(config: Any, record: dict[str, Any]) -> dict[str, Any] | None:
    """``genai_config.json`` for onnxruntime-genai (None for a model type it does not run)."""
    kind = getattr(config, "model_type", "")
    if kind not in GENAI_TYPES:
        return None
    lay, longest = record["layout"], record["max_positions"]
    io = {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
          "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}  # fmt: skip
    out = {
        "logits": "logits",
        "present_key_names": "present.%d.key",
        "present_value_names": "present.%d.value",
    }
    eos = getattr(config, "eos_token_id", None)
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": FILE, "head_size": lay["head_dim"], "hidden_size": int(config.hidden_size),
        "inputs": io, "outputs": out, "num_attention_heads": int(config.num_attention_heads),
        "num_hidden_layers": lay["layers"], "num_key_value_heads": lay["kv_heads"],
    }  # fmt: skip
    return {
        "model": {
            "bos_token_id": getattr(config, "bos_token_id", None) or 0, "context_length": longest,
            "decoder": decoder, "eos_token_id": eos if eos is not None else 0,
            "pad_token_id": getattr(config, "pad_token_id", None) or (eos if isinstance(eos, int) else 0),
            "type": kind, "vocab_size": lay["vocab"],
        },
        "search": {"do_sample": False, "max_length": longest, "min_length": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": False, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 1, "top_p": 1.0},
    }  # fmt: skip


FORMAT = OnnxLMFolder()
