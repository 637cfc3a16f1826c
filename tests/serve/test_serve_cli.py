"""``ptopt serve MAR``: starts, prints the URL and a curl example, stops cleanly on SIGTERM; bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import REPO
from tests.helpers import assert_refused
from tests.serve.conftest import torchserve_missing


@pytest.fixture(scope="module")
def mar(serve_artifacts, tmp_path_factory):
    if torchserve_missing():
        pytest.skip(f"no TorchServe here: {torchserve_missing()}")
    from ptopt.serve.package import package

    return package(serve_artifacts["fp32"], "mar", tmp_path_factory.mktemp("cli-mar") / "digits.mar").path


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (our server's private folder)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(cmd)
    return found


@pytest.mark.torchserve
def test_serve_prints_url_answers_and_stops_on_sigterm(mar, tmp_path):
    """With the serving knobs overriding the archive's config (1 worker, no batching)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    knobs = ["--workers", "2", "--batch-size", "4", "--max-batch-delay", "7", "--queue-size", "300"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptopt.cli.main", "serve", str(mar), *knobs],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("try: curl"):
                break
        text = "".join(lines)
        assert "try: curl" in text, text + proc.stderr.read() if proc.poll() is not None else text
        url = re.search(r"serving digits at (\S+)", text).group(1)
        assert "workers: 2, batch size 4 (max delay 7 ms), queue 300, max request 16 MB" in text
        logs = re.search(r"logs: (\S+)/logs", text).group(1)
        x = [[[0.5] * 8] * 8]
        req = urllib.request.Request(
            url, data=json.dumps({"inputs": x}).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and len(json.loads(r.read())["outputs"]) == 10
        assert _processes_mentioning(logs)  # the server runs from its private folder
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert proc.returncode == 0, err
    assert "stopped." in err
    assert not _processes_mentioning(logs), "TorchServe processes left behind"
    assert not os.path.exists(logs)
    assert not list(tmp_path.iterdir())  # nothing written into the working directory (no logs/)


def test_port_in_use_exits_2(cli, mar, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert_refused(
            cli, "serve", mar, "--port", port, match=(f"port {port}", "already in use"), where=tmp_path
        )


def test_a_port_a_server_just_left_is_free():
    """A server that stopped leaves its closed connections in TIME_WAIT on its port for up to a minute:
    ``ptopt serve --port P`` right after a stop refused P as "already in use" though nothing listened
    (the servers bind with SO_REUSEADDR). A listening port is still in use."""
    from ptopt.serve.server import port_in_use

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert port_in_use(port)
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server closes first: its side of the connection goes to TIME_WAIT
        client.recv(1)
        client.close()
    assert not port_in_use(port)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "nope.mar", "no such file"),
        (lambda p: (p / "x.mar").write_text("not a zip") and p / "x.mar", "not a .mar"),
    ],
    ids=["missing", "not-a-zip"],
)
def test_bad_mar_exits_2(cli, tmp_path, make, message):
    path = make(tmp_path)
    assert_refused(cli, "serve", path, match=message, where=tmp_path)


@pytest.mark.parametrize(
    "options, message",
    [
        (("--workers", "0"), "--workers 0"),
        (("--workers", "many"), "--workers many"),
        (("--batch-size", "0"), "--batch-size 0"),
        (("--batch-size", "65"), "larger than model digits's max batch 64"),
        (("--max-batch-delay", "-1"), "--max-batch-delay -1"),
        (("--queue-size", "0"), "--queue-size 0"),
        (("--max-request-size", "0"), "--max-request-size 0"),
    ],
    ids=["workers-0", "workers-word", "batch-0", "batch-over-model", "delay", "queue", "request-size"],
)
def test_bad_serving_options_exit_2_before_starting(cli, mar, tmp_path, options, message):
    assert_refused(cli, "serve", mar, *options, match=message, where=tmp_path)
