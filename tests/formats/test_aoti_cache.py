"""ptopt's AOTInductor compile cache: what its key covers, and a hit, a miss, a failed build and the
size bound, without running the C++ compiler (tests/export/test_aoti.py checks a real second export)."""

from __future__ import annotations

import os

import pytest
import torch

from ptopt.formats import aoti_cache
from tests.helpers import tiny_cnn


def _program(model=None, batch: int = 2):
    model = (model or tiny_cnn()).eval()
    return torch.export.export(model, (torch.randn(batch, 1, 8, 8),))


def _key(ep, configs=None, **kw):
    return aoti_cache.package_key(
        {"model": ep}, configs or {"freezing": True}, "g++", kw.get("device", "cpu")
    )


def test_key_follows_the_program_and_the_build_not_the_example_values(monkeypatch):
    base = _key(_program())
    assert base == _key(_program())  # other random example values, same graph and weights
    assert _key(_program(batch=3)) != base  # another traced shape
    changed = tiny_cnn()
    with torch.no_grad():
        next(changed.parameters())[0].add_(1e-3)
    assert _key(_program(changed)) != base  # one weight moved
    assert _key(_program(), {"freezing": False}) != base  # other Inductor options
    with monkeypatch.context() as m:
        # another value than the run's own (a run capped at AVX2, as a lower CPU, has that one already)
        m.setenv("ONEDNN_MAX_CPU_ISA", "SSE41" if os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2" else "AVX2")
        assert _key(_program()) != base  # a variable that steers the kernels
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert _key(_program()) != base
    finally:
        torch.set_num_threads(threads)


def test_a_program_with_a_non_tensor_constant_is_not_cached():
    ep = _program()
    ep.constants["opaque"] = object()
    assert _key(ep) is None


def _build(key, out, payload=b"package", fail=False):
    with aoti_cache.cached_compile(key, out) as cached:
        if not cached:
            if fail:
                raise RuntimeError("the compiler failed")
            out.write_bytes(payload)
    return cached


def test_miss_stores_hit_copies_failure_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path / "cache"))
    assert _build("k1", tmp_path / "a.pt2") == {}
    hit = _build("k1", tmp_path / "b.pt2", payload=b"never built")
    assert hit["hit"] and hit["built"] and (tmp_path / "b.pt2").read_bytes() == b"package"
    with pytest.raises(RuntimeError):
        _build("k2", tmp_path / "c.pt2", fail=True)
    assert not (tmp_path / "cache" / "aoti" / "k2.pt2").exists()
    assert _build(None, tmp_path / "d.pt2") == {}  # no key: compiled, not stored
    monkeypatch.setenv("PTOPT_AOTI_CACHE", "0")
    assert aoti_cache.cache_folder() is None and _build("k1", tmp_path / "e.pt2", payload=b"new") == {}
    assert (tmp_path / "e.pt2").read_bytes() == b"new"


def test_least_recently_used_packages_go_past_the_size_bound(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PTOPT_AOTI_CACHE_MB", str(2.5 / 1024))  # 2.5 KiB: two 1 KiB packages fit
    for i, key in enumerate(("old", "used", "new")):
        _build(key, tmp_path / f"{key}.pt2", payload=b"x" * 1024)
        os.utime(tmp_path / "aoti" / f"{key}.pt2", (1000 + i, 1000 + i))
        if key == "used":
            os.utime(tmp_path / "aoti" / "old.pt2", (999, 999))
    _build("used", tmp_path / "again.pt2")  # a hit makes "used" the most recent
    _build("newest", tmp_path / "newest.pt2", payload=b"x" * 1024)
    left = sorted(p.stem for p in (tmp_path / "aoti").glob("*.pt2"))
    assert left == ["newest", "used"]
