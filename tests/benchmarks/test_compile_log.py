"""benchmarks/compile_log.sh: every g++ call of a command, logged with its seconds and test, summed per test."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here")
def test_each_compile_is_logged_and_summed(tmp_path):
    (tmp_path / "a.cpp").write_text("int main() { return 0; }\n")
    command = "g++ -O1 -o a a.cpp && $CXX -O3 -o b a.cpp"  # found on the PATH, and through $CXX
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "compile_log.sh"), str(tmp_path / "log"), "--", "bash", "-c", command],
        cwd=tmp_path, capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin",
        "PYTEST_CURRENT_TEST": "tests/x.py::t (call)"},
    )  # fmt: skip
    rows = [line.split("|") for line in (tmp_path / "log").read_text().splitlines()]
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("-O1", "a", "tests/x.py::t (call)"),
        ("-O3", "b", rows[1][3]),
    ]
    assert all(float(r[0]) > 0 for r in rows) and (tmp_path / "a").is_file() and (tmp_path / "b").is_file()
    assert "g++: 2 calls" in done.stdout and "tests/x.py::t" in done.stdout
