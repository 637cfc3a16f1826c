"""Wiring of MODEL-reference schemes: which stage resolves ``SCHEME:NAME``.

``ptopt.core`` imports no stage, so the stages' schemes are registered here, at ``import ptopt``
(every use of ptopt, CLI or Python, imports this package first). Each loader imports its stage only
when a reference of its scheme is resolved: ``import ptopt`` stays free of torch. The same goes for
the eager module of a pruned file (``core.modelref.rebuilt_eager``): export asks core, core asks compress.
"""

from __future__ import annotations

from typing import Any

from ptopt.core.modelref import register_eager_rebuilder
from ptopt.core.schemes import register_model_scheme


def _load_zoo(name: str) -> tuple[Any, list[Any], str]:
    from ptopt.models import load_zoo_model

    return load_zoo_model(name)


register_model_scheme(
    "zoo",
    _load_zoo,
    "a reference model of ptopt.models, trained on bundled data (shipped or trained on first use), cached",
)


def _rebuild_pruned(loaded: Any, allow_pickle: bool, for_what: str) -> tuple[Any, str]:
    """A pruned TorchScript / ExportedProgram file's eager module (``compress.rebuild``), for a stage that
    does not import compress (export): ``(None, why)`` when consent is missing, ``(None, "")`` when the
    file is no pruned file."""
    if loaded.artifact is None or loaded.format not in ("torchscript", "exported_program"):
        return None, ""  # compress not imported for every file
    from ptopt.compress import rebuild
    from ptopt.compress.stage import load_eager

    if not rebuild.rebuildable(loaded):
        return None, ""
    consent = rebuild.consent_missing(loaded, allow_pickle)
    if consent:
        return None, consent
    return rebuild.rebuild(loaded, allow_pickle, for_what, load_eager), ""


register_eager_rebuilder(_rebuild_pruned)
