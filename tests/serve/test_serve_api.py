"""``import ptopt`` then the servers as docs/serve.md writes them (``ptopt.serve.ray_server.RayServer``,
``ptopt.serve.server.TorchServeServer``): before, ``ptopt.serve`` was no attribute of ``ptopt`` (and
``ptopt.serve.ray_server`` none of ``ptopt.serve`` until imported by name). Still lazy: neither torch
nor Ray is imported until a server module is used."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

_CHILD = """
import sys
import ptopt
assert "serve" in dir(ptopt)
serve = ptopt.serve
assert "torch" not in sys.modules and "ray" not in sys.modules, "import ptopt / ptopt.serve imported torch or ray"
print(ptopt.serve.ray_server.RayServer.__name__, ptopt.serve.server.TorchServeServer.__name__)
print(ptopt.serve.package.package is ptopt.package)
"""


def test_documented_server_classes_resolve_from_import_ptopt(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["RayServer", "TorchServeServer", "True"], proc.stdout
