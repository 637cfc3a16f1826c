"""Against a real TorchServe on 127.0.0.1, started here and always stopped (one server for the module,
serving the fp32 (with request batching), int8, ONNX and keyword-input archives, with a 1 MB body
limit, started while TorchServe's default gRPC ports 7070/7071 are taken)."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.serve.conftest import torchserve_missing

pytestmark = [
    pytest.mark.torchserve,
    pytest.mark.skipif(
        torchserve_missing() is not None, reason=f"no TorchServe here: {torchserve_missing()}"
    ),
]


@pytest.fixture(scope="module")
def mars(serve_artifacts, tmp_path_factory) -> dict[str, Path]:
    from ptopt.serve.package import package

    d = tmp_path_factory.mktemp("mars")
    out = {
        # batching on: several requests reach one handle() call, so bad and good requests share batches
        "fp32": package(
            serve_artifacts["fp32"], "mar", d / "cnn.mar", batch_size=4, max_batch_delay_ms=20
        ).path,
        "int8": package(serve_artifacts["int8"], "mar", d / "cnn_int8.mar").path,
        "onnx": package(serve_artifacts["onnx"], "mar", d / "cnn_onnx.mar", threads=1).path,
        "keyword": package(serve_artifacts["keyword"], "mar", d / "text.mar", batch_size=2).path,
    }
    return out


def _occupy(port: int) -> socket.socket | None:
    """Listen on ``port`` (loopback) if nobody does; None if it is taken already (just as good)."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen(1)
    except OSError:
        s.close()
        return None
    return s


@pytest.fixture(scope="module")
def server(mars):
    from ptopt.serve.server import ServeSettings, TorchServeServer, group_alive

    srv = TorchServeServer(
        [mars["fp32"], mars["int8"], mars["onnx"], mars["keyword"]],
        settings=ServeSettings(max_request_mb=1.0),
    )
    try:
        # TorchServe's gRPC defaults: servers must start side by side, so these must not matter
        with contextlib.ExitStack() as taken:
            for port in (7070, 7071):
                sock = _occupy(port)
                if sock is not None:
                    taken.enter_context(sock)
            srv.start()
        yield srv
    finally:
        pgid = srv.pgid
        srv.stop()
        # nothing left behind: no process of the server's group, the port free, the work folder gone
        assert pgid is None or not group_alive(pgid)
        assert not srv.workdir.exists()


def _samples(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _reference(path: Path, x) -> np.ndarray:
    model = torch.jit.load(str(path))
    with torch.inference_mode():
        out = model(**x) if isinstance(x, dict) else model(x)
    return out.numpy()


def test_predictions_equal_the_artifact_outputs(server, serve_artifacts):
    x = _samples(8, seed=3)
    want = _reference(serve_artifacts["fp32"], x)
    code, body = server.predict(x.tolist())
    assert code == 200, body
    np.testing.assert_allclose(np.array(body["outputs"]), want, rtol=1e-5, atol=1e-5)
    # one sample (no batch dimension) answers that sample's output
    code, body = server.predict(x[5].tolist())
    assert code == 200, body
    np.testing.assert_allclose(np.array(body["outputs"]), want[5], rtol=1e-5, atol=1e-5)


def test_raw_npy_body(server, serve_artifacts):
    x = _samples(3, seed=4)
    buf = io.BytesIO()
    np.save(buf, x.numpy())
    code, body = server.predict(body=buf.getvalue(), content_type="application/octet-stream")
    assert code == 200, body
    np.testing.assert_allclose(
        np.array(body["outputs"]), _reference(serve_artifacts["fp32"], x), rtol=1e-5, atol=1e-5
    )


def test_200_requests_from_8_concurrent_clients(server, serve_artifacts):
    x = _samples(200, seed=5)
    want = _reference(serve_artifacts["fp32"], x)
    results: dict[int, tuple[int, object]] = {}
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(k, 200, 8):  # bounded: 25 requests per client
            code, body = server.predict(x[i].tolist(), timeout=60)
            with lock:
                results[i] = (code, body)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) == 200
    bad = {i: r for i, r in results.items() if r[0] != 200}
    assert not bad, list(bad.items())[:3]
    got = np.array([results[i][1]["outputs"] for i in range(200)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_malformed_and_wrong_inputs_answer_4xx_and_the_server_keeps_answering(server, serve_artifacts):
    code, body = server.predict(body=b'{"inputs": [1, 2', content_type="application/json")
    assert code == 400 and "malformed JSON" in body["error"]
    assert "1x8x8 float32" in body["expected"]
    code, body = server.predict([[1.0, 2.0, 3.0]])
    assert code == 400 and "shape" in body["error"] and "1x8x8" in body["expected"]
    code, body = server.predict(body=b'{"samples": []}')
    assert code == 400 and "inputs" in body["error"]
    code, body = server.predict([["a"] * 8] * 8)
    assert code == 400
    # still serving correctly
    x = _samples(2, seed=6)
    code, body = server.predict(x.tolist())
    assert code == 200
    np.testing.assert_allclose(
        np.array(body["outputs"]), _reference(serve_artifacts["fp32"], x), rtol=1e-5, atol=1e-5
    )


def test_bad_requests_do_not_fail_good_ones_in_the_same_batch(server, serve_artifacts):
    """Concurrent good and bad requests (batch size 4, so they share handle() calls)."""
    x = _samples(16, seed=7)
    want = _reference(serve_artifacts["fp32"], x)
    results: dict[int, tuple[int, object]] = {}

    def send(i: int) -> None:
        results[i] = server.predict(x[i].tolist() if i % 2 == 0 else [[0.0] * 5], timeout=60)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i in range(16):
        code, body = results[i]
        if i % 2 == 0:
            assert code == 200, body
            np.testing.assert_allclose(np.array(body["outputs"]), want[i], rtol=1e-5, atol=1e-5)
        else:
            assert code == 400, body


def test_int8_artifact_serves(server, serve_artifacts):
    x = _samples(5, seed=8)
    code, body = server.predict(x.tolist(), model="cnn_int8")
    assert code == 200, body
    np.testing.assert_allclose(
        np.array(body["outputs"]), _reference(serve_artifacts["int8"], x), rtol=1e-5, atol=1e-5
    )


def test_onnx_artifact_serves(server, serve_artifacts):
    import onnxruntime as ort

    x = _samples(5, seed=9)
    sess = ort.InferenceSession(str(serve_artifacts["onnx"]), providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    code, body = server.predict(x.tolist(), model="cnn_onnx")
    assert code == 200, body
    np.testing.assert_allclose(np.array(body["outputs"]), want, rtol=1e-4, atol=1e-5)


def test_keyword_inputs_and_dtype_check(server, serve_artifacts):
    ids = torch.randint(0, 18, (3, 12), generator=torch.Generator().manual_seed(10))
    mask = torch.ones(3, 12, dtype=torch.int64)
    want = _reference(serve_artifacts["keyword"], {"input_ids": ids, "attention_mask": mask})
    code, body = server.predict({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}, model="text")
    assert code == 200, body
    np.testing.assert_allclose(np.array(body["outputs"]), want, rtol=1e-5, atol=1e-5)
    # floats for token ids: wrong dtype, answered 400 with what was expected
    code, body = server.predict(
        {"input_ids": (ids.float() + 0.5).tolist(), "attention_mask": mask.tolist()}, model="text"
    )
    assert code == 400 and "dtype" in body["error"] and "int64" in body["expected"]
    code, body = server.predict({"input_ids": ids.tolist()}, model="text")
    assert code == 400 and "attention_mask" in body["error"]


def test_curl_example_works(server):
    import shutil
    import subprocess

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    out = subprocess.run(["bash", "-c", server.curl_example()], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["outputs"]) == 10


def test_model_config_is_applied(server):
    """The packaged model-config.yaml sets TorchServe's batching and workers for the model."""
    import urllib.request

    with urllib.request.urlopen(f"{server.management_url}/models/cnn", timeout=30) as r:
        desc = json.loads(r.read())[0]
    assert desc["batchSize"] == 4 and desc["maxBatchDelay"] == 20
    assert desc["minWorkers"] == desc["maxWorkers"] == 1
    assert server.url.startswith("http://127.0.0.1:") and server.management_url.startswith(
        "http://127.0.0.1:"
    )


def test_every_port_is_its_own_and_on_loopback(server):
    ports = {
        server.port,
        server.management_port,
        server.metrics_port,
        server.grpc_port,
        server.grpc_management_port,
    }
    assert len(ports) == 5 and not ports & {7070, 7071, 8080, 8081, 8082}
    for port in ports:  # TorchServe listens on each of them, on 127.0.0.1
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_400_requests_over_200_concurrent_connections_all_answered(server, serve_artifacts):
    """More concurrent clients than TorchServe's default queue (100): queued, never refused (503)."""
    x = _samples(400, seed=11)
    want = _reference(serve_artifacts["fp32"], x)
    results: dict[int, tuple[int, object]] = {}
    start = threading.Barrier(200, timeout=60)

    def client(k: int) -> None:
        start.wait()  # 200 connections open at once
        for i in (k, k + 200):
            try:
                results[i] = server.predict(x[i].tolist(), timeout=240)
            except OSError as e:
                results[i] = (type(e).__name__, str(e))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) == 400
    bad = {i: r for i, r in results.items() if r[0] != 200}
    assert not bad, f"{len(bad)} of 400 failed, e.g. {list(bad.items())[:3]}"
    got = np.array([results[i][1]["outputs"] for i in range(400)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _post_keep_alive(server, body: bytes) -> tuple[int, bytes, http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request(
        "POST", f"/predictions/{server.model_name}", body=body, headers={"Content-Type": "application/json"}
    )
    r = conn.getresponse()
    return r.status, r.read(), conn


def test_bad_requests_all_answer_4xx_and_the_server_keeps_serving(server, serve_artifacts):
    limit = 1_000_000
    over = b'{"inputs": [' + b"0.5," * (limit // 4) + b"0.5]}"  # ~1 MB over the limit
    code, body = server.predict(body=over)
    assert code == 413 and body["limit_bytes"] == limit and f"limit of {limit} bytes" in body["error"]

    # far beyond the limit TorchServe answers 413 itself (no body) and the connection stays usable
    huge = b'{"inputs": [' + b"0.5," * (20_000_000 // 4) + b"0.5]}"
    code, _, conn = _post_keep_alive(server, huge)
    assert code == 413
    conn.request("POST", f"/predictions/{server.model_name}", body=json.dumps({"inputs": [[[0.0] * 8] * 8]}))
    assert conn.getresponse().status == 200
    conn.close()

    nan = json.dumps({"inputs": [[[float("nan")] * 8] * 8]}).encode()  # Python's json writes NaN
    code, body = server.predict(body=nan)
    assert code == 400 and "NaN or infinite" in body["error"]
    inf = json.dumps({"inputs": [[[1e400] * 8] * 8]}).encode()  # 1e400 is a finite-looking inf
    code, body = server.predict(body=inf)
    assert code == 400 and isinstance(body, dict)

    for bad in (b"", b"\xff\xfe", b'{"inputs": ', b"[]", b'{"inputs": {"x": 1}}'):
        code, body = server.predict(body=bad)
        assert 400 <= code < 500, (bad, code, body)

    x = _samples(3, seed=12)
    code, body = server.predict(x.tolist())
    assert code == 200
    np.testing.assert_allclose(
        np.array(body["outputs"]), _reference(serve_artifacts["fp32"], x), rtol=1e-5, atol=1e-5
    )


def test_a_json_body_of_another_type_is_read_and_a_form_is_told_what_to_send(server):
    """curl -d sends x-www-form-urlencoded, whose body TorchServe's frontend turns into form fields (a
    JSON text with no '=' into none): answered 400 naming the header to send; any other type is read."""
    body = json.dumps({"inputs": [[[0.5] * 8] * 8]}).encode()
    code, answer = server.predict(body=body, content_type="text/plain")
    assert code == 200 and len(answer["outputs"]) == 10
    code, answer = server.predict(body=body, content_type="application/x-www-form-urlencoded")
    assert code == 400 and "sent as form data" in answer["error"], answer
    assert "Content-Type: application/json" in answer["error"]
