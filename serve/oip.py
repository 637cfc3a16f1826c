"""The Open Inference Protocol (KServe v2 over HTTP/REST, as Triton speaks it): request and answer
bodies, model metadata and errors, with the standard library and numpy only (no server here).

A request is JSON ``{"id"?, "parameters"?, "inputs": [{"name", "shape", "datatype", "data" |
"parameters": {"binary_data_size": N}}], "outputs"?: [{"name", "parameters": {"binary_data": bool}}]}``;
with the binary tensor extension (what ``tritonclient.http`` sends by default) the JSON is followed by
the raw tensors and its length is the ``Inference-Header-Content-Length`` header. ``BYTES`` elements
are UTF-8 strings in JSON and 4-byte little-endian length + bytes in binary. A body may be gzip or
deflate compressed (``Content-Encoding``); answers are, when the client accepts it.

The answer has the same shape: ``{"model_name", "model_version", "id"?, "outputs": [...]}``, each
output as JSON ``data`` or, when asked for (an output's ``binary_data``, or the request's
``binary_data_output``), as raw bytes after the JSON. An error is ``{"error": message}`` with a 4xx
status naming what is wrong (what ``tritonclient`` raises as ``InferenceServerException``).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"
MODEL_VERSION = "1"
#: protocol datatype -> numpy dtype name (BF16 arrives as raw 16-bit words, widened to float32)
DATATYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "bfloat16",
    "BYTES": "object",
}
_NUMPY = {v: k for k, v in DATATYPES.items()}


class ProtocolError(Exception):
    """A request the protocol (or the model's inputs) refuses: ``status`` (4xx) and the reason."""

    def __init__(self, status: int, message: str, **extra: Any):
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra

    def body(self) -> bytes:
        return error_body(self.message, **self.extra)


def error_body(message: str, **extra: Any) -> bytes:
    return json.dumps({"error": message, **extra}).encode()


def datatype_of(dtype: Any) -> str:
    """The protocol datatype of a numpy dtype (or dtype name); strings and objects are ``BYTES``."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name.startswith(("str", "bytes")) or name == "object":
        return "BYTES"
    return _NUMPY.get(name, "BYTES")


def tensor_metadata(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [int(d) for d in shape]}


# -- request bodies --------------------------------------------------------------------------


def decode_content(body: bytes, encoding: str | None, limit: int | None) -> bytes:
    """The body with its ``Content-Encoding`` (gzip, deflate) undone, at most ``limit`` bytes after."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("identity", ""):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ProtocolError(415, f"Content-Encoding {encoding!r} is not supported (use gzip or deflate)")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, (limit + 1) if limit else 0)
    except zlib.error as e:
        raise ProtocolError(400, f"the {encoding} body does not decompress ({e})") from None
    if limit and len(out) > limit:
        raise ProtocolError(
            413, f"the request body is over the limit of {limit} bytes once decompressed", limit_bytes=limit
        )
    return out


@dataclasses.dataclass
class InferRequest:
    """One parsed infer request: inputs by name (in the order sent) with their datatypes."""

    inputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    id: str | None = None
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: requested outputs (None: all) -> answered as binary?
    outputs: dict[str, bool] | None = None
    binary_default: bool = False

    def wants_binary(self, name: str) -> bool:
        if self.outputs is not None and name in self.outputs:
            return self.outputs[name]
        return self.binary_default


def json_body(body: bytes, send: str) -> Any:
    """A request's JSON, read as UTF-8 (JSON's encoding; ``json.loads`` of bytes guesses UTF-16 and
    said "'utf-16-le' codec can't decode" of a Latin-1 body); a 400 naming what to ``send`` otherwise."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(
            400, f"the body is not UTF-8 text (byte {e.start}); send {send} as UTF-8 JSON"
        ) from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ProtocolError(400, f"malformed JSON body ({e}); send {send}") from None


def parse_infer_request(body: bytes, header_length: str | None) -> InferRequest:
    """An infer request from its (decompressed) body and ``Inference-Header-Content-Length``."""
    head, blob = _split(body, header_length)
    req = json_body(head, "an Open Inference Protocol infer request")
    if not isinstance(req, dict) or not isinstance(req.get("inputs"), list) or not req["inputs"]:
        raise ProtocolError(400, 'the infer request must be a JSON object with a non-empty "inputs" list')
    params = req.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError(400, '"parameters" must be a JSON object')
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    offset = 0
    for t in req["inputs"]:
        name, datatype, shape = _tensor_header(t)
        if name in inputs:
            raise ProtocolError(400, f"input {name!r} is given twice")
        size = (t.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(blob):
                raise ProtocolError(
                    400,
                    f"input {name!r}: binary_data_size {size} runs past the {len(blob)} bytes of tensor data",
                )
            inputs[name] = _from_binary(name, datatype, shape, blob[offset : offset + size])
            offset += size
        elif "data" in t:
            inputs[name] = _from_json(name, datatype, shape, t["data"])
        else:
            raise ProtocolError(400, f"input {name!r} has neither data nor binary_data_size")
        datatypes[name] = datatype
    if offset != len(blob):
        raise ProtocolError(400, f"{len(blob) - offset} bytes of tensor data after the inputs belong to none")
    return InferRequest(
        inputs, datatypes, _request_id(req), params, _requested(req), bool(params.get("binary_data_output"))
    )


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(body):
        raise ProtocolError(
            400, f"{HEADER_LENGTH} {header_length!r} is not a length within the {len(body)}-byte body"
        )
    return body[:n], body[n:]


def _request_id(req: dict[str, Any]) -> str | None:
    rid = req.get("id")
    return None if rid is None else str(rid)


def _requested(req: dict[str, Any]) -> dict[str, bool] | None:
    outs = req.get("outputs")
    if outs is None:
        return None
    if not isinstance(outs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in outs
    ):
        raise ProtocolError(400, '"outputs" must be a list of {"name": ...} objects')
    return {o["name"]: bool((o.get("parameters") or {}).get("binary_data")) for o in outs}


def _tensor_header(t: Any) -> tuple[str, str, list[int]]:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise ProtocolError(400, 'every input needs a "name", a "shape" and a "datatype"')
    name, datatype, shape = t["name"], t.get("datatype"), t.get("shape")
    if datatype not in DATATYPES:
        raise ProtocolError(
            400, f"input {name!r}: unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})"
        )
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError(
            400, f"input {name!r}: shape must be a list of non-negative integers, got {shape!r}"
        )
    return name, datatype, shape


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _from_json(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    if datatype == "BYTES":
        flat = list(_flatten(data))
        if not all(isinstance(v, str) for v in flat):
            raise ProtocolError(400, f"input {name!r}: BYTES data must be strings")
        arr = np.array([v.encode("utf-8") for v in flat], dtype=object)
    else:
        dtype = "float32" if datatype == "BF16" else DATATYPES[datatype]
        flat = list(_flatten(data))
        if datatype == "BOOL":
            ok = all(isinstance(v, bool) for v in flat)
        else:
            ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat)
            ok = ok and (datatype.startswith(("FP", "BF")) or all(isinstance(v, int) for v in flat))
        if not ok:
            raise ProtocolError(400, f"input {name!r}: data holds values that are not {datatype}")
        try:
            arr = np.array(flat, dtype=dtype)
        except (OverflowError, ValueError) as e:
            raise ProtocolError(400, f"input {name!r}: data does not fit {datatype} ({e})") from None
    if arr.size != _count(shape):
        raise ProtocolError(
            400, f"input {name!r}: shape {shape} holds {_count(shape)} element(s), data has {arr.size}"
        )
    return arr.reshape(shape)


def _flatten(data: Any):
    if isinstance(data, list):
        for v in data:
            yield from _flatten(v)
    else:
        yield data


def _from_binary(name: str, datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    n = _count(shape)
    if datatype == "BYTES":
        items, pos = [], 0
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise ProtocolError(400, f"input {name!r}: BYTES data ends inside an element's length")
            (size,) = struct.unpack_from("<I", raw, pos)
            items.append(bytes(raw[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos != len(raw) or len(items) != n:
            raise ProtocolError(
                400, f"input {name!r}: shape {shape} holds {n} element(s), data has {len(items)}"
            )
        return np.array(items, dtype=object).reshape(shape)
    word = "uint16" if datatype == "BF16" else DATATYPES[datatype]
    itemsize = np.dtype(word).itemsize
    if len(raw) != n * itemsize:
        raise ProtocolError(
            400,
            f"input {name!r}: shape {shape} of {datatype} is {n * itemsize} bytes, binary_data_size is {len(raw)}",
        )
    arr = np.frombuffer(raw, dtype="<" + np.dtype(word).str[1:] if itemsize > 1 else word).reshape(shape)
    if datatype == "BF16":  # the upper half of a float32
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(arr.dtype.newbyteorder("="), copy=False)


# -- answers ---------------------------------------------------------------------------------


def encode_infer_response(
    model_name: str,
    request: InferRequest,
    outputs: list[tuple[str, np.ndarray]],
    parameters: dict[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The answer body and its headers; only the requested outputs (all when none were named), and the
    answer's ``parameters`` when given."""
    if request.outputs is not None:
        have = [n for n, _ in outputs]
        unknown = [n for n in request.outputs if n not in have]
        if unknown:
            raise ProtocolError(
                400, f"unknown output(s) {', '.join(map(repr, unknown))}; the model's: {', '.join(have)}"
            )
        outputs = [(n, a) for n, a in outputs if n in request.outputs]
    tensors, blobs = [], []
    for name, arr in outputs:
        datatype = datatype_of(arr.dtype)
        entry = tensor_metadata(name, datatype, list(arr.shape))
        if request.wants_binary(name):
            raw = _to_binary(arr, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = _to_json(arr, datatype)
        tensors.append(entry)
    answer: dict[str, Any] = {"model_name": model_name, "model_version": MODEL_VERSION, "outputs": tensors}
    if request.id is not None:
        answer["id"] = request.id
    if parameters:
        answer["parameters"] = parameters
    try:
        head = json.dumps(answer, allow_nan=False).encode()
    except ValueError:
        raise ProtocolError(
            422,
            "the model's output for this input has NaN or infinite values, which JSON cannot carry; "
            "ask for binary outputs",
        ) from None
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(blobs), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


def _to_json(arr: np.ndarray, datatype: str) -> list[Any]:
    flat = arr.reshape(-1)
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat.tolist()]
    return flat.tolist()


def _to_binary(arr: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for v in arr.reshape(-1).tolist():
            b = v if isinstance(v, bytes) else str(v).encode("utf-8")
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def compress(body: bytes, headers: dict[str, str], accept_encoding: str | None) -> bytes:
    """``body`` gzip/deflate compressed when the client accepts it (``Content-Encoding`` set)."""
    accepted = {part.split(";")[0].strip().lower() for part in (accept_encoding or "").split(",")}
    if "gzip" in accepted:
        headers["Content-Encoding"] = "gzip"
        return gzip.compress(body, compresslevel=1)
    if "deflate" in accepted:
        headers["Content-Encoding"] = "deflate"
        return zlib.compress(body, 1)
    return body


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header by case-insensitive name."""
    lower = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lower), None)


# -- the model's inputs ----------------------------------------------------------------------


def spec_datatype(spec: Mapping[str, Any]) -> str:
    """The protocol datatype of an input spec (a sidecar's ``inputs`` entry)."""
    return datatype_of(spec["dtype"])


def spec_shape(spec: Mapping[str, Any]) -> list[int]:
    """The spec's shape as metadata says it: -1 where a dimension is dynamic."""
    return [lo if lo == hi else -1 for lo, hi in zip(spec["min_shape"], spec["max_shape"], strict=False)]


def checked_inputs(request: InferRequest, specs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The request's inputs checked against the model's specs (names, datatypes, shapes, values) as
    the .mar handler checks them: {name: batch array in the spec's dtype}; ProtocolError 400 naming
    the problem and what the model takes otherwise."""
    from ptopt.serve.handler import _check_array, _describe

    takes = ", ".join(_describe(s) for s in specs)
    names = [s["name"] for s in specs]
    missing = [n for n in names if n not in request.inputs]
    unknown = [n for n in request.inputs if n not in names]
    if missing or unknown:
        what = f"missing input(s) {', '.join(map(repr, missing))}" if missing else ""
        what += ("; " if what else "") + (
            f"unknown input(s) {', '.join(map(repr, unknown))}" if unknown else ""
        )
        raise ProtocolError(400, f"{what}; the model takes {takes}", expected=takes)
    out = {}
    for spec in specs:
        name, arr = spec["name"], request.inputs[spec["name"]]
        want, got = spec_datatype(spec), request.datatypes[name]
        if got != want:
            raise ProtocolError(
                400,
                f"input {name!r} has datatype {got}; the model takes {want} ({_describe(spec)})",
                expected=takes,
            )
        if arr.ndim != len(spec["opt_shape"]):
            raise ProtocolError(
                400,
                f"input {name!r} has shape {'x'.join(map(str, arr.shape)) or 'scalar'}; the model takes {_describe(spec)}",
                expected=takes,
            )
        try:
            out[name], _ = _check_array(arr, spec)
        except ValueError as e:
            raise ProtocolError(400, f"{e}; the model takes {_describe(spec)}", expected=takes) from None
    if len({a.shape[0] for a in out.values()}) != 1:
        raise ProtocolError(400, "inputs disagree on the batch size (dimension 0)", expected=takes)
    return out
