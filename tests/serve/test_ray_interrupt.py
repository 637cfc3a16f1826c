"""Ctrl-C while ``ptopt serve --engine ray`` is still starting its local Ray instance: the CLI stops
cleanly and leaves no process of that instance behind. The interrupt is made to land inside
``ray.init`` while it waits for its raylet to register (its node's processes, the raylet's agents
included, are up; Ray has no node object to shut down yet), where a real Ctrl-C a few seconds after
the command started lands; the child runs the real CLI. The agents outlived the raylet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ptopt.core.features import check_ray
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(
    not check_ray().available, reason=f"no Ray Serve here: {check_ray().detail} (pip install 'ptopt[ray]')"
)

_CHILD = """
import json, os, sys, time
import ray._private.services as services
from ptopt.serve.ray_server import _children, _cmdline

PIDS = sys.argv[1]

def descendants():
    children, todo, found = _children(), [os.getpid()], set()
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return sorted(found)

def get_node(*args, **kwargs):  # ray.init waits for its raylet to register: Ctrl-C lands here
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(_cmdline(p).startswith("ray::") for p in descendants()):
        time.sleep(0.2)  # until the raylet has started its agents
    with open(PIDS, "w") as fh:
        json.dump(descendants(), fh)
    raise KeyboardInterrupt

services.get_node = get_node
from ptopt.cli.main import main
sys.argv = ["ptopt", "serve", sys.argv[2], "--engine", "ray"]
main()
"""


def _serve_child(code: str, record: object, artifact: object, cwd: object) -> subprocess.CompletedProcess:
    """``code`` (the real CLI with one thing patched) in a child: ``record``, the file it writes what it saw
    to, and ``artifact``, what it serves, are its arguments."""
    return subprocess.run(
        [sys.executable, "-c", code, str(record), str(artifact)],
        cwd=cwd, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_ctrl_c_inside_ray_init_leaves_no_ray_process(serve_artifacts, tmp_path):
    from ptopt.serve.ray_server import _cmdline, alive

    pids_file = tmp_path / "pids.json"
    proc = _serve_child(_CHILD, pids_file, serve_artifacts["fp32"], tmp_path)
    assert "stopping Ray Serve" in proc.stderr and "stopped." in proc.stderr, proc.stderr
    started = json.loads(pids_file.read_text())
    assert started, "ray.init started no process"
    deadline = time.monotonic() + 5  # end_processes waited for them; a moment for the kernel to reap
    while time.monotonic() < deadline and [p for p in started if alive(p)]:
        time.sleep(0.2)
    left = {p: _cmdline(p) for p in started if alive(p)}
    for p in left:  # never leave them to the next test
        os.kill(p, 9)
    assert not left, f"Ray processes left behind after Ctrl-C during startup: {left}"


_PACKAGING = """
import os, signal, sys, time
from ptopt.serve import ray_server

WHERE, ARTIFACT = sys.argv[1], sys.argv[2]

def packaging(self, *args, **kwargs):  # a SIGTERM while the artifacts are copied for the server
    with open(WHERE, "w") as fh:
        fh.write(str(self.workdir))
    (self.workdir / "package").mkdir()
    (self.workdir / "package" / "model.bin").write_bytes(bytes(1024))
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)

ray_server.RayServer._package = packaging
from ptopt.cli.main import main
sys.argv = ["ptopt", "serve", ARTIFACT, "--engine", "ray"]
main()
"""


def test_sigterm_while_packaging_removes_the_copy(serve_artifacts, tmp_path):
    """SIGTERM while ``ptopt serve`` still copies the artifacts for Ray (SmolLM2-135M's AOTInductor folder:
    over two minutes) ended the process where it stood and left the copy (630 MB under /tmp); it is an
    interrupt from the command's start now: the copy is removed, exit 130."""
    from pathlib import Path

    where = tmp_path / "workdir.txt"
    proc = _serve_child(_PACKAGING, where, serve_artifacts["fp32"], tmp_path)
    workdir = Path(where.read_text())
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert not workdir.exists(), f"left behind: {sorted(p.name for p in workdir.rglob('*'))}"


_SECOND_SIGTERM = """
import os, signal, sys, threading, time
import ray
from ptopt.serve import ray_server

RECORD, ARTIFACT = sys.argv[1], sys.argv[2]
real_shutdown, real_ready = ray.shutdown, ray_server.RayServer.wait_ready

def shutdown(*args, **kwargs):  # a second SIGTERM right after Ray's own shutdown, as the stop goes on
    real_shutdown(*args, **kwargs)
    with open(RECORD, "w") as fh:
        fh.write("shut down")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(2)

def wait_ready(self, *args, **kwargs):  # the first once serving
    out = real_ready(self, *args, **kwargs)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    return out

ray.shutdown, ray_server.RayServer.wait_ready = shutdown, wait_ready
from ptopt.cli.main import main
sys.argv = ["ptopt", "serve", ARTIFACT, "--engine", "ray"]
main()
"""


def test_a_second_sigterm_after_rays_shutdown_still_stops_cleanly(serve_artifacts, tmp_path):
    """Ray's driver set SIGTERM back to the default action inside ``ray.shutdown`` (its C++ failure handler,
    installed by ``ray.init``, uninstalled): a second SIGTERM there (``timeout`` and a supervisor both
    sending one) killed the CLI mid-teardown, exit 143, or left it waiting 60 s for the killed GCS. The
    driver keeps ptopt's handlers now: the stop ends as a stop does."""
    record = tmp_path / "record.txt"
    proc = _serve_child(_SECOND_SIGTERM, record, serve_artifacts["fp32"], tmp_path)
    assert record.read_text() == "shut down", proc.stderr[-2000:]
    assert proc.returncode == 0 and "stopped." in proc.stderr, (proc.returncode, proc.stderr[-2000:])
