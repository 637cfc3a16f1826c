"""``ptopt.formats``: one module per artifact format, each defining its :class:`~ptopt.formats.base.Format`
row (``FORMAT``, or ``FORMATS`` for several); every row is registered in the table of
``ptopt.core.formats`` when this package is imported (at ``import ptopt``).

| module | formats | runtime |
| --- | --- | --- |
| ``torchscript`` | torchscript (``.pt``) | torch.jit |
| ``exported_program`` | exported_program (``.pt2``) | torch.export |
| ``aoti`` | aoti_package (``.pt2``, compiled) | AOTInductor |
| ``onnx`` | onnx (``.onnx`` [+ ``.onnx.data``]) | ONNX Runtime |
| ``openvino`` | openvino (``.xml`` + ``.bin``) | OpenVINO |
| ``tensorrt`` | tensorrt (``.ep``) | TensorRT (CUDA) |
| ``hf`` | hf, hf_weight_only (Hugging Face folders) | torch eager |
| ``openvino_lm`` | openvino_lm (a folder: stateful IR, NNCF weights) | OpenVINO |
| ``eager`` | eager (in memory), pickle (``torch.save(model)``) | torch eager |
| ``packages`` | mar, triton, state_dict (not run) | — |

Helpers shared by the rows: ``base`` (the row), ``runner`` (validate's runner base), ``capture``
(torch.export / jit capture), ``shapes`` (InputSpecs as each exporter's dynamic shapes). A new format
is a new module here with its ``FORMAT``, its tests and its docs section: nothing else changes.
"""

from __future__ import annotations

import importlib
import pkgutil

from ptopt.core.formats import register_format


def _register_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        rows = getattr(module, "FORMATS", None) or (
            [module.FORMAT] if hasattr(module, "FORMAT") and not isinstance(module.FORMAT, str) else []
        )
        for row in rows:
            register_format(row)


_register_all()
