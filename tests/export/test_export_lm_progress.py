"""A causal LM's export says what it is doing: its heartbeats name the step (tracing, the AOTInductor
compile, the check against transformers), not only "ptopt export: still working". The slow parts are
stand-ins that wait and then stop the export (an LM's real AOTInductor compile takes from 20 s to
minutes; docs/export.md has the measured run)."""

from __future__ import annotations

import json
import time

import pytest
import torch

import ptopt
from ptopt.core import progress
from tests.export.lm_models import save

WAIT = 2.0  # each stand-in's time: past the 1 s a step must have run before a heartbeat names it


class Stop(Exception):
    pass


def _slow(result=None):
    def call(*args, **kwargs):
        time.sleep(WAIT)
        if result is None:
            raise Stop("stopped here by the test")
        return result

    return call


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save("llama", tmp_path_factory.mktemp("lm") / "llama")


def _beats(lines: list[str]) -> list[str]:
    return [ln.strip().split(": still working")[0] for ln in lines if "still working" in ln]


def test_aoti_heartbeats_name_tracing_and_compiling(llama, tmp_path, monkeypatch):
    import ptopt.formats.aoti_compile as aoti_compile
    import ptopt.formats.lm_graph as lm_graph

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.3)
    monkeypatch.setattr(aoti_compile, "check_compiler", lambda *a, **k: "g++")
    monkeypatch.setattr(lm_graph, "capture", _slow(result="program"))
    monkeypatch.setattr(aoti_compile, "compile_package", _slow())
    lines: list[str] = []
    with pytest.raises(Stop):
        ptopt.export(f"hf:{llama}", "aoti", tmp_path / "out", progress=lines.append)
    beats = _beats(lines)
    assert "tracing it with torch.export" in beats, lines
    assert "compiling it with AOTInductor (g++)" in beats, lines
    assert not (tmp_path / "out").exists()


def test_the_check_against_transformers_is_named(llama, tmp_path, monkeypatch):
    import ptopt.export.lm_check as lm_check

    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.3)
    monkeypatch.setattr(lm_check, "check_lm", _slow())
    lines: list[str] = []
    with pytest.raises(Stop):
        ptopt.export(f"hf:{llama}", "exported_program", tmp_path / "out", progress=lines.append)
    named = "checking it against transformers (32 greedy tokens, the logits, a padded batch)"
    assert named in _beats(lines), lines


def test_validate_refuses_an_untrusted_aoti_folder_before_measuring(llama, tmp_path, monkeypatch):
    """``ptopt validate hf:DIR DIR.aoti`` without --allow-pickle scored the reference's perplexity (54 s on
    SmolLM2's tokenizer and pydoc text) and only then refused the package. An ExportedProgram folder
    relabelled ``aoti`` stands in for the compiled one."""
    import ptopt.validate.lm as vlm
    from ptopt.core.errors import UnsafePickleError

    out = tmp_path / "llama-aoti"
    ptopt.export(f"hf:{llama}", "exported_program", out, new_tokens=2, progress=False)
    record = json.loads((out / "ptopt_lm.json").read_text())
    (out / "ptopt_lm.json").write_text(json.dumps(record | {"target": "aoti", "format": "aoti_lm"}))

    def measured(*args, **kwargs):
        raise AssertionError("measured before the untrusted package was refused")

    monkeypatch.setattr(vlm, "_evaluate_one", measured)
    ids = torch.randint(3, 200, (128,), generator=torch.Generator().manual_seed(0))
    with pytest.raises(UnsafePickleError, match="AOTInductor package .* --allow-pickle"):
        ptopt.validate(f"hf:{llama}", [out], ids, rounds=1, prompt_tokens=16, new_tokens=3, progress=None)


def test_saving_the_artifact_is_named(tmp_path, monkeypatch):
    """Reading the written files back for the sidecar (sha256 and gzip size) took SmolLM2-135M's
    AOTInductor folder (1.3 GB) over a minute after the check, its heartbeats only "ptopt export"."""
    import ptopt.core.artifact as artifact
    from tests.helpers import tiny_cnn

    real = artifact.scan_file
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.3)
    monkeypatch.setattr(artifact, "scan_file", lambda *a, **k: time.sleep(WAIT) or real(*a, **k))
    lines: list[str] = []
    ptopt.export(
        tiny_cnn(), "exported_program", tmp_path / "m.pt2", input_shapes=["1x1x8x8"], progress=lines.append
    )
    assert "saving m.pt2 (its files, their sha256 and gzip size)" in _beats(lines), lines


def test_aoti_package_holds_one_program(llama, tmp_path, monkeypatch):
    """The package compiled a second, one-token model beside the step (half the compile and the folder
    of SmolLM2-135M): with contiguous inputs the step alone gives the same tokens, logits and padded
    batch (docs/export.md). One capture, one model compiled."""
    import ptopt.formats.aoti_compile as aoti_compile
    import ptopt.formats.lm_graph as lm_graph

    captured, compiled = [], []
    monkeypatch.setattr(aoti_compile, "check_compiler", lambda *a, **k: "g++")
    monkeypatch.setattr(lm_graph, "capture", lambda *a, **k: captured.append(k) or "program")

    def compile_package(program, path, options, compiler, **kwargs):
        compiled.append(kwargs)
        raise Stop("stopped here by the test")

    monkeypatch.setattr(aoti_compile, "compile_package", compile_package)
    with pytest.raises(Stop):
        ptopt.export(f"hf:{llama}", "aoti", tmp_path / "out", progress=False)
    assert captured == [{}] and compiled == [{}], (captured, compiled)
