"""Pruning: configs, a table from config to pruner, one file per method.

=======================  =====================================================================
module                   what it holds
=======================  =====================================================================
``api``                  ``prune``, the Python twin of ``ptopt prune``; fine-tuning rounds, metrics
``config``               the configs (l1-unstructured, global, structured), validated without torch
``registry``             ``PRUNERS``: config class -> pruner (``register_pruner``)
``table``                the reader: every pruner file loaded, ``methods()``, the options
``techniques/``          one pruner file per method family (``unstructured``, ``structured``)
``channel_graph``        which layers produce, consume or join channel spaces (torch.fx)
``graph``                the same analysis on torch.export's ATen graph
``attention``            attention heads as prunable units
=======================  =====================================================================

The names below are imported lazily (``from ptopt.compress.prune import prune`` imports the flow,
not the pruners): the package itself imports nothing, so its modules import it freely.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module of this package that defines it
_EXPORTS = {
    **{
        name: "api"
        for name in (
            "prune",
            "make_config",
            "resolve_config",
            "config_method",
            "save_dense",
            "state_dict_bytes",
        )
    },
    **{
        name: "config"
        for name in (
            "PruneConfig",
            "PruneWarning",
            "L1UnstructuredConfig",
            "GlobalPruneConfig",
            "StructuredPruneConfig",
            "matches",
        )
    },
    **{name: "table" for name in ("methods", "PRUNERS")},
    "register_pruner": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
