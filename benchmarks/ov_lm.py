"""The NNCF ``compress_weights`` + OpenVINO peer of ``bench_llm.py`` (issue 28), without optimum-intel.

optimum-intel (the CPU path users take to OpenVINO LLMs) needs transformers<5.6; 5.24 is installed here.
So this module does its two steps by hand, the way it does them:

1. ``openvino.convert_model`` of a wrapper around the Hugging Face model that takes the KV cache as
   explicit tensors and returns the new cache (a TorchScript trace, as optimum-intel's export): inputs
   ``input_ids``, ``attention_mask`` and 2 x layers past key/value tensors ``[1, kv_heads, past, head_dim]``
   (``past`` may be 0: prefill); outputs the logits and the grown cache. One graph serves perplexity
   (past 0), prefill and decode.
2. ``nncf.compress_weights(ov_model, mode=...)``: data-free, as optimum-intel's ``load_in_8bit`` /
   ``--weight-format int4`` (here: int8 asymmetric per channel; int4 symmetric, group 64, ratio 1.0:
   every layer int4, the embedding and output matrix int8 as NNCF keeps them).

:class:`OpenVINOLM` runs a compiled model behind the interface ``ptopt.core.lm`` measures
(``perplexity``, ``generation_speed``) after making it stateful as optimum-intel does (the KV cache
kept inside the plugin between calls). What optimum-intel adds that is not done here: its own
patches of the model before conversion (fused SDPA / RoPE rewrites; OpenVINO's frontend already
fuses RoPE here) and beam-search cache reordering (not needed for greedy decoding at batch 1).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any


class Output(dict):
    """What a transformers model returns, as far as ``ptopt.core.lm`` reads it: ``out.logits``, ``out[key]``."""

    __getattr__ = dict.__getitem__


def _wrapper(model: Any) -> Any:
    import torch

    from ptopt.core.hf import import_transformers

    DynamicCache = import_transformers().DynamicCache  # noqa: N806

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids: Any, attention_mask: Any, *kv: Any) -> tuple:
            cache = DynamicCache(config=model.config)
            for i, layer in enumerate(cache.layers):  # filled directly: update() would trace a cat of []
                layer.keys, layer.values, layer.is_initialized = kv[2 * i], kv[2 * i + 1], True
                layer.device, layer.dtype = kv[0].device, kv[0].dtype
            out = self.m(
                input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True
            )
            flat = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *flat)

    return Step().eval()


def cache_shape(config: Any, past: int) -> tuple[int, int, int, int]:
    return (1, config.num_key_value_heads, past, config.hidden_size // config.num_attention_heads)


def convert(model: Any, path: Path) -> Path:
    """``model`` (an HF causal LM) as an OpenVINO IR at ``path`` (.xml + .bin); returns ``path``."""
    import openvino as ov
    import torch

    layers = model.config.num_hidden_layers
    kv = [torch.zeros(cache_shape(model.config, 5)) for _ in range(2 * layers)]
    example = (
        torch.randint(0, min(1000, model.config.vocab_size), (1, 3)),
        torch.ones(1, 8, dtype=torch.int64),
        *kv,
    )
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the trace's TracerWarnings and transformers' deprecations
        ov_model = ov.convert_model(_wrapper(model), example_input=example)
    ov.save_model(ov_model, path, compress_to_fp16=False)
    return path


def compress(src: Path, dst: Path, mode: str, group_size: int = -1) -> Path:
    """``nncf.compress_weights`` of the IR at ``src`` (``mode``: ``int8_asym`` / ``int4_sym`` ...)."""
    import nncf
    import openvino as ov

    ov_model = ov.Core().read_model(src)
    kwargs = {"group_size": group_size, "ratio": 1.0} if mode.startswith("int4") else {}
    ov_model = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode(mode), **kwargs)
    ov.save_model(ov_model, dst, compress_to_fp16=False)
    return dst


def constant_bytes(path: Path) -> int:
    """Bytes of the IR's constants (its weights as stored)."""
    import openvino as ov

    model = ov.Core().read_model(path)
    return sum(op.get_byte_size() for op in model.get_ops() if op.get_type_name() == "Constant")


class OpenVINOLM:
    """A compiled IR from :func:`convert` behind ``ptopt.core.lm``'s model interface (batch 1), made
    *stateful* first as optimum-intel makes its IRs (``apply_make_stateful_transformation``: each
    past key/value input and its present output become one state the plugin keeps between calls), so
    a decode step sends one token and the attention mask, nothing else. A call without
    ``past_key_values`` starts a new sequence (the states reset to an empty cache); the
    ``past_key_values`` it returns is the number of tokens the states hold, to be passed back."""

    def __init__(self, path: Path, config: Any, threads: int, precision: str | None = None) -> None:
        import openvino as ov
        from openvino._offline_transformations import apply_make_stateful_transformation

        model = ov.Core().read_model(path)
        pairs = list(zip(model.get_parameters()[2:], model.get_results()[1:], strict=True))
        apply_make_stateful_transformation(model, pairs)
        props: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
        if precision:
            props["INFERENCE_PRECISION_HINT"] = precision
        t0 = time.perf_counter()
        self.compiled = ov.Core().compile_model(model, "CPU", props)
        self.compile_s = time.perf_counter() - t0
        self.request = self.compiled.create_infer_request()
        self.config, self.path, self.seen = config, Path(path), 0
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # f32 / bf16

    def file_bytes(self) -> int:
        return self.path.stat().st_size + self.path.with_suffix(".bin").stat().st_size

    def _new_sequence(self) -> None:
        import numpy as np
        import openvino as ov

        self.request.reset_state()
        empty = np.zeros(cache_shape(self.config, 0), np.float32)
        for state in self.request.query_state():  # the default initial state has no heads dimension
            state.state = ov.Tensor(empty)
        self.seen = 0

    def forward(self, input_ids: Any, use_cache: bool = False, past_key_values: Any = None) -> Any:
        import numpy as np
        import torch

        if past_key_values is None:
            self._new_sequence()
        elif past_key_values != self.seen:
            raise ValueError(
                f"this runner holds {self.seen} tokens, not {past_key_values}: one sequence at a time"
            )
        ids = input_ids.numpy()
        self.seen += ids.shape[1]
        result = self.request.infer([ids, np.ones((1, self.seen), np.int64)])
        logits = torch.from_numpy(result[self.compiled.outputs[0]].copy())
        return Output(logits=logits, past_key_values=self.seen if use_cache else None)

    __call__ = forward
