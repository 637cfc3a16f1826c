"""benchmarks/bench_gpu.py on a machine without CUDA: the one-line refusal, the reason a failed export is
given (a Python error, or a crash that faulthandler reported), and ``--render`` writing the tables of a
results JSON again with the header of the machine that produced them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.benchmarks import bench_script
from tests.conftest import REPO

CRASH = """Fatal Python error: Segmentation fault

Thread 0x00007f (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 359 in wait

Current thread 0x00007e (most recent call first):
  File "/site-packages/torch/export/pt2_archive/_package.py", line 1045 in _load_aoti
  File "/site-packages/torch/_inductor/__init__.py", line 267 in aoti_load_package

Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)
"""


@pytest.fixture(scope="module")
def bench():
    with bench_script("bench_gpu") as module:
        yield module


def test_failure_reason_names_the_crash_or_the_error(bench):
    reason = bench.failure_reason(CRASH, -11)
    assert reason.startswith("Fatal Python error: Segmentation fault at File")
    assert "_package.py" in reason and "_load_aoti" in reason
    # only faulthandler's last line kept (what an earlier version stored): still named a crash
    assert bench.failure_reason(CRASH.strip().splitlines()[-1], None) == "crashed (faulthandler report)"
    assert bench.failure_reason("Traceback ...\nValueError: bad shape\n", 1) == "ValueError: bad shape"
    assert bench.failure_reason("", -11) == "exit -11"


def test_render_keeps_the_producing_machine(bench, tmp_path, monkeypatch):
    import common  # benchmarks/common.py, on the path bench_gpu puts it

    monkeypatch.setattr(common, "RESULTS", tmp_path / "out")
    machine = (
        "Machine: Intel(R) Xeon(R) Processor (x86_64, 16 usable cores; ISA: avx512f, amx_int8); threads: 2."
    )
    row = {"model": "zoo ResNet", "runtime": "fp32 eager", "batch": 1, "p50_ms": 1.1, "spread_pct": 3.0,
           "speedup": 1.0, "max_abs_diff": None, "rel_error": None, "cosine": None}  # fmt: skip
    data = {
        "facts": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "cuda": "13.0", "torch": "2.11.0+cu130"},
        "rows": [row],
        "missing": {"package resnet.pt2": CRASH.strip().splitlines()[-1]},
        "validate_vs_bare": {"skipped": "the fp16 ResNet package was not built"},
        "machine": machine,
    }
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    bench.main(["--render", str(path)])
    md = (tmp_path / "out" / "gpu.md").read_text()
    assert machine in md and "NVIDIA H100 80GB HBM3" in md and "| zoo ResNet | fp32 eager | 1 | 1.100 |" in md
    assert "- not measured: package resnet.pt2: crashed (faulthandler report)" in md
    assert "against a bare CUDA-event loop: the fp16 ResNet package was not built" in md


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_without_cuda_it_says_so_in_one_line():
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_gpu.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert (
        run.stderr.strip().splitlines() == [run.stderr.strip()]
        and "bench_gpu: needs a CUDA GPU" in run.stderr
    )


def test_versus_target_picks_ptopts_fastest_and_fastest_packageable(bench):
    """At each batch: ptopt's fastest kept artifact (any runtime) and its fastest packageable one, each over
    torch.compile of the fp16 model; baselines never count as ptopt's."""

    def row(runtime, ms, ours=True):
        return {"model": "m", "batch": 1, "runtime": runtime, "p50_ms": ms, "ptopt": ours}

    rows = [
        row("fp16 torch.compile", 2.0, False), row("fp16 eager", 0.5, False),
        row("fp16-compiled-graphs", 1.0), row("fp16-torchscript", 4.0), row("fp16-aoti", 1.6),
    ]  # fmt: skip
    (v,) = bench.versus_target(rows, "fp16", {"fp16-torchscript", "fp16-aoti"})
    assert v["best"] == {"name": "fp16-compiled-graphs", "p50_ms": 1.0, "vs_target": 2.0}
    assert v["best_packageable"]["name"] == "fp16-aoti" and v["best_packageable"]["vs_target"] == 1.25
