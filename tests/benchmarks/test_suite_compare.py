"""benchmarks/suite_compare.py: per-file ratios of two timings of the same tests, and the whole suite's
estimate on the other machine (made-up junit files: no timing here)."""

from __future__ import annotations

import gzip
import subprocess
import sys

from tests.benchmarks import bench_script
from tests.conftest import REPO


def _junit(path, cases: dict[str, float]) -> str:
    rows = "".join(
        f'<testcase classname="{name.split("::")[0]}" name="{name.split("::")[1]}" time="{t}"/>'
        for name, t in cases.items()
    )
    text = f'<testsuites><testsuite name="pytest">{rows}</testsuite></testsuites>'
    if str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return str(path)


def test_ratios_per_file_and_the_estimate(tmp_path):
    # the list: tests.test_a twice as slow there, tests.test_b the same (its test class dropped from the name)
    other = _junit(
        tmp_path / "x.xml.gz",
        {"tests.test_a::t1": 4.0, "tests.test_b.TestK::t2": 2.0, "tests.test_a::gone": 9.0},
    )
    here = _junit(tmp_path / "h.xml", {"tests.test_a::t1": 2.0, "tests.test_b.TestK::t2": 2.0})
    full = _junit(
        tmp_path / "f.xml", {"tests.test_a::t1": 10.0, "tests.test_b::t3": 10.0, "tests.test_c::t4": 20.0}
    )
    with bench_script("suite_compare") as bench:
        assert bench.ratios(other, here) == {"tests.test_a": 2.0, "tests.test_b": 1.0}
        assert bench.file_times(full) == {"tests.test_a": 10.0, "tests.test_b": 10.0, "tests.test_c": 20.0}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "suite_compare.py"), other, here, full, "--wall", "20"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # tests.test_c (not in the list) at 1.0x: 20 + 10 + 20 = 50 summed there, 40 here: 20 s wall -> 25
    assert "| 1.00x | 50 | 25 |" in done.stdout, done.stdout
    assert "| tests.test_a | 10.0 | 2.00 |" in done.stdout
