import json

import pytest

from ptopt.core.artifact import Artifact, atomic_path, parent_record, sidecar_path, staged_dir
from ptopt.core.errors import ModelLoadError
from ptopt.core.inputspec import InputSpec
from tests.helpers import assert_refused


def test_sidecar_roundtrip(tmp_path):
    parent = tmp_path / "parent.pt"
    parent.write_bytes(b"parent-bytes")
    f = tmp_path / "model.onnx"
    f.write_bytes(b"x" * 100)
    (tmp_path / "model.onnx.data").write_bytes(b"y" * 50)
    spec = InputSpec("input", (1, 3), (8, 3), (64, 3))
    art = Artifact(
        f,
        "onnx",
        inputs=[spec],
        config={"type": "onnx", "opset": 20},
        parent=parent_record(parent),
        files=["model.onnx", "model.onnx.data"],
    ).finalize()
    assert art.size_bytes == 150 and len(art.sha256) == 64
    data = json.loads(sidecar_path(f).read_text())
    assert data["format"] == "onnx" and data["files"] == ["model.onnx", "model.onnx.data"]
    import hashlib

    assert data["parent"]["sha256"] == hashlib.sha256(b"parent-bytes").hexdigest()
    assert len(data["parent"]["sha256"]) == 64 and data["versions"]["torch"]
    assert data["created"] and data["extra"]["gzip_bytes"] > 0
    loaded = Artifact.load(f)
    assert loaded.inputs == [spec] and loaded.config == {"type": "onnx", "opset": 20}
    assert loaded.file_paths == [f, tmp_path / "model.onnx.data"]


def test_load_without_sidecar(tmp_path):
    f = tmp_path / "m.pt"
    f.write_bytes(b"")
    assert_refused(Artifact.load, f, match="no sidecar", where=tmp_path, error=ModelLoadError)
    assert Artifact.maybe_load(f) is None


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("crash while writing")
    assert list(tmp_path.iterdir()) == []
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"whole")
    assert target.read_bytes() == b"whole" and [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_staged_dir_moves_all_or_nothing(tmp_path):
    with pytest.raises(ValueError):
        with staged_dir(tmp_path) as d:
            (d / "a.onnx").write_text("a")
            raise ValueError
    assert list(tmp_path.iterdir()) == []
    with staged_dir(tmp_path) as d:
        (d / "a.onnx").write_text("a")
        (d / "a.onnx.data").write_text("b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.onnx", "a.onnx.data"]
