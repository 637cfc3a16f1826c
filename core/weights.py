"""Weights a model keeps outside ``parameters()``, and the precision its weights' dtypes say.

``torch.ao``'s int8 modules (Conv, Linear, their fused and dynamic forms) keep weight and bias in a
packed object (``Conv2dPackedParamsBase``, ``LinearPackedParamsBase``), not in parameters; a frozen
TorchScript (``torch.jit.freeze``, what ptopt writes) keeps every weight as a constant of its graph,
packed ones included. ``ptopt inspect`` counts both, so an int8 file does not read as 0 parameters.
"""

from __future__ import annotations

from typing import Any

#: attributes where torch.ao's quantized modules keep their packed weights
PACKED_ATTRS = ("_packed_params", "_packed_weight")
#: the modules holding a packed object for their parent (the parent names the layer)
_HOLDERS = ("LinearPackedParams", "EmbeddingPackedParams")
#: ops whose Tensor constants are quantization parameters (scale, zero point), not weights
_QPARAM_OPS = ("aten::quantize_per_tensor", "aten::quantize_per_channel")
#: weight dtype (torch's, ONNX's or OpenVINO's name) -> precision
_PRECISIONS = {
    "float32": "fp32", "float": "fp32", "f32": "fp32", "float64": "fp32", "double": "fp32", "f64": "fp32",
    "float16": "fp16", "f16": "fp16", "half": "fp16",
    "bfloat16": "bf16", "bf16": "bf16",
    "int8": "int8", "uint8": "int8", "qint8": "int8", "quint8": "int8", "i8": "int8", "u8": "int8",
    "int4": "int4", "uint4": "int4", "i4": "int4", "u4": "int4", "quint4x2": "int4",
}  # fmt: skip


def precision_of_weights(elements: dict[str, int]) -> str | None:
    """The precision the weights' dtypes say (``{dtype: element count}``): int8 (or int4) where any
    weight is (a quantized model keeps some layers float), else the float dtype holding the most
    elements. Index and shape dtypes (int64, int32: shapes, int32 biases) do not count. None: no weights."""
    counted: dict[str, int] = {}
    for d, n in elements.items():
        if d in _PRECISIONS:
            counted[_PRECISIONS[d]] = counted.get(_PRECISIONS[d], 0) + n
    quantized = {p: n for p, n in counted.items() if p.startswith("int")}
    pool = quantized or counted
    return max(pool, key=lambda p: pool[p]) if pool else None


def dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _unpack(obj: Any) -> list[Any]:
    """The tensors of a packed object (weight, then bias when there is one); [] when it does not unpack."""
    import torch

    try:
        out = obj.unpack()
    except Exception:  # noqa: BLE001 - a packed class without unpack (an LSTM cell's): not counted
        return []
    flat = out if isinstance(out, (tuple, list)) else [out]
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _row(name: str, type_: str, tensors: list[Any], op: str | None = None) -> dict[str, Any]:
    from ptopt.core.inputspec import format_shape

    w = tensors[0]
    row = {
        "name": name,
        "type": type_,
        "params": sum(t.numel() for t in tensors),
        "bytes": sum(t.numel() * t.element_size() for t in tensors),
        "weight": f"{format_shape(w.shape)} {dtype_name(w)}",
        "dtype": dtype_name(w),
    }
    return row | ({"op": op} if op else {})


def type_name(m: Any) -> str:
    """A module's class name; a TorchScript module's ``original_name`` (not ``RecursiveScriptModule``)."""
    return getattr(m, "original_name", None) or type(m).__name__


def _packed_attr(m: Any) -> Any:
    import torch

    for attr in PACKED_ATTRS:
        v = getattr(m, attr, None)
        if isinstance(v, torch.ScriptObject):
            return v
    return None


def module_packed_layers(module: Any) -> list[dict[str, Any]]:
    """A row per quantized module of ``module``'s hierarchy: its name, type, packed weight count and bytes."""
    modules = dict(module.named_modules())
    rows = []
    for name, m in modules.items():
        packed = _packed_attr(m)
        tensors = _unpack(packed) if packed is not None else []
        if not tensors:
            continue
        if type_name(m) in _HOLDERS and name:  # ``fc._packed_params``: the layer is ``fc``
            name = name.rpartition(".")[0]
            m = modules.get(name, m)
        rows.append(_row(name, type_name(m), tensors))
    return rows


def _nodes(block: Any) -> Any:
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def graph_weights(module: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """A frozen TorchScript's weights, read from its graph's constants in the order its ops take them: a
    row per packed int8 weight (named by its place among them, ``#1``, typed by the op that takes it),
    and the plain Tensor constants (float weights and biases; quantization scales and zero points left out)."""
    graph = getattr(module, "graph", None)
    if graph is None:
        return [], []
    rows, tensors, seen = [], [], set()
    for node in _nodes(graph):
        if node.kind() == "prim::Constant":
            continue
        for value in node.inputs():
            const = value.node()
            kind = str(value.type())
            if const.kind() != "prim::Constant" or value.debugName() in seen:
                continue
            if "PackedParams" in kind:
                seen.add(value.debugName())
                packed = _unpack(value.toIValue())
                if packed:
                    rows.append(
                        _row(f"#{len(rows) + 1}", node.kind().rpartition("::")[2], packed, node.kind())
                    )
            elif kind == "Tensor" and node.kind() not in _QPARAM_OPS:
                seen.add(value.debugName())
                tensors.append(value.toIValue())
    return rows, tensors
