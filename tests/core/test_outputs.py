"""An output never overwrites an input (or another output): refused with exit 2, nothing written."""

import os

import pytest

from ptopt.core.artifact import Artifact, sidecar_path
from ptopt.core.errors import UsageError
from ptopt.core.outputs import check_outputs, companions
from ptopt.core.result import Result
from tests.helpers import assert_refused


def _snapshot(folder):
    """Every file under ``folder`` with its bytes (a refusal must change none of them)."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def model(tmp_path):
    """in/m.onnx with its external data and sidecar (written by ptopt), plus links to it."""
    d = tmp_path / "in"
    d.mkdir()
    m = d / "m.onnx"
    m.write_bytes(b"graph")
    (d / "m.onnx.data").write_bytes(b"weights")
    Artifact(m, "onnx", files=["m.onnx", "m.onnx.data"]).finalize()
    (tmp_path / "link.onnx").symlink_to(m)
    os.link(m, tmp_path / "hard.onnx")
    (tmp_path / "dirlink").symlink_to(d, target_is_directory=True)
    return m


# (inputs, outputs, expected words), paths relative to tmp_path
REFUSED = [
    (["in/m.onnx"], ["in/m.onnx"], ("output", "would overwrite input", "m.onnx")),
    (["in/m.onnx"], ["in/../in/./m.onnx"], ("would overwrite input",)),
    (["in/m.onnx"], ["link.onnx"], ("would overwrite input",)),
    (["link.onnx"], ["in/m.onnx"], ("would overwrite input",)),
    (["in/m.onnx"], ["hard.onnx"], ("would overwrite input",)),
    (["in/m.onnx"], ["dirlink/m.onnx"], ("would overwrite input",)),
    (["in/m.onnx"], ["in/m.onnx.ptopt.json"], ("would overwrite the sidecar of input",)),
    (["in/m.onnx"], ["in/m.onnx.data"], ("would overwrite the external data of input",)),
    (["in/m.onnx.data"], ["in/m.onnx"], ("its external data", "would overwrite input")),
    ([], ["out.pt", "out.pt"], ("output out.pt would overwrite output out.pt",)),
    ([], ["out.pt", "out.pt.ptopt.json"], ("would overwrite the sidecar of output out.pt",)),
    (
        [],
        [("-o", "r.yaml"), ("--save-recipe", "r.yaml")],
        ("--save-recipe r.yaml would overwrite -o r.yaml",),
    ),
    ([("MODEL", "in/m.onnx")], {"--json": "link.onnx"}, ("--json link.onnx would overwrite MODEL",)),
    (["zoo:tiny", None, "in/m.onnx"], [None, "in/m.onnx"], ("would overwrite input",)),
]


@pytest.mark.parametrize(
    "inputs, outputs, words",
    REFUSED,
    ids=[
        "same-path",
        "same-path-dotted",
        "output-is-symlink-to-input",
        "input-is-symlink-to-output",
        "hard-link",
        "folder-symlink",
        "onto-input-sidecar",
        "onto-input-external-data",
        "output-data-is-input",
        "two-outputs-same-file",
        "output-onto-other-output-sidecar",
        "save-recipe-equals-o",
        "report-onto-model-through-link",
        "non-file-inputs-skipped",
    ],
)
def test_check_outputs_refuses(tmp_path, model, monkeypatch, inputs, outputs, words):
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    assert_refused(check_outputs, inputs, outputs, match=words, where=tmp_path, error=UsageError)
    assert _snapshot(tmp_path) == before


def test_check_outputs_accepts_distinct_paths(tmp_path, model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_outputs(["in/m.onnx", "zoo:tiny", "builtin:digits"], ["out/m.onnx", "m.onnx", "r.yaml", "r.json"])
    check_outputs(None, {"-o": "a.pt", "--json": None})
    assert [r for r, _ in companions("x.pt")] == ["", "sidecar", "external data"]


def _result(inputs_paths, payload=b"new"):
    def writer(path):
        path.write_bytes(payload)
        return {"extra": {"payload": payload.decode()}}

    return Result(object(), Artifact(path=None, format="onnx"), writer, inputs_paths=inputs_paths)


@pytest.mark.parametrize(
    "output",
    ["in/m.onnx", "link.onnx", "hard.onnx", "in/m.onnx.ptopt.json", "in/m.onnx.data"],
    ids=["same", "symlink", "hard-link", "input-sidecar", "input-external-data"],
)
def test_result_save_never_writes_over_its_input(tmp_path, model, monkeypatch, output):
    """``-o`` equal to the input destroyed it (and recorded its own hash as its parent's)."""
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    res = _result((model,))
    assert_refused(res.save, output, match="would overwrite", where=tmp_path, error=UsageError)
    assert _snapshot(tmp_path) == before and Artifact.sidecar_status(model)
    art = res.save("out/m.onnx")  # another name is fine
    assert art.extra["payload"] == "new" and Artifact.load(tmp_path / "out" / "m.onnx").sha256 == art.sha256


def test_export_cli_refuses_output_equal_to_input(tmp_path, cli):
    """Through ``ptopt export`` (it saves through Result.save): ``-o`` = the input, directly or via a
    symlink, is refused with exit 2 and the input and its sidecar are untouched."""
    code, out, err = cli("export", "tests.helpers:tiny_cnn", "--target", "torchscript", "-o", "m.pt")
    assert code == 0, err
    (tmp_path / "link.pt").symlink_to(tmp_path / "m.pt")
    before = _snapshot(tmp_path)
    for target in ("m.pt", "link.pt", "m.pt.ptopt.json"):
        args = ("export", "m.pt", "--target", "torchscript", "-o", target)
        assert_refused(cli, *args, match="would overwrite", where=tmp_path)
        assert _snapshot(tmp_path) == before
    assert Artifact.sidecar_status(tmp_path / "m.pt") and sidecar_path(tmp_path / "m.pt").is_file()
