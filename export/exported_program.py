"""ExportedProgram target (``.pt2``): ``torch.export`` with the specs' ``Dim``s, saved with
``torch.export.save``; loads with plain ``torch.export.load(path).module()``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import UnsupportedModelError
from ptopt.core.inputspec import InputSpec


def export_exported_program(
    module: Any, specs: Sequence[InputSpec], style: str, path: Path, *, source_format: str = "eager"
) -> dict:
    import torch

    from ptopt.export.onnx import export_program, quiet_export

    if source_format == "torchscript":
        raise UnsupportedModelError(
            "a TorchScript model cannot go through torch.export; export the original nn.Module "
            "(pkg.module:factory --weights W, or zoo:NAME) to --target exported_program"
        )
    ep = export_program(module, specs, style)
    with quiet_export():
        torch.export.save(ep, str(path))
    return {"files": [path.name], "method": "torch.export.export (strict=False)"}
