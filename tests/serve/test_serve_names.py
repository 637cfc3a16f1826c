"""The model names ``ptopt serve`` serves artifacts under: ``NAME=PATH`` names one, and defaults differ
where the file names do (``bert.int8.pt`` beside ``bert.onnx``: ``bert_int8`` and ``bert``). No server
starts: the names are settled (and bad ones refused) before."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest

from ptopt.core.errors import UsageError
from ptopt.serve.prepare import serve_names
from tests.helpers import assert_refused


def test_default_names_differ_where_the_file_names_do():
    assert serve_names(["bert.int8.pt", "bert.onnx"]) == [
        ("bert_int8", "bert.int8.pt"),
        ("bert", "bert.onnx"),
    ]
    assert serve_names(["bert.int8.pt", "regnet.int8.pt"]) == [
        ("bert", "bert.int8.pt"),
        ("regnet", "regnet.int8.pt"),
    ]  # nothing meets: the short names, as before
    assert serve_names(["q=bert.int8.pt", "bert.onnx"]) == [("q", "bert.int8.pt"), ("bert", "bert.onnx")]
    assert serve_names({"a": "x.pt", "b-2": "x.onnx"}) == [("a", "x.pt"), ("b-2", "x.onnx")]


@pytest.mark.parametrize(
    "items, match",
    [
        (
            ["a/bert.pt", "b/bert.pt"],
            ("same model name 'bert'", "NAME=PATH", "bert_1=a/bert.pt bert_2=b/bert.pt"),
        ),
        (["bert=x.pt", "bert.onnx"], ("same model name 'bert'", "NAME=PATH")),
        (["1x=bert.pt"], "model name '1x': use letters, digits"),
        (["a#b=bert.pt"], "model name 'a#b'"),
    ],
    ids=["same-file-names", "given-meets-default", "digit-first", "hash"],
)
def test_names_that_meet_or_do_not_fit_are_refused_naming_the_fix(items, match):
    assert_refused(serve_names, items, match=match, error=UsageError)


def test_cli_two_files_of_one_name_are_refused_before_anything_starts(cli, tmp_path, serve_artifacts):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        shutil.copy2(serve_artifacts["fp32"], tmp_path / d / "cnn.pt")
        shutil.copy2(f"{serve_artifacts['fp32']}.ptopt.json", tmp_path / d / "cnn.pt.ptopt.json")
    match = ("same model name 'cnn'", "ptopt serve NAME=PATH", "cnn_1=a/cnn.pt cnn_2=b/cnn.pt")
    assert_refused(cli, "serve", "a/cnn.pt", "b/cnn.pt", match=match, where=tmp_path)


def test_ray_server_packages_each_artifact_under_its_name(serve_artifacts):
    pytest.importorskip("ray", reason="ray[serve] (the ray extra) is not installed")
    from ptopt.serve.ray_server import RayServer

    fp32, int8 = str(serve_artifacts["fp32"]), str(serve_artifacts["int8"])  # cnn.pt, cnn.int8.pt
    server = RayServer([int8, fp32])  # packaged here; Ray starts only in start()
    try:
        assert server.models == ["cnn_int8", "cnn"]
    finally:
        server.stop()
    server = RayServer([f"small={int8}", fp32])
    try:
        assert server.models == ["small", "cnn"]
    finally:
        server.stop()


def _mar(path, name):
    """An archive's manifest alone (what the server reads before it starts)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(
            "MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name, "serializedFile": "m.pt"}})
        )
    return path


def test_torchserve_names_an_archive_as_given(tmp_path):
    """Two archives packaged under one name: refused naming NAME=ARCHIVE, served when named."""
    from ptopt.serve.server import TorchServeServer

    a, b = _mar(tmp_path / "a.mar", "m"), _mar(tmp_path / "b.mar", "m")

    assert_refused(TorchServeServer, [a, b], match=("same model name 'm'", "NAME=ARCHIVE"), error=UsageError)
    server = TorchServeServer([str(a), f"other={b}"], workdir=tmp_path / "w")
    assert list(server.models) == ["m", "other"]
