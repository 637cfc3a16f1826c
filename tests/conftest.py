"""Shared fixtures. Every file a test writes goes under tmp_path; trained zoo models are cached in
one session folder (or $PTOPT_CACHE_DIR when set, so a developer's cache is reused)."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the files that take longest, longest first (summed ``--durations=0`` of the whole suite on 2 cores,
#: 2026-11-27, a cold Inductor cache, seconds in the comments). pytest-xdist (``--dist loadfile``) hands
#: files out in this order, so the long ones start early and the run ends on short files: a long file that
#: starts last leaves the other worker idle until it ends.
LONGEST_FIRST = (
    # the README's tour as a user types it (quantize, two exports, validate, optimize, package): 982 s and
    # 1164 s on the 2 cores with a load average of 10 (2026-11-28, other suites running); not measured quiet
    "tests/test_readme.py",
    # a real local Ray instance, shared by the file's tests (250 s on 2 cores shared with other jobs,
    # 2026-11-28; most of it waiting on Ray's processes to start: best overlapped with other files)
    "tests/serve/test_ray_serve.py",
    # the compatibility matrix in three files (one row whole in each), ~100-125 s each in a full run
    # on 2 cores (2026-11-28; 326 s as one file, which left one worker on it alone to the end)
    "tests/compat/test_matrix.py",
    "tests/compat/test_matrix_transformers.py",
    "tests/compat/test_matrix_mobile.py",
    "tests/optimize/test_optimize.py",  # 87
    # 78 + 63 quiet as two files (2026-11-28 profile); merged with test_aoti_static.py on one package:
    # 145 CPU-s for the merged file vs 191 for the two, at load 12-19
    "tests/export/test_aoti.py",
    "tests/demo/test_demo.py",  # 75 (106 before its --rounds 3)
    # 110 at load average 8 (one torchrun launch of 2 processes running 6 distillations; each process
    # importing torch and transformers is ~25 of it)
    "tests/compress/test_distill_processes.py",
    "tests/compress/test_pt2e_hf.py",  # 52
    "tests/serve/test_ray_package.py",  # 45 (the serve fixtures' first use: a CNN's formats, an LM)
    "tests/export/test_export_lm.py",  # 115-233 under a load of 6-12 on 2 cores (four LM exports)
    "tests/compress/test_pt2e.py",  # 42
    "tests/formats/test_openvino.py",  # 35
    "tests/compress/test_autoquant_engines.py",  # 26
    "tests/compress/test_auto_int8.py",  # 55 at load average ~12 (fx and PT2E whole models, a search)
    "tests/compress/test_int8_arch_fixes.py",  # 24-45 at load average ~12 (two PT2E quantizations)
    "tests/validate/test_validate_cli.py",  # 26
    "tests/serve/test_serve_pt2.py",  # 23
    "tests/serve/test_torchserve.py",  # 22
    "tests/validate/test_run_recipe.py",  # 22
    "tests/validate/test_validate_api.py",  # 20
    "tests/compress/test_autoquant.py",  # 20
    "tests/validate/test_validate_lm.py",  # 18
    "tests/compress/test_pt2e_program.py",  # 18
    "tests/compress/test_distill_lm.py",  # 15
    "tests/validate/test_validate_trust.py",  # 15
    "tests/compress/test_messages.py",  # 14
    "tests/compat/test_prune_families.py",  # 38 at load average 5 (118 at 10)
    "tests/validate/test_validate_compile.py",  # 14
)


@pytest.fixture(scope="session", autouse=True)
def _zoo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Zoo weights: $PTOPT_CACHE_DIR if the caller set one, else a folder for this session."""
    if os.environ.get("PTOPT_CACHE_DIR"):
        return Path(os.environ["PTOPT_CACHE_DIR"])
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # parallel workers share one cache (the zoo trains each model once, under a file lock)
        path = tmp_path_factory.getbasetemp().parent / "ptopt-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("ptopt-cache")
    os.environ["PTOPT_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _worker_threads():
    import torch

    from tests.helpers import worker_threads

    if worker_threads() is not None:
        torch.set_num_threads(worker_threads())
        # the processes a test starts (the CLI as a user runs it, the README's tour, a package loaded in a
        # child) get the worker's share too: at torch's default (every core) beside the other worker,
        # OpenMP threads spin waiting for a descheduled sibling. The README's tour alone: 60 -> 31 CPU-s
        # at 1 thread (2026-11-29, 2 cores). It also keeps an AOTInductor package built in a child the
        # compile-cache twin of one built here (the cache key holds the threads and OMP_NUM_THREADS).
        os.environ.setdefault("OMP_NUM_THREADS", str(worker_threads()))
        # Inductor compiles in this process, not in a pool of compile workers (each a fresh interpreter
        # importing torch) started by every process that compiles: the other worker has the other core.
        # tests/validate/test_validate_compile.py: 93 -> 48 s wall, 28.8 -> 26.8 CPU-s (load ~5)
        if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
            os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
            import torch._inductor.config as inductor_config

            inductor_config.compile_threads = 1  # read from the environment when first imported


@pytest.fixture(scope="module", autouse=True)
def _older_objects_frozen():
    """Each test file starts with the worker's older objects frozen (``gc.freeze``): its garbage
    collections, validate's among them, scan only what was made since the file started: validate's own
    ``older_objects_frozen`` (one full collection per validate run, then the heap frozen) takes its branch
    for a heap frozen before (nothing frozen or thawed), as in any process that froze its heap. A test
    worker's heap grows with every file; a full pass per validate run was 104 of the suite's 814 sampled
    CPU-s (py-spy, 2026-11-29: ~90 in the workers, the rest in the CLI processes tests start). The
    collection here scans only the previous file's survivors; objects frozen that die later in a cycle
    stay until the worker exits.

    validate's check of the freeze (``gc.get_freeze_count``) walks every frozen object: 0.09 s per 6
    million, 17 of the suite's sampled CPU-s (py-spy, 2026-11-29). Here the answer is known (frozen just
    above), so validate is handed that branch directly, without the walk.
    Both branches of the real function are tested in ``tests/validate/test_peak_memory.py``, which puts it
    back (and thaws the heap) for its own tests; the CLI processes tests start run it as a user's do."""
    from ptopt.validate import api, metrics

    gc.collect()
    gc.freeze()
    with pytest.MonkeyPatch.context() as patch:
        for module in (api, metrics):
            patch.setattr(module, "older_objects_frozen", _frozen_already)
        yield


@contextlib.contextmanager
def _frozen_already():
    """``validate.metrics.older_objects_frozen`` where the heap is frozen already: nothing to do."""
    yield


@pytest.fixture(autouse=True)
def _seed_and_threads(_worker_threads):
    import torch

    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _short_search_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The accuracy-aware searches' timing (autoquant's tuner: fp32 for 1.0 s, each candidate 0.3 s
    interleaved with it), shortened to 0.2 and 0.1 s: the tests check which candidates are tried, measured
    and recorded, never how fast one is (none compares a latency to a figure; a choice between two that
    both hold accepts either). Every candidate is still timed, its min_iters interleaved with fp32.
    Under cProfile the tuner's timing was 18.9 s of test_autoquant.py's 50 and 13.5 of test_optimize.py's 54."""
    from ptopt.compress.quantize import autoquant_tuner

    monkeypatch.setattr(autoquant_tuner, "FP32_TIMING_SECONDS", 0.2)
    monkeypatch.setattr(autoquant_tuner, "CANDIDATE_TIMING_SECONDS", 0.1)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run ``ptopt ...`` in-process through ``ptopt.cli.main.main``; returns (exit_code, stdout, stderr)."""
    from click.testing import CliRunner

    from ptopt.cli.main import main

    monkeypatch.chdir(tmp_path)

    def run(*args: str):
        runner = CliRunner()
        result = runner.invoke(_entry(main), [str(a) for a in args], catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    run.is_cli = True  # tests.helpers.assert_refused reads (code, out, err) from it
    return run


def _entry(main):
    import click

    @click.command(
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}
    )
    @click.pass_context
    def entry(ctx: click.Context) -> None:
        main(list(ctx.args))

    return entry


@pytest.fixture
def run_ptopt(tmp_path: Path):
    """Run the installed ``ptopt`` console script in a subprocess (what a user runs)."""

    def run(*args: str, timeout: float = 600, cwd: Path | None = None):
        exe = [sys.executable, "-m", "ptopt.cli.main"]
        # the repo root on the path makes the test factories (tests.helpers:NAME) importable
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        return subprocess.run(
            exe + [str(a) for a in args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or tmp_path,
            env=env,
        )

    run.is_subprocess = True
    return run


@pytest.fixture(scope="session")
def digits_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small labelled .pt data file of digits at 32×32 (200 test samples)."""
    from ptopt.core.data import load_data

    path = tmp_path_factory.mktemp("data") / "digits32_test200.pt"
    load_data("builtin:digits32:test").take(200).save(path)
    return path


@pytest.fixture(scope="session")
def tiny_cnn_factory() -> str:
    """``pkg.module:factory`` of a tiny untrained CNN for fast tests (1×8×8 digits)."""
    return "tests.helpers:tiny_cnn"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist would order files by test count
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """LONGEST_FIRST first; the sort is stable, so every other file keeps the order it was collected in."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
