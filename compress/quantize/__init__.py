"""Quantization: int8 models (dynamic, static, QAT) and language models' int8/int4 weights
(weight-only): configs, a table from ``(mode, engine)`` to handler, one file per engine.

=======================  =====================================================================
module                   what it holds
=======================  =====================================================================
``api``                  ``quantize``, the Python twin of ``ptopt quantize``
``config``               the configs (dynamic, static, QAT, weight-only) and the search's options,
                         validated without torch or an engine; their fields are the options
``registry``             ``TECHNIQUES``: ``(mode, engine)`` -> handler (``register_technique``)
``table``                the reader: every row loaded, modes, engines, a config's row checked
``resolve``              a mode's config and the search's options from the keywords
``techniques/``          one handler file per row (``dynamic_fx``, ``static_fx``, ``qat_fx``,
                         ``static_pt2e``, ``qat_pt2e``, ``auto``, ``weight_only`` (torchao),
                         ``weight_only_openvino`` (NNCF))
``engine_fx``            torch.ao (FX graph mode, dynamic int8): its only importer
``engine_pt2e``          torchao (PT2E): its only importer
``engine_torchao``       torchao's weight-only configs (``quantize_``)
``flow``                 the engine-neutral flow of the int8 modes: prepare, call the handler,
                         measure, one Result
``weight_only``,         what weight-only quantization does to a language model, and its flow
``lm_flow``, ``gptq``    (text data, perplexity, a folder artifact); GPTQ's rounding
``autoquant``            accuracy-aware search above the flow (``autoquantize``; its candidates in
                         ``autoquant_search``, the loops in ``ptopt.core.search``)
=======================  =====================================================================

The names below are imported lazily (``from ptopt.compress.quantize import quantize`` imports the
flow, not the engines): the package itself imports nothing, so its modules import it freely.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module of this package that defines it
_EXPORTS = {
    "quantize": "api",
    "autoquantize": "autoquant",
    "AutoQuantResult": "autoquant_result",
    "AccuracyGoal": "autoquant_result",
    "QuantResult": "base",
    **{
        name: "config"
        for name in (
            "BACKENDS",
            "CONFIGS",
            "DYNAMIC_LAYERS",
            "MODES",
            "OBSERVERS",
            "ORT_CALIBRATION",
            "DynamicQuantConfig",
            "QATConfig",
            "QuantConfig",
            "StaticQuantConfig",
            "SearchOptions",
            "WeightOnlyConfig",
            "OPTIONS",
        )
    },
    "register_technique": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
