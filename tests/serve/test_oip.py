"""The Open Inference Protocol bodies (``ptopt.serve.oip``) against the real ``tritonclient``: the bytes
its ``InferInput``/``InferRequestedOutput`` send parse here, the answers built here parse in its
``InferResult``; JSON and binary tensors, BYTES, BF16, compression; every refusal names the problem.
No server: the wire format alone (the server itself: ``test_ray_serve.py``)."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest

from ptopt.serve import oip

th = pytest.importorskip("tritonclient.http", reason="tritonclient[http] (the test extra) is not installed")
from tritonclient.http._utils import _get_inference_request  # noqa: E402 - after the importorskip

SPECS = [
    {"name": "x", "min_shape": [1, 3], "opt_shape": [2, 3], "max_shape": [8, 3], "dtype": "float32"},
    {"name": "ids", "min_shape": [1, 4], "opt_shape": [2, 4], "max_shape": [8, 4], "dtype": "int64",
     "value_range": [0, 100]},
]  # fmt: skip


def _client_body(inputs, outputs=None, request_id="", parameters=None):
    """What ``InferenceServerClient.infer`` sends: (body, Inference-Header-Content-Length or None)."""
    body, json_size = _get_inference_request(
        inputs, request_id, outputs, 0, False, False, 0, None, parameters
    )
    return body, None if json_size is None else str(json_size)


def _inputs(binary=True, x=None, ids=None):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) if x is None else x
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.int64) if ids is None else ids
    a = th.InferInput("x", list(x.shape), oip.datatype_of(x.dtype)).set_data_from_numpy(x, binary_data=binary)
    b = th.InferInput("ids", list(ids.shape), "INT64").set_data_from_numpy(ids, binary_data=binary)
    return [a, b], x, ids


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_request_parses_and_checks(binary):
    inputs, x, ids = _inputs(binary)
    body, length = _client_body(inputs, request_id="r7")
    req = oip.parse_infer_request(body, length)
    assert req.id == "r7" and req.datatypes == {"x": "FP32", "ids": "INT64"}
    assert req.binary_default  # no outputs named: tritonclient asks for binary outputs
    checked = oip.checked_inputs(req, SPECS)
    np.testing.assert_array_equal(checked["x"], x)
    np.testing.assert_array_equal(checked["ids"], ids)
    assert checked["x"].dtype == np.float32 and checked["ids"].dtype == np.int64


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_answer_parses_in_tritonclient(binary):
    req = oip.InferRequest({}, {}, id="q1", outputs={"logits": binary, "ids": binary})
    logits = np.linspace(-1, 1, 20, dtype=np.float32).reshape(2, 10)
    ids = np.array([[3, 4]], dtype=np.int64)
    body, headers = oip.encode_infer_response(
        "m", req, [("logits", logits), ("ids", ids), ("unasked", logits)]
    )
    res = th.InferResult.from_response_body(
        body, header_length=headers.get(oip.HEADER_LENGTH) and int(headers[oip.HEADER_LENGTH])
    )
    np.testing.assert_array_equal(res.as_numpy("logits"), logits)
    np.testing.assert_array_equal(res.as_numpy("ids"), ids)
    assert res.as_numpy("unasked") is None  # only the requested outputs
    answer = res.get_response()
    assert answer["model_name"] == "m" and answer["id"] == "q1" and answer["model_version"] == "1"
    assert (oip.HEADER_LENGTH in headers) == binary


def test_bytes_both_ways():
    text = np.array([b"hello", "Grüße".encode()], dtype=object)
    inp = th.InferInput("text_input", [2], "BYTES").set_data_from_numpy(text)
    body, length = _client_body([inp])
    req = oip.parse_infer_request(body, length)
    assert req.inputs["text_input"].tolist() == [b"hello", "Grüße".encode()]
    out, headers = oip.encode_infer_response(
        "lm", oip.InferRequest({}, {}, binary_default=True), [("text_output", text)]
    )
    res = th.InferResult.from_response_body(out, header_length=int(headers[oip.HEADER_LENGTH]))
    assert res.as_numpy("text_output").tolist() == [b"hello", "Grüße".encode()]
    json_in = oip.parse_infer_request(
        json.dumps({"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}).encode(),
        None,
    )
    assert json_in.inputs["t"].tolist() == [b"hi"]


def test_bf16_words_widen_to_float32_and_fp16_keeps_its_type():
    x = np.array([1.5, -2.25, 3.0], dtype=np.float32)
    words = (x.view(np.uint32) >> 16).astype("<u2")  # bfloat16: the upper half of a float32
    body = {"inputs": [{"name": "a", "shape": [3], "datatype": "BF16", "parameters": {"binary_data_size": 6}},
                       {"name": "b", "shape": [3], "datatype": "FP16", "parameters": {"binary_data_size": 6}}]}  # fmt: skip
    head = json.dumps(body).encode()
    req = oip.parse_infer_request(head + words.tobytes() + x.astype("<f2").tobytes(), str(len(head)))
    np.testing.assert_array_equal(req.inputs["a"], x)
    assert req.inputs["a"].dtype == np.float32 and req.inputs["b"].dtype == np.float16


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_bodies(encoding):
    raw = b"x" * 5000
    packed = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    assert oip.decode_content(packed, encoding, limit=10_000) == raw
    with pytest.raises(oip.ProtocolError) as e:
        oip.decode_content(packed, encoding, limit=1000)  # a small body that inflates past the limit
    assert e.value.status == 413 and "once decompressed" in e.value.message
    headers: dict[str, str] = {}
    body = oip.compress(raw, headers, f"identity, {encoding}")
    assert headers["Content-Encoding"] == encoding and len(body) < 100


def _json(inputs, **extra):
    return json.dumps({"inputs": inputs, **extra}).encode()


def _binary(inputs, blob):
    """(body, Inference-Header-Content-Length) of a JSON header followed by ``blob``."""
    head = _json(inputs)
    return head + blob, str(len(head))


X = {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}
IDS = {"name": "ids", "shape": [1, 4], "datatype": "INT64", "data": [1, 2, 3, 4]}


@pytest.mark.parametrize(
    "body, length, status, words",
    [
        (b"{not json", None, 400, "malformed JSON body"),
        # Latin-1: json.loads(bytes) guessed UTF-16 and said "'utf-16-le' codec can't decode"
        ('{"inputs": "\xe9"}'.encode("latin-1"), None, 400, "the body is not UTF-8 text (byte 12)"),
        (b'{"inputs": []}', None, 400, 'non-empty "inputs"'),
        (_json([{**X, "datatype": "FP99"}]), None, 400, "unknown datatype 'FP99'"),
        (_json([{**X, "shape": [1, -3]}]), None, 400, "shape must be a list of non-negative integers"),
        (_json([{**X, "data": [1, 2]}]), None, 400, "holds 3 element(s), data has 2"),
        (_json([{**X, "data": ["a", "b", "c"]}]), None, 400, "not FP32"),
        (_json([{**IDS, "data": [1.5, 2, 3, 4]}]), None, 400, "not INT64"),
        (_json([X, X]), None, 400, "'x' is given twice"),
        (_json([{k: v for k, v in X.items() if k != "data"}]), None, 400, "neither data nor binary_data_size"),
        (*_binary([{**X, "data": None, "parameters": {"binary_data_size": 12}}], b"\0" * 8), 400, "runs past"),
        (*_binary([{"name": "x", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],
                  b"\0" * 8), 400, "is 12 bytes, binary_data_size is 8"),
        (*_binary([X], b"\0" * 4), 400, "belong to none"),
        (_json([X]), "9999", 400, "not a length within"),
        (_json([X], outputs="logits"), None, 400, '"outputs" must be a list'),
    ],
    ids=["not-json", "not-utf8", "no-inputs", "datatype", "shape", "count", "strings-for-floats", "floats-for-ints",
         "twice", "no-data", "binary-short", "binary-size", "trailing", "header-length", "outputs"],
)  # fmt: skip
def test_malformed_requests_are_400_naming_the_problem(body, length, status, words):
    with pytest.raises(oip.ProtocolError) as e:
        oip.parse_infer_request(body, length)
    assert e.value.status == status and words in e.value.message, e.value.message
    assert json.loads(e.value.body())["error"] == e.value.message


@pytest.mark.parametrize(
    "inputs, words",
    [
        ([X], "missing input(s) 'ids'"),
        ([X, IDS, {**X, "name": "z"}], "unknown input(s) 'z'"),
        ([{**X, "datatype": "FP64"}, IDS], "'x' has datatype FP64; the model takes FP32"),
        ([X, {**IDS, "datatype": "INT32"}], "'ids' has datatype INT32; the model takes INT64"),
        ([{**X, "shape": [3]}, IDS], "'x' has shape 3; the model takes x: [1..8]x3 float32"),
        ([{**X, "shape": [1, 1, 3]}, IDS], "'x' has shape 1x1x3"),
        (
            [{**X, "shape": [1, 4], "data": [1, 2, 3, 4]}, IDS],
            "input 'x' has shape 1x4; the model takes x: [1..8]x3",
        ),
        ([X, {**IDS, "data": [1, 2, 3, 400]}], "outside [0, 100)"),
        (
            [X, {**IDS, "data": [-1, 2, 3, 4]}],
            "outside [0, 100); the model takes ids: [1..8]x4 int64 in [0, 100)",
        ),
        ([{**X, "shape": [2, 3], "data": [1] * 6}, IDS], "disagree on the batch size"),
        (
            [{**X, "shape": [9, 3], "data": [1] * 27}, {**IDS, "shape": [9, 4], "data": [1] * 36}],
            "'x' has a batch of 9 rows, over the model's 8; the model takes x: [1..8]x3",
        ),
    ],
    ids=[
        "missing",
        "unknown",
        "float64",
        "int32",
        "rank-low",
        "rank-high",
        "dim",
        "value-range",
        "value-range-stated",
        "batch",
        "batch-over-max",
    ],
)
def test_inputs_not_fitting_the_specs_are_400_naming_what_the_model_takes(inputs, words):
    req = oip.parse_infer_request(_json(inputs), None)
    with pytest.raises(oip.ProtocolError) as e:
        oip.checked_inputs(req, SPECS)
    assert e.value.status == 400 and words in e.value.message, e.value.message


def test_nan_inputs_refused_and_nan_outputs_only_in_binary():
    req = oip.parse_infer_request(_json([{**X, "data": [1, float("nan"), 3]}, IDS]), None)
    with pytest.raises(oip.ProtocolError, match="NaN or infinite"):
        oip.checked_inputs(req, SPECS)
    nan = np.array([[np.nan]], dtype=np.float32)
    with pytest.raises(oip.ProtocolError) as e:
        oip.encode_infer_response("m", oip.InferRequest({}, {}), [("y", nan)])
    assert e.value.status == 422 and "binary" in e.value.message
    body, headers = oip.encode_infer_response(
        "m", oip.InferRequest({}, {}, binary_default=True), [("y", nan)]
    )
    assert np.isnan(
        th.InferResult.from_response_body(body, header_length=int(headers[oip.HEADER_LENGTH])).as_numpy("y")
    ).all()


def test_unknown_requested_output_is_400():
    with pytest.raises(oip.ProtocolError, match="unknown output.*'nope'.*the model's: y"):
        oip.encode_infer_response(
            "m", oip.InferRequest({}, {}, outputs={"nope": False}), [("y", np.zeros(1))]
        )


def test_metadata_shapes_and_datatypes_from_specs():
    assert [oip.spec_datatype(s) for s in SPECS] == ["FP32", "INT64"]
    assert oip.spec_shape(SPECS[0]) == [-1, 3]
    assert oip.datatype_of("bool") == "BOOL" and oip.datatype_of(np.dtype("U3")) == "BYTES"


def test_a_language_model_request_holds_at_most_max_prompts():
    """Prompts are generated one after the other while the replica is held: one request carries at most
    MAX_PROMPTS of them (400 naming the limit), so one client cannot hold a replica for thousands."""
    pytest.importorskip("ray.serve", reason="ray[serve] (the ray extra) is not installed")
    from ptopt.serve.ray_app import MAX_PROMPTS, _text_inputs

    def request(n):
        text = np.array([b"hi"] * n, dtype=object)
        body, length = _client_body([th.InferInput("text_input", [n], "BYTES").set_data_from_numpy(text)])
        return oip.parse_infer_request(body, length)

    assert _text_inputs(request(MAX_PROMPTS)) == ["hi"] * MAX_PROMPTS
    with pytest.raises(oip.ProtocolError, match=f"send at most {MAX_PROMPTS} a request") as e:
        _text_inputs(request(MAX_PROMPTS + 1))
    assert e.value.status == 400


def test_a_generate_body_that_is_not_utf8_is_named_so():
    from ptopt.serve import ray_app

    with pytest.raises(oip.ProtocolError) as e:
        ray_app._generate_request('{"text_input": "caf\xe9"}'.encode("latin-1"))
    assert e.value.status == 400 and e.value.message.startswith("the body is not UTF-8 text (byte 19)")
    assert ray_app._generate_request(b'{"text_input": "hi"}')[0] == ["hi"]
