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
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptopt.cli.main", "serve", str(mar)],
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


def test_port_in_use_exits_2(cli, mar):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        code, _, stderr = cli("serve", mar, "--port", port)
    assert code == 2 and f"port {port}" in stderr and "already in use" in stderr


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "nope.mar", "no such file"),
        (lambda p: (p / "x.mar").write_text("not a zip") and p / "x.mar", "not a .mar"),
    ],
    ids=["missing", "not-a-zip"],
)
def test_bad_mar_exits_2(cli, tmp_path, make, message):
    code, _, stderr = cli("serve", make(tmp_path))
    assert code == 2 and message in stderr
