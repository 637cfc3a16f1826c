"""What an ONNX or OpenVINO IR graph says without running it, for ``ptopt inspect`` (``Format.describe``):
its outputs (name, shape, dtype), its weights (ONNX initializers and ``Constant`` nodes, OpenVINO
``Constant`` ops: count, elements, bytes, by dtype) and the precision the graph records (OpenVINO's
rt_info). Neither runtime's session is created: ONNX is read without its external data, the IR without
compiling it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: OpenVINO element type -> the dtype name torch and numpy use
_OV_DTYPES = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
    "i8": "int8", "u8": "uint8", "i4": "int4", "u4": "uint4", "i32": "int32", "i64": "int64",
    "u32": "uint32", "u64": "uint64", "boolean": "bool",
}  # fmt: skip


def _dim_text(lo: int, hi: int) -> int | str:
    """A dimension as ``inspect`` shows it: an int when fixed, ``lo..hi`` when bounded, else ``?``."""
    if lo == hi and lo >= 0:
        return lo
    return f"{max(lo, 1)}..{hi}" if hi > 0 else "?"


def _facts(outputs: list[dict[str, Any]], sizes: list[tuple[str, str, int, int]], precision: Any) -> dict:
    """The ``describe`` answer from the outputs and ``(kind, dtype, elements, bytes)`` per weight."""
    elements: dict[str, int] = {}
    weights: dict[str, dict[str, int]] = {}
    for kind, dtype, n, nbytes in sizes:
        elements[dtype] = elements.get(dtype, 0) + n
        w = weights.setdefault(kind, {"count": 0, "bytes": 0})
        w["count"] += 1
        w["bytes"] += nbytes
    return {
        "outputs": outputs,
        "parameters": sum(n for _, _, n, _ in sizes),
        "parameter_bytes": sum(b for _, _, _, b in sizes),
        "weights": weights,
        "weight_dtypes": elements,
        # only what the graph records (OpenVINO's rt_info); inspect says what the weights' dtypes say as such
        "precision": precision,
    }


def onnx_facts(path: Path, specs: Any) -> dict[str, Any]:
    """An ONNX file's outputs and initializers (``Constant`` nodes too). A symbolic output dim that an
    input shares (``batch``) gets that input's range from ``specs``."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    ranges = _onnx_symbol_ranges(graph, specs)
    outputs = []
    for o in graph.output:
        t = o.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else ranges.get(d.dim_param, "?") for d in t.shape.dim
        ]
        outputs.append({"name": o.name, "shape": shape, "dtype": _onnx_dtype(t.elem_type)})
    sizes = [_onnx_size("initializers", t) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant":
            sizes += [_onnx_size("constants", a.t) for a in node.attribute if a.name == "value"]
    return _facts(outputs, sizes, None)


def _onnx_symbol_ranges(graph: Any, specs: Any) -> dict[str, int | str]:
    by_name = {s.name: s for s in specs or []}
    ranges: dict[str, int | str] = {}
    for inp in graph.input:
        spec = by_name.get(inp.name)
        for i, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.dim_param and spec is not None and i < len(spec.min_shape):
                ranges.setdefault(d.dim_param, _dim_text(spec.min_shape[i], spec.max_shape[i]))
    return ranges


def _onnx_dtype(elem_type: int) -> str:
    import onnx

    name = onnx.TensorProto.DataType.Name(elem_type).lower()
    return {"float": "float32", "double": "float64"}.get(name, name)


def _onnx_size(kind: str, t: Any) -> tuple[str, str, int, int]:
    """(kind, dtype, elements, bytes) of a TensorProto, from its dims (external data is not read)."""
    import onnx

    n = 1
    for d in t.dims:
        n *= d
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 1
    if _onnx_dtype(t.data_type) in ("int4", "uint4"):
        return kind, _onnx_dtype(t.data_type), n, (n + 1) // 2
    return kind, _onnx_dtype(t.data_type), n, n * itemsize


def openvino_facts(model: Any, recorded: str | None) -> dict[str, Any]:
    """An IR's outputs and ``Constant`` ops (``model``: read, not compiled); ``recorded``: the precision
    ptopt recorded in it (its ``rt_info``), else None."""
    outputs = []
    for i, o in enumerate(model.outputs):
        shape = [
            d.get_length() if d.is_static else _dim_text(d.get_min_length(), d.get_max_length())
            for d in o.get_partial_shape()
        ]
        name = o.get_any_name() if o.get_names() else f"output__{i}"
        et = o.get_element_type().get_type_name()
        outputs.append({"name": name, "shape": shape, "dtype": _OV_DTYPES.get(et, et)})
    sizes = []
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant":
            et = op.get_element_type().get_type_name()
            n = 1
            for d in op.get_output_shape(0):
                n *= d
            sizes.append(("constants", _OV_DTYPES.get(et, et), n, op.get_byte_size()))
    return _facts(outputs, sizes, recorded)
