"""``ptopt package --format mar`` (no server needed): archive contents, sidecar, and bad input."""

from __future__ import annotations

import importlib.util
import json
import shutil
import zipfile

import pytest
import yaml

from ptopt.core.artifact import Artifact
from tests.serve.conftest import torchserve_missing

needs_archiver = pytest.mark.skipif(
    importlib.util.find_spec("model_archiver") is None or torchserve_missing() is not None,
    reason="torch-model-archiver / torchserve not installed",
)


def _mar_contents(path):
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("MAR-INF/MANIFEST.json"))
        cfg = yaml.safe_load(z.read("model-config.yaml"))
    return names, manifest, cfg


@needs_archiver
def test_cli_packages_torchscript_with_its_sidecar(cli, tmp_path, serve_artifacts):
    out = tmp_path / "m.mar"
    code, stdout, stderr = cli(
        "package",
        serve_artifacts["fp32"],
        "--format",
        "mar",
        "-o",
        out,
        "--batch-size",
        "8",
        "--max-batch-delay",
        "10",
        "--workers",
        "2",
        "--threads",
        "1",
    )
    assert code == 0, stderr
    assert "served as 'm'" in stdout and "ptopt serve" in stdout
    names, manifest, cfg = _mar_contents(out)
    assert {"cnn.pt", "cnn.pt.ptopt.json", "ptopt_handler.py", "model-config.yaml"} <= names
    assert manifest["model"]["modelName"] == "m" and manifest["model"]["serializedFile"] == "cnn.pt"
    assert cfg == {
        "minWorkers": 2,
        "maxWorkers": 2,
        "batchSize": 8,
        "maxBatchDelay": 10,
        "responseTimeout": 120,
        "handler": {"threads": 1},
    }
    art = Artifact.load(out)
    assert art.format == "mar" and art.inputs == Artifact.load(serve_artifacts["fp32"]).inputs
    assert art.parent["path"] == str(serve_artifacts["fp32"]) and art.parent["sha256"]
    assert art.config["batch_size"] == 8 and art.extra["model_format"] == "torchscript"


@needs_archiver
def test_python_twin_packages_int8_and_onnx(tmp_path, serve_artifacts):
    import ptopt
    from ptopt.serve.package import package

    art = package(serve_artifacts["int8"], "mar", tmp_path / "q.mar")
    assert art.precision == "int8" and art.path.is_file()
    art = ptopt.package(serve_artifacts["onnx"], "mar", tmp_path / "o.mar")
    names, manifest, _ = _mar_contents(art.path)
    assert manifest["model"]["serializedFile"] == "cnn.onnx"
    data = serve_artifacts["onnx"].name + ".data"
    if (serve_artifacts["onnx"].parent / data).exists():
        assert data in names  # external weights travel with the graph


@needs_archiver
def test_no_sidecar_needs_input_shape(cli, tmp_path, serve_artifacts):
    bare = tmp_path / "bare.pt"
    shutil.copy2(serve_artifacts["fp32"], bare)
    out = tmp_path / "bare.mar"
    code, _, stderr = cli("package", bare, "--format", "mar", "-o", out)
    assert code == 2 and "--input-shape" in stderr and "no sidecar" in stderr
    assert not out.exists() and not list(tmp_path.glob("*.mar*"))
    code, stdout, stderr = cli("package", bare, "--format", "mar", "-o", out, "--input-shape", "1x1x8x8")
    assert code == 0, stderr
    assert "input: [1..64]x1x8x8 float32" in stdout
    assert Artifact.load(out).inputs[0].max_shape == (64, 1, 8, 8)
    from ptopt.serve.package import package  # the twin takes the CLI's spelling too (recipes replay it)

    art = package(bare, "mar", tmp_path / "bare2.mar", input_shapes=["2x1x8x8"])
    assert art.inputs[0].opt_shape == (2, 1, 8, 8)


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.pt", "--format", "mar", "-o", "x.mar"], "no such file"),
        (["{fp32}", "--format", "zip", "-o", "x.mar"], "'zip' is not one of"),
        (["{fp32}", "--format", "mar", "-o", "x.zip"], "must end in .mar"),
        (["{fp32}", "--format", "mar", "-o", "x.mar", "--batch-size", "0"], "--batch-size must be >= 1"),
        (
            ["{fp32}", "--format", "mar", "-o", "x.mar", "--batch-size", "100"],
            "larger than the model's max batch",
        ),
        (["{fp32}", "--format", "mar", "-o", "x.mar", "--model-name", "9 bad"], "model name"),
    ],
    ids=["missing", "unknown-format", "not-mar", "batch-0", "batch-too-big", "bad-name"],
)
def test_bad_input_exits_2_and_writes_nothing(cli, tmp_path, serve_artifacts, args, message):
    args = [a.format(fp32=serve_artifacts["fp32"]) for a in args]
    code, _, stderr = cli("package", *args)
    assert code == 2
    assert message in stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("x.")]


def test_python_twin_unknown_format_is_a_usage_error(tmp_path, serve_artifacts):
    from ptopt.core.errors import UsageError
    from ptopt.serve.package import package

    with pytest.raises(UsageError, match="unknown --format 'zip'"):
        package(serve_artifacts["fp32"], "zip", tmp_path / "x.mar")
    assert not list(tmp_path.iterdir())


@needs_archiver
def test_package_straight_from_a_model_reference(cli, tmp_path):
    """A MODEL that is not TorchScript/ONNX is exported to TorchScript first (ptopt.export)."""
    if importlib.util.find_spec("ptopt.export.api") is None:
        pytest.skip("ptopt.export.api (the export stage) is not in this tree yet")
    out = tmp_path / "f.mar"
    code, stdout, stderr = cli("package", "tests.helpers:tiny_cnn", "--format", "mar", "-o", out)
    assert code == 0, stderr
    names, manifest, _ = _mar_contents(out)
    assert manifest["model"]["serializedFile"].endswith(".pt")
    assert manifest["model"]["serializedFile"] + ".ptopt.json" in names
    assert Artifact.load(out).inputs[0].opt_shape[1:] == (1, 8, 8)


@needs_archiver
def test_save_recipe(cli, tmp_path, serve_artifacts):
    from ptopt.core.recipe import load_recipe

    code, _, stderr = cli(
        "package",
        serve_artifacts["fp32"],
        "--format",
        "mar",
        "-o",
        tmp_path / "r.mar",
        "--save-recipe",
        tmp_path / "r.yaml",
    )
    assert code == 0, stderr
    step = load_recipe(tmp_path / "r.yaml")["steps"][0]["package"]
    assert step["format"] == "mar" and step["artifact"] == str(serve_artifacts["fp32"])


@needs_archiver
def test_onnx_without_sidecar_takes_its_inputs_from_the_graph(tmp_path, serve_artifacts):
    from ptopt.serve.package import package

    src = serve_artifacts["onnx"]
    d = tmp_path / "bare"
    d.mkdir()
    for p in src.parent.glob(src.name + "*"):
        if not p.name.endswith(".ptopt.json"):
            shutil.copy2(p, d / p.name)
    art = package(d / src.name, "mar", tmp_path / "g.mar")
    assert [(s.name, s.min_shape, s.max_shape) for s in art.inputs] == [
        ("input", (1, 1, 8, 8), (64, 1, 8, 8))
    ]
    assert not list(d.glob("*.ptopt.json"))  # the user's folder is left alone


@needs_archiver
def test_model_reference_goes_through_the_export_contract(tmp_path, monkeypatch):
    """Packaging a MODEL calls ``ptopt.export.api:export(model, "torchscript", output)`` and packages the
    Artifact it returns (a stand-in for the export stage, so this runs before it is merged)."""
    import sys
    import types
    import warnings

    import torch

    from ptopt.core.modelref import as_loaded
    from ptopt.serve.package import package

    calls = []

    def export(model, target, output):
        loaded = as_loaded(model)
        calls.append((loaded.ref, target))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.jit.trace(loaded.module, loaded.example_inputs()).save(str(output))
        return Artifact(
            output, "torchscript", loaded.input_specs, loaded.input_style, parent=loaded.parent_record()
        ).finalize()

    monkeypatch.setitem(sys.modules, "ptopt.export.api", types.SimpleNamespace(export=export))
    art = package("tests.helpers:tiny_cnn", "mar", tmp_path / "f.mar")
    assert calls == [("tests.helpers:tiny_cnn", "torchscript")]
    names, manifest, _ = _mar_contents(art.path)
    assert {"model.pt", "model.pt.ptopt.json"} <= names
    assert art.inputs[0].opt_shape[1:] == (1, 8, 8)
    assert art.parent["path"] == "tests.helpers:tiny_cnn"
