"""``ptopt doctor``: which backends work on this machine, and for each missing one, why and the fix."""

from __future__ import annotations

from typing import Any

from ptopt.core.features import CHECKS
from ptopt.core.system import cpu_info, library_versions


def doctor() -> dict[str, Any]:
    """Machine, versions and backend availability, as a dict (the CLI renders it)."""
    import torch

    features = {}
    for name, check in CHECKS.items():
        f = check()
        features[name] = {"available": f.available, "version": f.version, "detail": f.detail, "fix": f.fix}
    return {
        "cpu": cpu_info(),
        "torch_threads": torch.get_num_threads(),
        "quantized_engines": list(torch.backends.quantized.supported_engines),
        "default_quantized_engine": torch.backends.quantized.engine,
        "versions": library_versions(),
        "features": features,
    }
