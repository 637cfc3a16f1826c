"""Wiring of MODEL-reference schemes: which stage resolves ``SCHEME:NAME``.

``ptopt.core`` imports no stage, so the stages' schemes are registered here, at ``import ptopt``
(every use of ptopt, CLI or Python, imports this package first). Each loader imports its stage only
when a reference of its scheme is resolved: ``import ptopt`` stays free of torch.
"""

from __future__ import annotations

from typing import Any

from ptopt.core.schemes import register_model_scheme


def _load_zoo(name: str) -> tuple[Any, list[Any], str]:
    from ptopt.models import load_zoo_model

    return load_zoo_model(name)


register_model_scheme(
    "zoo",
    _load_zoo,
    "a reference model of ptopt.models, trained on bundled data (shipped or trained on first use), cached",
)
