"""Export targets (one file each: torchscript, onnx, tensorrt) and the parity check.

``ptopt.export(model, target=..., output=...)`` calls ``ptopt.export.api.export``.
"""

from ptopt.core.callable_module import make_callable

make_callable(__name__, "ptopt.export.api:export")
