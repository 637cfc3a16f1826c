"""``ptopt serve --engine ray`` against the real Ray Serve, called with the real ``tritonclient``, on
127.0.0.1 only. One Ray instance for the module (Ray starts slowly): the CLI serves a ``ptopt package
--format ray`` folder of the tiny CNN (2 replicas, a quarter CPU each, dynamic batching), deployed
through the folder's Serve config as ``serve deploy`` sends it; the Python API joins that instance to
serve a language-model folder beside it (uploaded as the application's working_dir, as
for a remote cluster). A replica is killed under load: every request is still answered, and Serve
brings the replica back. The module ends with SIGTERM: exit 0 and no process of that Ray session left."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ptopt.core.features import check_ray
from tests.conftest import REPO
from tests.helpers import assert_refused
from tests.serve.conftest import PAIRS, TEXTS, bert_logits

pytestmark = pytest.mark.skipif(
    not check_ray().available, reason=f"no Ray Serve here: {check_ray().detail} (pip install 'ptopt[ray]')"
)
th = pytest.importorskip("tritonclient.http", reason="tritonclient[http] (the test extra) is not installed")
REPLICA = "ray::ServeReplica:cnn:model_cnn"


@dataclasses.dataclass
class Served:
    url: str  # http://127.0.0.1:PORT
    gcs: str  # the Ray instance's address
    token: str  # its auth token
    ray_dir: str  # its private folder (sessions, logs)
    proc: subprocess.Popen
    out: str

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[1]


def _cmdlines() -> dict[int, str]:
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    out[int(pid)] = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                pass
    return out


def replicas() -> list[int]:
    """The pids of the CNN's model replicas (Ray names its worker processes after the actor)."""
    return sorted(p for p, cmd in _cmdlines().items() if cmd.startswith(REPLICA))


@pytest.fixture(scope="module")
def served(serve_artifacts, tmp_path_factory):
    import ptopt
    from ptopt.serve.ray_server import alive, session_processes
    from ptopt.serve.server import free_port

    cwd = tmp_path_factory.mktemp("ray-cwd")
    # autoscaling pinned at 2 replicas: Serve reads an autoscaling_config from the package's config
    settings = {"autoscale": "2:2", "cpus_per_replica": 0.25, "max_batch_size": 8, "batch_wait_ms": 10,
                "max_request_mb": 0.01}  # fmt: skip
    pkg = ptopt.package(
        serve_artifacts["fp32"], "ray", tmp_path_factory.mktemp("ray-pkg") / "cnn_ray", **settings
    )
    token = secrets.token_hex(32)  # the instance's token, so that this process can join it
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    args = ["serve", str(pkg.path), "--engine", "ray", "--port", str(free_port())]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptopt.cli.main", *args], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        for line in iter(proc.stdout.readline, ""):
            lines.append(line)
            if line.startswith("try: "):
                break
        out = "".join(lines)
        assert "try: curl" in out, out + (proc.stderr.read() if proc.poll() is not None else "")
        url = re.search(r"at (http://127\.0\.0\.1:\d+)/v2 ", out).group(1)
        gcs, ray_dir = re.search(r"ray: local instance at (\S+) \(logs: (\S+),", out).groups()
        yield Served(url, gcs, token, ray_dir, proc, out)
    finally:
        session = session_processes(ray_dir) if lines and "ray_dir" in locals() else []
        stop, answers = threading.Event(), []
        clients = [threading.Thread(target=_stopping_client, args=(url, stop, answers)) for _ in range(4)]
        for c in clients if "url" in locals() else []:
            c.start()
        proc.send_signal(signal.SIGTERM)  # what a process manager sends; ray.init installs its own handler
        try:
            _, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            stop.set()
            for c in clients:
                c.join(timeout=60)
    # SIGTERM (as Ctrl-C): exit 0, and nothing of that Ray session is left (GCS, raylet, agents, Serve's
    # actors); while it served and while it stopped, no "still working" heartbeat (serving is waiting,
    # not long work, and stopping ends it)
    assert proc.returncode == 0 and "stopped." in err, err
    assert "still working" not in err.split("Ctrl-C to stop.", 1)[1], err
    # the clients sending while it stopped: answered, or the protocol's JSON 503 (draining), or no
    # connection once Ray is down; never Serve's plain-text 404 (the application being deleted) or 500
    wrong = [
        (code, body[:100])
        for code, body in answers
        if code not in (0, 200) and not _shutting_down(code, body)
    ]
    assert not wrong, wrong
    assert session and not [p for p in session if alive(p)], "Ray processes left behind"
    assert not [c for c in _cmdlines().values() if ray_dir in c or c.startswith(REPLICA)]
    assert not os.path.exists(ray_dir) and not list(cwd.iterdir())


def _stopping_client(url: str, stop: threading.Event, answers: list) -> None:
    """Infer requests until ``stop``; records (status, body)."""
    from ptopt.serve.ray_server import http

    body = json.dumps({"inputs": [_tensor([1, 1, 8, 8])]}).encode()
    while not stop.is_set():
        answers.append(http("POST", f"{url}/v2/models/cnn/infer", body, timeout=60))
        if answers[-1][0] != 200:
            time.sleep(0.02)


def _shutting_down(code: int, body: bytes) -> bool:
    try:
        return code == 503 and "shutting down" in json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False


@pytest.fixture(scope="module")
def client(served):
    return th.InferenceServerClient(served.host, concurrency=4)


def _x(n: int, seed: int = 0) -> np.ndarray:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed)).numpy()


@pytest.fixture(scope="module")
def reference(serve_artifacts):
    """The artifact's own run: the TorchScript file in torch.jit."""
    model = torch.jit.load(str(serve_artifacts["fp32"])).eval()

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(x)).numpy()

    return run


def test_banner_health_and_metadata(served, client):
    assert "serving cnn (torchscript) at " + served.url + "/v2/models/cnn/infer" in served.out
    assert "autoscaling 2:2 x 0.25 CPU, 1 thread(s) each; batches up to 8 rows, 10 ms wait" in served.out
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cnn")
    assert client.get_server_metadata()["name"] == "ptopt"
    meta = client.get_model_metadata("cnn")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert meta["outputs"] == [{"name": "output__0", "datatype": "FP32", "shape": [-1, 10]}]
    config = client.get_model_config("cnn")  # Triton's rules: a dynamic batch is max_batch_size, not a dim
    assert config["max_batch_size"] == 64 and config["input"][0]["dims"] == [1, 8, 8]
    assert config["output"][0]["dims"] == [10]
    assert client.get_model_repository_index() == [{"name": "cnn", "version": "1", "state": "READY"}]
    assert len(replicas()) == 2


@pytest.mark.parametrize(
    "binary_in, binary_out, compression",
    [(True, True, None), (False, False, None), (True, False, "gzip")],
    ids=["binary", "json", "gzip"],
)
def test_infer_equals_the_artifacts_own_run(client, reference, binary_in, binary_out, compression):
    x = _x(3, seed=1)
    inp = th.InferInput("input", list(x.shape), "FP32").set_data_from_numpy(x, binary_data=binary_in)
    out = th.InferRequestedOutput("output__0", binary_data=binary_out)
    res = client.infer("cnn", [inp], outputs=[out], request_id="r1", request_compression_algorithm=compression,
                       response_compression_algorithm=compression)  # fmt: skip
    np.testing.assert_allclose(res.as_numpy("output__0"), reference(x), atol=1e-5)
    assert res.get_response()["id"] == "r1"


def test_a_request_larger_than_a_batch_is_answered_alone(client, reference):
    """12 rows where Serve's batches hold 8 (Serve's batcher refuses such an item: it was an HTTP 500):
    the request goes to a replica alone and is answered like the artifact's own run."""
    x = _x(12, seed=3)
    inp = th.InferInput("input", list(x.shape), "FP32").set_data_from_numpy(x)
    res = client.infer("cnn", [inp])
    np.testing.assert_allclose(res.as_numpy("output__0"), reference(x), atol=1e-5)


def test_plain_json_route_answers_like_the_mar(served, reference):
    from ptopt.serve.ray_server import http

    x = _x(2, seed=2)
    code, body = http("POST", f"{served.url}/predictions/cnn", json.dumps({"inputs": x[0].tolist()}).encode())
    assert code == 200
    np.testing.assert_allclose(json.loads(body)["outputs"], reference(x[:1])[0], atol=1e-5)  # one sample
    code, body = http("POST", f"{served.url}/predictions/cnn", json.dumps({"inputs": x.tolist()}).encode())
    np.testing.assert_allclose(json.loads(body)["outputs"], reference(x), atol=1e-5)  # a batch


def _post(url: str, body: bytes, headers: dict | None = None, method: str = "POST") -> tuple[int, dict]:
    from ptopt.serve.ray_server import http

    code, raw = http(method, url, body if method == "POST" else None, timeout=30, headers=headers)
    return code, json.loads(raw) if raw else {}


def _tensor(shape, datatype="FP32", name="input"):
    n = int(np.prod(shape))
    data = [1] * n if datatype.startswith(("INT", "UINT")) else [0.5] * n
    return {"name": name, "shape": list(shape), "datatype": datatype, "data": data}


@pytest.mark.parametrize(
    "path, body, status, words",
    [
        ("cnn/infer", {"inputs": [_tensor([1, 3])]}, 400, "'input' has shape 1x3; the model takes input: [1..64]x1x8x8"),
        ("cnn/infer", {"inputs": [_tensor([1, 1, 8, 8], "INT64")]}, 400, "datatype INT64; the model takes FP32"),
        ("cnn/infer", {"inputs": [_tensor([1, 1, 8, 8], name="x")]}, 400, "missing input(s) 'input'"),
        ("cnn/infer", b'{"inputs": [{"name": "input", "shape"', 400, "malformed JSON body"),
        ("cnn/infer", {"inputs": [_tensor([40, 1, 8, 8])]}, 413, "over the limit of 10000 bytes"),
        ("nope/infer", {"inputs": [_tensor([1, 1, 8, 8])]}, 404, "unknown model 'nope'; this server serves: cnn"),
        ("cnn/versions/2/infer", {"inputs": [_tensor([1, 1, 8, 8])]}, 404, "has version 1 only"),
        ("cnn/infer", {"inputs": [_tensor([1, 1, 8, 8])], "outputs": [{"name": "probs"}]}, 400, "unknown output(s) 'probs'"),
        ("cnn/generate", {"text_input": "hi"}, 400, "takes tensors, not text"),
    ],
    ids=["shape", "dtype", "missing", "not-json", "too-big", "unknown-model", "version", "output", "generate"],
)  # fmt: skip
def test_bad_requests_are_4xx_naming_the_problem(served, path, body, status, words):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    code, answer = _post(f"{served.url}/v2/models/{path}", raw)
    assert code == status and words in answer["error"], answer


def test_tritonclient_raises_the_servers_reason(client):
    x = _x(1).astype(np.float64)
    inp = th.InferInput("input", list(x.shape), "FP64").set_data_from_numpy(x)
    with pytest.raises(th.InferenceServerException) as e:
        client.infer("cnn", [inp])
    assert e.value.status() == "400" and "datatype FP64; the model takes FP32" in e.value.message()


def test_routes_and_methods(served):
    assert _post(f"{served.url}/v2/models/cnn/infer", b"", method="GET")[0] == 405
    assert _post(f"{served.url}/v1/models/cnn", b"", method="GET")[0] == 404
    code, answer = _post(f"{served.url}/predictions/cnn", json.dumps({"inputs": [[1, 2, 3]]}).encode())
    assert code == 400 and answer["expected"].startswith("one sample (input: 1x8x8 float32)")
    gz = gzip.compress(json.dumps({"inputs": [_tensor([1, 1, 8, 8])]}).encode())
    assert _post(f"{served.url}/v2/models/cnn/infer", gz, {"Content-Encoding": "gzip"})[0] == 200


def _load(served, pool: list, stop: threading.Event, results: list, seed: int) -> None:
    """One client: requests of 1-3 samples (from ``pool``: inputs and their reference outputs) until
    ``stop``; records (status, answer right?)."""
    from ptopt.serve.ray_server import http

    i = seed
    while not stop.is_set():
        x, want = pool[i % len(pool)]
        body = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                       "data": x.reshape(-1).tolist()}]}).encode()  # fmt: skip
        code, raw = http("POST", f"{served.url}/v2/models/cnn/infer", body, timeout=120)
        ok = code == 200 and np.allclose(
            np.asarray(json.loads(raw)["outputs"][0]["data"]).reshape(-1, 10), want, atol=1e-5
        )
        results.append((code, ok))
        i += 1


def test_replica_killed_under_load_every_request_answered_and_replaced(served, reference):
    """16 clients keep sending; one model replica is SIGKILLed. The ingress sends the batches the dead
    replica held again to the live one: every request answers 200 with the right outputs, and Serve
    starts a new replica (two again)."""
    before = replicas()
    assert len(before) == 2
    stop, results = threading.Event(), []
    # 24 inputs and their references, computed once: the clients' CPU is left to Ray's new replica
    pool = [(x, reference(x)) for x in (_x(1 + i % 3, seed=100 + i) for i in range(24))]
    clients = [threading.Thread(target=_load, args=(served, pool, stop, results, k)) for k in range(16)]
    for c in clients:
        c.start()
    try:
        deadline = time.monotonic() + 60
        while len(results) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(before[0], signal.SIGKILL)
        killed_at = len(results)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            now = replicas()
            if len(now) == 2 and before[0] not in now:
                break
            time.sleep(0.25)
        more = len(results) + 40
        while len(results) < more and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=150)
    now = replicas()
    assert len(now) == 2 and before[0] not in now, f"not back to 2 replicas: {now} (killed {before[0]})"
    assert len(results) > killed_at + 40
    codes = sorted({code for code, _ in results})
    assert codes == [200] and all(ok for _, ok in results), (
        f"{codes}, {sum(not ok for _, ok in results)} wrong"
    )


def test_api_joins_the_instance_and_serves_a_language_model(served, serve_lm, monkeypatch, client):
    """``RayServer(folder, address=...)``: a language-model folder packaged here and uploaded as the
    application's working_dir (as for a remote cluster), beside the CLI's application, under /lm; text
    in, the model's own greedy text out; stop removes only it."""
    from ptopt.core.hf import load_tokenizer
    from ptopt.core.lm import greedy_tokens
    from ptopt.core.modelref import load_model
    from ptopt.serve.ray_server import RayServer, http

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", served.token)
    config = {"cpus_per_replica": 0.25, "max_tokens": 8}
    server = RayServer(serve_lm / "llama", address=served.gcs, route_prefix="/lm", config=config)
    with server:
        assert server.port == int(served.url.rsplit(":", 1)[1])  # Serve's one HTTP port
        lm = th.InferenceServerClient(f"{served.host}/lm")
        assert lm.get_model_metadata("llama")["outputs"] == [
            {"name": "text_output", "datatype": "BYTES", "shape": [-1]}
        ]
        prompt = "w5 w17 w99 w3"
        text = th.InferInput("text_input", [1], "BYTES").set_data_from_numpy(
            np.array([prompt.encode()], dtype=object)
        )
        got = lm.infer("llama", [text], parameters={"max_tokens": 5}).as_numpy("text_output")[0].decode()
        tok = load_tokenizer(serve_lm / "llama")
        ids = torch.tensor(tok(prompt)["input_ids"])
        want = tok.decode(
            greedy_tokens(load_model(serve_lm / "llama").module, ids, 5), skip_special_tokens=True
        )
        assert got == want
        code, body = http(
            "POST",
            f"{served.url}/lm/v2/models/llama/generate",
            json.dumps({"text_input": prompt, "parameters": {"max_tokens": 5}}).encode(),
        )
        assert code == 200 and json.loads(body)["text_output"] == want
        code, body = http(
            "POST",
            f"{served.url}/lm/v2/models/llama/generate",
            json.dumps({"text_input": prompt, "parameters": {"max_tokens": 9}}).encode(),
        )
        assert code == 400 and "max_tokens 9: give an integer from 1 to 8" in json.loads(body)["error"]
        # the Python side: generate (predict sends tensors, and says where a language model's text goes)
        assert server.generate(prompt, max_tokens=5) == (
            200,
            {"model_name": "llama", "model_version": "1", "text_output": want},
        )
        code, answer = server.predict([[1, 2]])
        assert code == 400 and "generates text: POST /v2/models/llama/generate" in answer["error"]
        assert client.is_model_ready("cnn")  # the CLI's application, beside it
        # what stop does first: every ingress replica, told through Ray's key-value store, answers new
        # requests the protocol's JSON 503 once drain returns (the requests in flight answered)
        assert server.drain() is True
        code, answer = server.generate(prompt, max_tokens=5)
        assert code == 503 and "shutting down" in answer["error"], answer
        assert client.is_model_ready("cnn")  # only this application drains
    import ray

    assert not ray.is_initialized()
    deadline = time.monotonic() + 30  # the proxy learns of the deletion by polling its controller
    while http("GET", f"{served.url}/lm/v2/health/ready")[0] != 404 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert http("GET", f"{served.url}/lm/v2/health/ready")[0] == 404  # gone from the instance
    assert client.is_server_ready() and len(replicas()) == 2  # the CLI's application keeps serving


def test_api_joins_the_instance_and_serves_an_encoder_that_takes_text(served, serve_bert, monkeypatch):
    """An ONNX classifier exported from a Hugging Face folder, packaged here (its tokenizer copied in) and
    deployed beside the CLI's application: its ingress replica loads the tokenizer from the package it
    was sent (``serve.text_inputs``); texts and pairs in, transformers' logits out."""
    from ptopt.serve.ray_server import RayServer

    folder, onnx, _ = serve_bert
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", served.token)
    server = RayServer(onnx, address=served.gcs, route_prefix="/bert", config={"cpus_per_replica": 0.25})
    with server:
        bert = th.InferenceServerClient(f"{served.host}/bert")
        assert bert.get_model_metadata("bert")["inputs"][0]["name"] == "text_input"
        for texts in (TEXTS, PAIRS):
            data = np.array(texts, dtype=object)
            x = th.InferInput("text_input", list(data.shape), "BYTES").set_data_from_numpy(data)
            got = bert.infer("bert", [x]).as_numpy("logits")
            np.testing.assert_allclose(got, bert_logits(folder, texts), atol=1e-5)
        code, answer = server.predict(TEXTS[0])
        assert code == 200 and np.allclose(answer["outputs"], bert_logits(folder, TEXTS[:1])[0], atol=1e-5)


def _workdirs() -> set[Path]:
    import tempfile

    return set(Path(tempfile.gettempdir()).glob("ptopt-ray-*"))


@pytest.mark.parametrize(
    "options, words",
    [
        (("--replicas", "0"), "--replicas 0: must be an integer >= 1"),
        (("--autoscale", "3:1"), "--autoscale 3:1: give MIN:MAX"),
        (("--cpus-per-replica", "0"), "--cpus-per-replica 0.0: must be a number > 0"),
        (("--replicas", "9"), "need 9 CPUs"),
        (("--workers", "2"), "--workers applies to --engine torchserve, not --engine ray"),
        (("--route-prefix", "lm"), "must start with '/'"),
    ],
    ids=["replicas", "autoscale", "cpus", "too-many-cpus", "torchserve-option", "prefix"],
)
def test_bad_options_exit_2_before_ray_starts(cli, serve_artifacts, tmp_path, options, words, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # "this machine has 2 CPUs"
    before = _workdirs()
    assert_refused(
        cli, "serve", serve_artifacts["fp32"], "--engine", "ray", *options, match=words, where=tmp_path
    )
    assert _workdirs() <= before  # the private folder made for the package is gone too


def test_ray_options_refused_for_torchserve_and_missing_ray_names_the_extra(
    cli, tmp_path, serve_artifacts, monkeypatch
):
    (tmp_path / "m.mar").write_bytes(b"")
    assert_refused(
        cli,
        "serve",
        tmp_path / "m.mar",
        "--replicas",
        "2",
        match="--replicas applies to --engine ray, not --engine torchserve",
        where=tmp_path,
    )
    from ptopt.core import features

    monkeypatch.setitem(
        features.CHECKS,
        "ray",
        lambda: features.Feature("ray", False, None, "not installed", "pip install 'ptopt[ray]'"),
    )
    assert_refused(
        cli,
        "serve",
        serve_artifacts["fp32"],
        "--engine",
        "ray",
        match=("ray is needed", "pip install 'ptopt[ray]'"),
        where=tmp_path,
    )
    from ptopt.core.errors import MissingDependencyError
    from ptopt.serve.ray_server import RayServer

    assert_refused(RayServer, serve_artifacts["fp32"], match="ptopt[ray]", error=MissingDependencyError)


def test_api_refuses_before_starting(serve_artifacts, tmp_path):
    from ptopt.core.errors import ModelLoadError, UsageError
    from ptopt.serve.ray_server import RayServer

    before = _workdirs()
    assert_refused(RayServer, tmp_path / "nope.pt", match="no such file", error=ModelLoadError)
    assert_refused(
        RayServer,
        serve_artifacts["fp32"],
        config={"max_batch_size": 0},
        match="--max-batch-size 0",
        error=UsageError,
    )
    assert_refused(
        RayServer,
        [serve_artifacts["fp32"], serve_artifacts["fp32"]],
        match="same model name 'cnn'",
        error=UsageError,
    )
    assert_refused(
        RayServer,
        serve_artifacts["fp32"],
        config={"bogus": 1},
        match="unknown Ray Serve option(s): bogus",
        error=UsageError,
    )
    server = RayServer(serve_artifacts["fp32"])
    assert_refused(server.drain, match="this server is not serving", error=UsageError)
    server.stop()
    assert _workdirs() <= before
