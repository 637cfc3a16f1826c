"""Export: ``ptopt.export(model, target, ...)`` (``api``), its options (``config``: ``ExportConfig``,
``ShapeOptions``), the one path that writes every model file (``writers``, which calls the format's
row of the table: the modules of ``ptopt.formats``, where the ONNX, int8 ONNX, OpenVINO and TensorRT
writers, graph capture and the InputSpec translations live) and the output-parity check (``parity``).

``ptopt.export(model, target=..., output=...)`` calls ``ptopt.export.api.export``.
"""

from ptopt.core.callable_module import make_callable

make_callable(__name__, "ptopt.export.api:export")
