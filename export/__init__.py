"""Export: ``ptopt.export(model, target, ...)`` (``api``), the one writer per format (``writers``,
with ``onnx``/``onnx_int8``/``tensorrt`` behind it), graph capture (``tracing``), InputSpec
translations (``shapes``) and the output-parity check (``parity``).

``ptopt.export(model, target=..., output=...)`` calls ``ptopt.export.api.export``.
"""

from ptopt.core.callable_module import make_callable

make_callable(__name__, "ptopt.export.api:export")
