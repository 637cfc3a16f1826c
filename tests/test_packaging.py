"""The wheel installs one package, ptopt, with the root folders mapped under it."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_only_ptopt(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    wheel = next(tmp_path.glob("ptopt-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ptopt", "ptopt-0.1.0.dist-info"}, tops
    for stage in ("core", "compress", "export", "validate", "serve", "cli", "models", "optimize"):
        # every (sub)package of the tree must ship, e.g. validate/runners
        for init in (REPO / stage).rglob("__init__.py"):
            assert f"ptopt/{init.relative_to(REPO).as_posix()}" in names, f"{init} is not in the wheel"
    entry = zipfile.ZipFile(wheel).read("ptopt-0.1.0.dist-info/entry_points.txt").decode()
    assert "ptopt = ptopt.cli.main:main" in entry
    meta = zipfile.ZipFile(wheel).read("ptopt-0.1.0.dist-info/METADATA").decode()
    assert "Requires-Dist: torch<2.14,>=2.11" in meta


def test_core_imports_no_stage():
    """core is shared by every stage and must not depend on one."""
    import re

    pattern = re.compile(r"^\s*(from|import)\s+ptopt\.(compress|export|validate|serve|cli|optimize)\b", re.M)
    for path in (REPO / "core").glob("*.py"):
        hit = pattern.search(path.read_text())
        assert hit is None, f"{path.name} imports ptopt.{hit.group(2)}"
