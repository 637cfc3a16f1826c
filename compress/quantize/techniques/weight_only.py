"""Row ``("weight-only", "torchao")``: int8 / int4 weights of a language model's Linear layers,
float activations; the artifact is a Hugging Face folder (``ptopt.formats.hf``).

What it does to the model: ``compress/quantize/weight_only.py``; the flow around it (text data,
perplexity, the folder artifact): ``compress/quantize/lm_flow.py``.
"""

from __future__ import annotations

from typing import Any

from ptopt.compress.quantize.config import WeightOnlyConfig
from ptopt.compress.quantize.registry import register_technique
from ptopt.core.errors import UsageError


def _flow(config: WeightOnlyConfig, model: Any, output: Any, **options: Any) -> Any:
    from ptopt.compress.quantize.lm_flow import quantize_lm

    return quantize_lm(config, model, output, **options)


def _refuse_in_tensor_flow(config: WeightOnlyConfig, prep: Any, progress: bool) -> Any:
    raise UsageError("weight-only quantization runs through ptopt.quantize(mode='weight-only')")


@register_technique(
    WeightOnlyConfig,
    "torchao",
    help="torchao weight-only int8/int4 of Linear layers (rtn, hqq, awq, gptq); a Hugging Face folder",
    gated=False,
    flow=_flow,
)
def weight_only(config: WeightOnlyConfig, prep: Any, progress: bool) -> Any:
    return _refuse_in_tensor_flow(config, prep, progress)
