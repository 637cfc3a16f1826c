"""Peak memory per model, and the garbage collection before it: one full pass per validate run, then
passes that scan only the objects made since (the older ones frozen), so a process with a big heap does
not pay a full pass (0.3 s and more) per model."""

import gc
import os

import pytest

from ptopt.validate.metrics import older_objects_frozen

LINUX_PEAK = os.access("/proc/self/clear_refs", os.W_OK)


@pytest.fixture(scope="module", autouse=True)
def _thawed(_older_objects_frozen):
    """These tests check ``older_objects_frozen`` where nothing was frozen before it (a CLI process, a
    notebook): tests/conftest.py freezes each file's older objects, so this file thaws them, and freezes
    them again after; it also gives validate back the real function, which the conftest replaced by its
    frozen branch."""
    from ptopt.validate import api, metrics

    gc.unfreeze()
    with pytest.MonkeyPatch.context() as patch:
        for module in (api, metrics):
            patch.setattr(module, "older_objects_frozen", older_objects_frozen)
        yield
    gc.collect()
    gc.freeze()


class _Cycle:
    def __init__(self):
        self.me = self


def test_older_objects_are_frozen_in_the_block_and_thawed_after():
    assert gc.get_freeze_count() == 0
    with older_objects_frozen():
        assert gc.get_freeze_count() > 0
        made = _Cycle()
        del made
        assert gc.collect() >= 1  # garbage made in the block is still collected
    assert gc.get_freeze_count() == 0


def test_someone_elses_freeze_is_left_as_it_is():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        # frozen objects freed by refcount (another thread of the worker) leave the count a few lower:
        # thawing would leave it at 0
        with older_objects_frozen():
            assert before - 100 <= gc.get_freeze_count() <= before
        assert before - 100 <= gc.get_freeze_count() <= before  # not thawed by us
    finally:
        gc.unfreeze()


@pytest.mark.skipif(not LINUX_PEAK, reason="needs /proc/self/clear_refs (Linux)")
def test_peak_memory_sees_what_the_block_allocated():
    """In a process of its own: in a test worker another thread (a server fixture, a runtime's pool) may
    free memory during the block, so the resident set never rises over its start."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from ptopt.validate.metrics import PeakMemory, older_objects_frozen\n"
        "with older_objects_frozen(), PeakMemory() as mem:\n"
        "    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched\n"
        "    del big\n"
        "print(mem.delta_mb, mem.peak_mb)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    delta, peak = map(float, out.split())
    assert delta >= 60 and peak >= delta


def test_validate_scans_the_whole_heap_once_and_thaws(artifacts, monkeypatch):
    """One full collection before the models are probed, then every model's with the older objects
    frozen (the probes' garbage is new, so those collections still free it)."""
    from ptopt.validate.api import validate
    from ptopt.validate.latency import LatencyOptions
    from tests.validate.conftest import FACTORY

    collects = []  # (generation, frozen) per full or generation-2 call
    real_collect = gc.collect

    def collect(generation=2):
        collects.append((generation, gc.get_freeze_count() > 0))
        return real_collect(generation)

    monkeypatch.setattr(gc, "collect", collect)
    quick = LatencyOptions(min_iters=1, min_seconds=0.0, warmup_iters=1, warmup_seconds=0.0, rounds=1)
    res = validate(FACTORY, [artifacts["torchscript"], artifacts["onnx"]], artifacts["data"], latency=quick)
    assert len(res.entries) == 2 and res.reference and gc.get_freeze_count() == 0
    full = [frozen for generation, frozen in collects if generation == 2]
    assert full[0] is False and full[1:] == [True] * 3, collects  # once, then one per model (3)
