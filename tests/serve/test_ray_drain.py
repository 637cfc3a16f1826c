"""Stopping a busy Ray Serve server, without a Ray instance: the ingress's draining (a request in flight is
answered 200, a new one the protocol's JSON 503, an unexpected failure JSON, never Serve's plain-text
404/500), the CLI's silence while it stops, and the HTTP helper when an answer is cut. The real stop
under load (SIGTERM with clients sending): ``test_ray_serve.py``'s module fixture."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest

pytest.importorskip("ray.serve", reason="ray[serve] (the ray extra) is not installed")
from starlette.requests import Request  # noqa: E402 - after the importorskip


class _Slow:
    """A model deployment's handle whose ``generate`` answers only once ``release`` is set, or raises
    ``fail`` (after calling ``before_failing``)."""

    def __init__(self):
        self.release = asyncio.Event()
        self.fail: BaseException | None = None
        self.before_failing = lambda: None

    def __getattr__(self, method):
        async def call(*args):
            if self.fail is not None:
                self.before_failing()
                raise self.fail
            await self.release.wait()
            return ["slow answer"]

        return type("Method", (), {"remote": staticmethod(call)})


def _ingress(handle):
    from ptopt.serve.ray_app import PtoptIngress

    manifest = {"models": [{"name": "lm", "kind": "text", "max_batch": 1}], "max_request_bytes": 1 << 20,
                "max_tokens": 8, "max_batch_size": 1}  # fmt: skip
    return PtoptIngress.func_or_class({"lm": handle}, manifest)


def _request(path="/v2/models/lm/generate", body=b'{"text_input": "hi"}'):
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "query_string": b"",
             "headers": [(b"content-length", str(len(body)).encode())]}  # fmt: skip
    sent = []

    async def receive():
        if sent:
            return {"type": "http.disconnect"}
        sent.append(1)
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


async def _answer(ingress, request):
    response = await ingress(request)
    assert response.headers["content-type"] == "application/json", response.body
    return response.status_code, json.loads(response.body)


def test_draining_finishes_the_request_in_flight_and_answers_new_ones_json_503():
    """A request held in the model while ``stop`` turns draining on is answered 200; one arriving after
    is a JSON 503 saying the server is shutting down (before, Serve's proxy answered it a plain-text
    404, the application being deleted), and it never reaches the model."""
    slow = _Slow()
    ingress = _ingress(slow)

    async def scenario():
        held = asyncio.create_task(_answer(ingress, _request()))
        while ingress.inflight == 0:  # the request is in the model, waiting
            await asyncio.sleep(0)
        ingress.draining = True  # what the drain watch sets on stop's word
        code, answer = await _answer(ingress, _request())
        assert ingress.inflight == 1  # the new request was refused, not counted
        slow.release.set()
        return (code, answer), await held

    (code, answer), (held_code, held_answer) = asyncio.run(scenario())
    assert code == 503 and set(answer) == {"error"} and "shutting down" in answer["error"], answer
    assert held_code == 200 and held_answer["text_output"] == "slow answer", held_answer
    assert ingress.inflight == 0
    assert asyncio.run(_answer(ingress, _request("/v2/health/live")))[0] == 503  # every route, health too


@pytest.mark.parametrize(
    "draining, error, status, words",
    [(False, RuntimeError, 500, "internal error: RuntimeError"), (True, RuntimeError, 503, "shutting down"),
     (False, "backpressure", 503, "model deployment unavailable (BackPressureError: Request dropped")],
    ids=["bug", "while-stopping", "serve-backpressure"],
)  # fmt: skip
def test_an_unexpected_failure_is_json_never_a_plain_500(draining, error, status, words):
    """A model call failing in a way the ingress does not expect (a deployment being deleted, a bug) was
    Serve's plain-text "Internal Server Error"; now it is the protocol's JSON error, 503 while stopping
    or when Serve says the model deployment cannot take the call now."""
    from ray.serve import exceptions

    slow = _Slow()
    if error == "backpressure":
        slow.fail = exceptions.BackPressureError(num_queued_requests=9, max_queued_requests=8)
    else:
        slow.fail = error("deployment model_lm is being deleted")
    ingress = _ingress(slow)
    if draining:  # the failure comes while the request is in flight and the server starts stopping
        slow.before_failing = lambda: setattr(ingress, "draining", True)

    async def scenario():
        return await _answer(ingress, _request())

    code, answer = asyncio.run(scenario())
    assert code == status and set(answer) == {"error"} and words in answer["error"], answer


def test_stopping_the_cli_server_prints_no_heartbeat(monkeypatch):
    """``ptopt serve``: after "Ctrl-C to stop." no "still working" line, while serving and while stopping
    (a stop under load took 20 s and printed them, and "ptopt serve: done in N s" after "stopped.").
    Checked without waiting: inside ``stop`` the heartbeat thread's own choice, after a long silence,
    names no step."""
    import time

    import click

    from ptopt.cli.serve import _until_stopped
    from ptopt.core import progress

    seen = {}

    class Server:
        def start(self):
            pass

        def stop(self):
            reporter = progress._current()
            reporter.last = time.monotonic() - 100  # as after a long silence
            seen["due"] = reporter._due()

    def ctrl_c():
        raise KeyboardInterrupt

    lines: list[str] = []
    monkeypatch.setattr(click, "echo", lambda text, err=False: lines.append(text))
    with progress.reporting(lines.append), progress.step("ptopt serve", announce=False, since=0.0):
        _until_stopped(Server(), "Ray Serve", ctrl_c, lambda: None)
    assert seen == {"due": None}, seen
    assert lines == ["Ctrl-C to stop.", "stopping Ray Serve ...", "stopped."], lines


def test_the_callers_signal_handlers_are_back_after_serving():
    """``_until_stopped`` sets SIGTERM (and Ctrl-C) to stop the server; after it the caller's handlers are
    back (a pytest-xdist worker left with SIGTERM raising KeyboardInterrupt went down 'not properly
    terminated' in a full run)."""
    import signal

    from ptopt.cli.serve import _until_stopped

    class Server:
        def start(self):
            pass

        def stop(self):
            pass

    def ctrl_c():
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    _until_stopped(Server(), "Ray Serve", ctrl_c, lambda: None)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_http_helper_returns_a_cut_answer_instead_of_raising():
    """An answer whose connection closed inside its body (a server stopping) raised ``IncompleteRead``
    out of ``ray_server.http`` (and out of ``RayServer.predict``); it is a status with the reason now."""
    from ptopt.serve.ray_server import http

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(2)
    port = server.getsockname()[1]
    heads = [b"HTTP/1.1 503 Service Unavailable", b"HTTP/1.1 200 OK"]

    def serve():
        for head in heads:
            conn, _ = server.accept()
            conn.recv(65536)
            conn.sendall(head + b"\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc")  # then closes
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        code, body = http("GET", f"http://127.0.0.1:{port}/", timeout=10)
        assert code == 503 and b"IncompleteRead" in body, body
        code, body = http("GET", f"http://127.0.0.1:{port}/", timeout=10)
        assert code == 0 and body, body
    finally:
        t.join(timeout=10)
        server.close()


def test_a_second_interrupt_during_the_drain_still_stops_the_local_instance(monkeypatch, tmp_path):
    """A second Ctrl-C (or SIGTERM: the CLI raises KeyboardInterrupt for it) while ``stop`` waits for the
    drain (up to DRAIN_TIMEOUT_S) escaped ``stop``: Ray was never shut down and the local instance's processes (the
    HTTP proxy among them, answering 503 for ever) outlived the server. It cuts the drain short now."""
    import ray

    from ptopt.serve import ray_server
    from ptopt.serve.ray_server import RayServer

    done: list[str] = []
    server = object.__new__(RayServer)
    server.__dict__.update(
        _started_ray=True, _owns_app=True, _serving=True, address=None, app_name="m", workdir=tmp_path / "w",
        _session=[], _saved_env={},
    )  # fmt: skip

    def interrupted(timeout_s=0.0):
        raise KeyboardInterrupt

    monkeypatch.setattr(server, "drain", interrupted, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", lambda: done.append("ray.shutdown"))
    monkeypatch.setattr(ray_server, "session_processes", lambda temp_dir: [])
    monkeypatch.setattr(ray_server, "_kill_proxy", lambda pids: done.append("proxy killed"))
    monkeypatch.setattr(
        ray_server, "end_processes", lambda pids, grace_s: done.append(f"ended ({grace_s} s)")
    )
    server.stop()
    assert done == ["proxy killed", "ray.shutdown", f"ended ({ray_server.KILL_GRACE_S} s)"], done
    assert not server._serving and not server._started_ray


def test_an_interrupt_that_cuts_rays_shutdown_short_kills_without_the_long_grace(monkeypatch, tmp_path):
    """A second Ctrl-C / SIGTERM inside ``ray.shutdown``: the instance's processes were then sent SIGTERM and
    given 10 s before SIGKILL, which the GCS and the raylet used (a hurried stop took 11.7 s, a plain one
    2.3 s). The user asked for it to end now: 2 s."""
    import ray

    from ptopt.serve import ray_server

    graces: list[float] = []

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", interrupted)
    monkeypatch.setattr(ray_server, "session_processes", lambda temp_dir: [])
    monkeypatch.setattr(ray_server, "_kill_proxy", lambda pids: None)
    monkeypatch.setattr(ray_server, "end_processes", lambda pids, grace_s: graces.append(grace_s))
    server = _stopping_server(tmp_path, _serving=False)
    server.stop()
    assert graces == [ray_server.HURRIED_GRACE_S] and ray_server.HURRIED_GRACE_S < ray_server.KILL_GRACE_S


def test_a_drain_word_left_on_a_cluster_does_not_refuse_a_new_application(monkeypatch):
    """A server that died stopping (SIGKILL inside the drain, a failed delete) left ``drain/APP`` in the
    cluster's key-value store: every later ingress of that application name (``serve deploy`` of the
    package, which nothing clears it for) read it and answered 503 to everything, health included, for
    ever. A replica now ignores the word it finds when it starts; stop's own, written after, drains it."""
    from types import SimpleNamespace

    from ray import serve
    from ray.experimental import internal_kv as kv

    from ptopt.serve import ray_app

    store = {"drain/lm": b"left by a server that died stopping"}
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key, namespace=None: store.get(key))
    monkeypatch.setattr(kv, "_internal_kv_exists", lambda key, namespace=None: key in store)

    def put(key, value, overwrite=True, namespace=None):
        store[key] = value

    monkeypatch.setattr(kv, "_internal_kv_put", put)
    context = SimpleNamespace(app_name="lm", replica_id=SimpleNamespace(unique_id="r1"))
    monkeypatch.setattr(serve, "get_replica_context", lambda: context)
    monkeypatch.setattr(ray_app, "DRAIN_POLL_S", 0.01)
    ingress = _ingress(_Slow())

    async def scenario():
        ingress._watch()  # what the constructor does inside a replica's event loop
        await asyncio.sleep(0.2)
        code = (await ingress(_request("/v2/health/live"))).status_code
        stale = ingress.draining
        store["drain/lm"] = b"stop's own token"
        said = []
        for _ in range(400):
            await asyncio.sleep(0.01)
            if store.get("drain/lm/r1") not in (None, *said[-1:]):
                said.append(store["drain/lm/r1"])
            if len(said) == 2:
                break
        ingress._watcher.cancel()
        return code, stale, said

    code, stale, said = asyncio.run(scenario())
    assert code == 200 and not stale
    # its count (0) and a beat that changes at every poll: the stop tells a live replica from a dead one
    assert ingress.draining and [v.split()[0] for v in said] == ["0", "0"] and said[0] != said[1], said


def test_a_stop_fits_kubernetes_default_grace_period():
    """SIGTERM, then SIGKILL 30 s later (Kubernetes' default terminationGracePeriodSeconds): the drain's
    bound plus Ray's own shutdown (~2 s, docs/serve.md) must end before it, or Ray's processes outlive
    the pod's main process."""
    from ptopt.serve.ray_config import DRAIN_TIMEOUT_S

    assert DRAIN_TIMEOUT_S + 5 <= 30


def _stopping_server(tmp_path, **state):
    from ptopt.serve.ray_server import RayServer

    server = object.__new__(RayServer)
    server.__dict__.update(
        _started_ray=True, _owns_app=True, _serving=True, address=None, app_name="m", workdir=tmp_path / "w",
        _session=[], _saved_env={}, manifest={"ingress_replicas": 2},
    )  # fmt: skip
    server.__dict__.update(state)
    return server


def test_a_dead_replicas_count_is_not_waited_for(monkeypatch, tmp_path):
    """An ingress replica that died (or was replaced) while draining left its count key (2 in flight, for
    ever): ``drain`` waited the whole DRAIN_TIMEOUT_S for it. A live replica rewrites its key at every
    poll; one unchanged for DRAIN_STALE_S is ignored now, and the live one's 0 ends the wait."""
    from ray.experimental import internal_kv as kv

    from ptopt.serve import ray_app

    beats = iter(range(1, 10**6))
    store = {b"drain/m/dead": lambda: b"2 17", b"drain/m/live": lambda: f"0 {next(beats)}".encode()}
    monkeypatch.setattr(kv, "_internal_kv_put", lambda *a, **k: None)
    monkeypatch.setattr(kv, "_internal_kv_list", lambda prefix, namespace=None: list(store))
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key, namespace=None: store[key]())
    monkeypatch.setattr(ray_app, "DRAIN_STALE_S", 0.3, raising=False)
    assert _stopping_server(tmp_path).drain(timeout_s=30) is True
    # a live replica still answering is waited for: the drain ends when its count says 0
    counts = iter([b"1 1", b"1 2", b"1 3", b"0 4"])
    store = {b"drain/m/a": lambda: next(counts, b"0 5"), b"drain/m/b": lambda: f"0 {next(beats)}".encode()}
    assert _stopping_server(tmp_path).drain(timeout_s=30) is True
    assert next(counts, "all read") == "all read"


def test_a_replica_started_during_a_live_drain_drains_too(monkeypatch, tmp_path):
    """A replica Serve starts while ``stop`` drains (replacing one that died) found stop's token at its
    start, took it for one left by a dead server and served normally through the stop. A live drain now
    rewrites its token; the new replica sees it change, answers 503 and reports its count, which ends
    the drain. A token left behind never changes: ignored (the test above)."""
    from types import SimpleNamespace

    from ray import serve
    from ray.experimental import internal_kv as kv

    from ptopt.serve import ray_app

    store: dict = {}
    lock = threading.Lock()

    def put(key, value, overwrite=True, namespace=None):
        with lock:
            store[key.encode() if isinstance(key, str) else key] = value

    def get(key, namespace=None):
        with lock:
            return store.get(key.encode() if isinstance(key, str) else key)

    def keys(prefix, namespace=None):
        with lock:
            return [k for k in store if k.startswith(prefix.encode()) and k != prefix.encode()]

    monkeypatch.setattr(kv, "_internal_kv_put", put)
    monkeypatch.setattr(kv, "_internal_kv_get", get)
    monkeypatch.setattr(kv, "_internal_kv_list", keys)
    context = SimpleNamespace(app_name="m", replica_id=SimpleNamespace(unique_id="new"))
    monkeypatch.setattr(serve, "get_replica_context", lambda: context)
    monkeypatch.setattr(ray_app, "DRAIN_POLL_S", 0.01)
    monkeypatch.setattr(ray_app, "DRAIN_REFRESH_S", 0.05)
    ended = []
    stopping = threading.Thread(
        target=lambda: ended.append(_stopping_server(tmp_path, manifest={"ingress_replicas": 1}).drain(5))
    )
    stopping.start()
    while get("drain/m") is None:  # stop's word is out: the new replica starts only now
        threading.Event().wait(0.01)
    ingress = _ingress(_Slow())

    async def scenario():
        ingress._watch()
        for _ in range(300):
            await asyncio.sleep(0.01)
            if ingress.draining:
                break
        code = (await ingress(_request("/v2/health/live"))).status_code
        await asyncio.to_thread(stopping.join, 5)
        ingress._watcher.cancel()
        return code

    code = asyncio.run(scenario())
    assert ingress.draining and code == 503
    assert ended == [True]  # the drain ended on the new replica's 0, not on its timeout


def _in_own_process(request) -> bool:
    """Under pytest-xdist, run this test again in a process of its own and say so (True: done). It sends
    SIGINT to its own process: in a worker that ended the worker ("node down: Not properly terminated")
    and hung the whole run."""
    import os
    import subprocess
    import sys

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", request.node.nodeid],
        cwd=request.config.rootpath, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return True


def test_an_interrupt_during_the_teardown_still_kills_the_local_instance(monkeypatch, tmp_path, request):
    """A Ctrl-C / SIGTERM inside ``ray.shutdown`` escaped ``stop`` before the local instance's processes
    were killed (orphans); one inside ``end_processes`` (10 s of grace) cut the killing short. The first
    now goes on to the killing; the second is held until the teardown is done, then dropped."""
    if _in_own_process(request):
        return
    import os
    import signal

    import ray

    from ptopt.serve import ray_server

    done: list[str] = []

    def shutdown():
        done.append("ray.shutdown")
        raise KeyboardInterrupt

    def end_processes(pids, grace_s):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C again, during the grace period
            for _ in range(1000):
                pass
            done.append("processes ended")
        except KeyboardInterrupt:
            done.append("killing cut short")

    server = _stopping_server(tmp_path, _serving=False)
    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    monkeypatch.setattr(ray_server, "session_processes", lambda temp_dir: [])
    monkeypatch.setattr(ray_server, "_kill_proxy", lambda pids: done.append("proxy killed"))
    monkeypatch.setattr(ray_server, "end_processes", end_processes)
    try:
        server.stop()
    except KeyboardInterrupt:
        pytest.fail(f"the interrupt escaped stop after {done}")
    assert done == ["proxy killed", "ray.shutdown", "processes ended"], done
    assert not server._started_ray and not server.workdir.exists()
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C interrupts again after the stop


def test_signals_are_held_even_with_other_threads_running(request):
    """Held in the handlers, not the signal mask: a signal blocked in the main thread went to another thread
    of the process (Ray's driver has many) and its KeyboardInterrupt still cut the teardown."""
    if _in_own_process(request):
        return
    import os
    import signal

    from ptopt.serve.ray_server import _signals_held

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        with _signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100_000):
                pass
    except KeyboardInterrupt:
        pytest.fail("a SIGINT during the teardown interrupted it")
    finally:
        stop.set()


def test_a_failed_delete_on_a_cluster_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    """Joining a cluster, ``stop`` deletes the application, then its drain keys, under one suppress: a
    failed delete vanished (the application may still run there; the key stays). It is one line now."""
    import ray
    from ray import serve

    from ptopt.serve import ray_server

    cleared: list[str] = []

    def delete(name):
        raise ConnectionError("the GCS at 10.0.0.1:6379 is unreachable\nretrying...")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(serve, "delete", delete)
    monkeypatch.setattr(ray_server, "_clear_drain", cleared.append)
    _stopping_server(tmp_path, _started_ray=False, _serving=False, address="10.0.0.1:6379").stop()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "could not delete the application 'm'" in lines[0], lines
    assert (
        "ConnectionError: the GCS at 10.0.0.1:6379 is unreachable" in lines[0]
        and "drain key stays" in lines[0]
    )


def test_a_replica_gone_before_the_call_left_is_retried(monkeypatch):
    """Serve's ``ReplicaUnavailableError`` (the replica it chose left the routing table before the call was
    sent: nothing ran) was answered 503; the call goes to another replica now, as when one dies answering."""
    from ray.serve.exceptions import ReplicaUnavailableError

    calls = []

    class Handle:  # its first call finds the replica gone; the next one answers
        def __getattr__(self, method):
            async def call(*args):
                calls.append(method)
                if len(calls) == 1:
                    raise ReplicaUnavailableError("replica-1")
                return ["slow answer"]

            return type("Method", (), {"remote": staticmethod(call)})

    slow = Handle()
    code, answer = asyncio.run(_answer(_ingress(slow), _request()))
    assert code == 200 and answer["text_output"] == "slow answer" and len(calls) == 2, (answer, calls)


def test_packaging_the_artifacts_is_a_named_step(serve_artifacts, monkeypatch):
    """Copying the artifacts into the Ray Serve package is the first long step of ``ptopt serve`` (SmolLM2's
    AOTInductor folder: 139 s); its heartbeats name it, not only "ptopt serve: still working"."""
    from ptopt.core import progress
    from ptopt.serve import ray_package
    from ptopt.serve.ray_server import RayServer

    seen: list[list[str]] = []

    def prepare_model(*args, **kwargs):
        seen.append([s.title for s in progress._current().steps])
        raise KeyboardInterrupt  # stop here: the constructor cleans up and re-raises

    monkeypatch.setattr(ray_package, "prepare_model", prepare_model)
    with progress.reporting(lambda line: None), pytest.raises(KeyboardInterrupt):
        RayServer([str(serve_artifacts["fp32"])])
    assert seen == [["packaging 1 artifact(s) for Ray Serve"]], seen


def test_a_signal_to_the_whole_process_group_stops_without_waiting_for_the_dead_gcs(
    monkeypatch, tmp_path, capsys
):
    """SIGTERM to the process group (``timeout``, systemd's control-group kill, ``kill -- -PGID``) reaches the
    local instance's raylet and GCS with the CLI: the raylet exits, the GCS lingers answering nothing, and the
    drain's first call to it waited 60 s until Ray ended the process (exit 1, "Failed to connect to GCS
    within 60 seconds", the instance's folder left). The stop sees a core process gone (by its name: a
    zombie keeps no command line) and goes on without the drain."""
    import subprocess
    import sys
    import time

    from ptopt.serve import ray_server

    raylet = subprocess.Popen([sys.executable, "-c", "pass"])  # exits, unreaped: a zombie, as the raylet is
    gcs = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _ in range(200):
            if not ray_server.alive(raylet.pid):
                break
            time.sleep(0.05)
        monkeypatch.setattr(ray_server, "_CORE_PROCESSES", (ray_server._comm(gcs.pid),))
        hung = threading.Event()

        def drain(timeout_s=0.0):  # the drain's call to the GCS that never answers
            hung.wait(30)

        server = _stopping_server(tmp_path, _session=[gcs.pid, raylet.pid])
        monkeypatch.setattr(server, "drain", drain, raising=False)
        server._drain_while_gcs_lives()
        assert not hung.is_set()  # it returned while the drain still waited for the GCS
        assert "going down with this process" in capsys.readouterr().err
        assert server._drain_cancel.is_set()
        hung.set()
        # every core process alive: the drain is waited for
        assert not _stopping_server(tmp_path, _session=[gcs.pid])._gcs_lost()
    finally:
        gcs.kill()
        gcs.wait()
        raylet.wait()
