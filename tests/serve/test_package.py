"""``ptopt package --format mar`` (no server needed): archive contents, sidecar, and bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import zipfile

import pytest
import yaml

from ptopt.core.artifact import Artifact
from tests.helpers import assert_refused
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
    assert_refused(
        cli,
        "package",
        bare,
        "--format",
        "mar",
        "-o",
        out,
        match=("--input-shape", "no sidecar"),
        where=tmp_path,
    )
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
        (["{fp32}", "--format", "mar", "-o", "x.zip"], "must end in .mar"),
        (["{fp32}", "--format", "mar", "-o", "x.mar", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["{fp32}", "--format", "mar", "-o", "x.mar", "--workers", "0"], "--workers must be >= 1, got 0"),
        (["{fp32}", "--format", "mar", "-o", "x.mar", "--threads", "0"], "--threads must be >= 1, got 0"),
        (
            ["{fp32}", "--format", "mar", "-o", "x.mar", "--batch-size", "100"],
            "larger than the model's max batch",
        ),
        (["{fp32}", "--format", "mar", "-o", "x.mar", "--model-name", "9 bad"], "model name"),
    ],
    ids=["missing", "not-mar", "batch-0", "workers-0", "threads-0", "batch-too-big", "bad-name"],
)
def test_bad_input_exits_2_and_writes_nothing(cli, tmp_path, serve_artifacts, args, message):
    args = [a.format(fp32=serve_artifacts["fp32"]) for a in args]
    assert_refused(cli, "package", *args, match=message, where=tmp_path)


def test_unknown_format_is_refused_in_one_line(cli, tmp_path, serve_artifacts):
    """The twin checks --format's choices (one line, exit 2), for the CLI as for Python."""
    assert_refused(
        cli,
        "package",
        serve_artifacts["fp32"],
        "--format",
        "zip",
        "-o",
        "x.mar",
        match="unknown --format 'zip'",
        where=tmp_path,
    )


@pytest.mark.parametrize(
    "fmt, output, kwargs, message",
    [
        ("zip", "x.mar", {}, "unknown --format 'zip': choose one of mar, triton"),
        ("mar", "x.zip", {}, "-o {tmp}/x.zip: a TorchServe archive must end in .mar"),
        ("mar", "x.mar", {"max_batch_delay_ms": -1}, "--max-batch-delay must be >= 0, got -1"),
        ("mar", "x.mar", {"response_timeout_s": 0}, "--response-timeout must be >= 1, got 0"),
        ("mar", "x.mar", {"model_name": "_m"}, "model name '_m': use letters, digits"),
        ("triton", "file.txt", {}, "a Triton model repository is a folder, and this is a file"),
    ],
    ids=["unknown-format", "not-mar", "delay-negative", "timeout-0", "bad-name", "triton-into-a-file"],
)
def test_python_twin_refuses_bad_options(tmp_path, serve_artifacts, fmt, output, kwargs, message):
    from ptopt.core.errors import UsageError
    from ptopt.serve.package import package

    (tmp_path / "file.txt").write_text("not a folder\n")
    assert_refused(
        package,
        serve_artifacts["fp32"],
        fmt,
        tmp_path / output,
        match=message.format(tmp=tmp_path),
        where=tmp_path,
        error=UsageError,
        **kwargs,
    )


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
def test_a_hugging_face_model_packages_with_the_inputs_its_config_implies(cli, tmp_path):
    """A Hugging Face model's reference (its folder, or a factory) needs no --input-shape: its config says
    what it takes, as in every other command (package refused it, suggesting 1x3x224x224 for a BERT)."""
    pytest.importorskip("transformers")
    from tests.compat.models import bert

    bert().save_pretrained(tmp_path / "bert")
    code, stdout, stderr = cli(
        "package", f"hf:{tmp_path / 'bert'}", "--format", "triton", "-o", tmp_path / "repo"
    )
    assert code == 0, stderr
    (config,) = (tmp_path / "repo").rglob("config.pbtxt")
    text = config.read_text()
    # the padding mask and any length (dims -1): a tokenizer's batch fits as it comes
    assert 'name: "input_ids__0"' in text and 'name: "attention_mask__1"' in text
    assert text.count("dims: [ -1 ]") == 2 and "max_batch_size: 64" in text
    # a model whose inputs nothing says is still refused, with a shape built from its first layer
    assert_refused(cli, "package", "tests.serve.test_package:plain_cnn", "--format", "triton", "-o",
                   tmp_path / "r2", match=("input shape unknown", "--input-shape 1x3x224x224"), where=tmp_path)  # fmt: skip


def plain_cnn():
    """A factory whose model declares no inputs (no example_inputs, no config)."""
    import torch

    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())


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


def test_workers_auto_is_one_per_physical_core(cli, tmp_path, serve_artifacts):
    from ptopt.serve.package import physical_cores

    cores = physical_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    code, stdout, stderr = cli(
        "package", serve_artifacts["fp32"], "--format", "mar", "-o", "a.mar", "--workers", "auto"
    )
    assert code == 0, stderr
    assert f"workers: {cores} (auto: physical cores), 1 thread(s) each" in stdout
    with zipfile.ZipFile(tmp_path / "a.mar") as z:
        cfg = yaml.safe_load(z.read("model-config.yaml"))
    assert cfg["minWorkers"] == cfg["maxWorkers"] == cores and cfg["handler"] == {"threads": 1}
    # the batching defaults are always written down
    assert cfg["batchSize"] == 1 and cfg["maxBatchDelay"] == 5 and cfg["responseTimeout"] == 120
    assert_refused(
        cli, "package", serve_artifacts["fp32"], "--format", "mar", "-o", "b.mar", "--workers", "many",
        match="--workers 'many'", where=tmp_path,
    )  # fmt: skip


def test_a_renamed_copy_is_said_to_be_one_not_to_have_no_sidecar(cli, tmp_path, serve_artifacts):
    """``cnn.int8.pt`` and its sidecar copied to ``s/cnn_int8_pt.pt`` (+ ``.ptopt.json``): the sidecar
    is there but names ``cnn.int8.pt``; serve and package say so, as ``inspect`` does (it said "no
    sidecar (cnn_int8_pt.pt.ptopt.json)")."""
    from ptopt.core.errors import ModelLoadError
    from ptopt.serve.package import package
    from ptopt.serve.runtime import ServedModel

    src = serve_artifacts["int8"]
    d = tmp_path / "s"
    d.mkdir()
    renamed = d / "cnn_int8_pt.pt"
    shutil.copy2(src, renamed)
    shutil.copy2(f"{src}.ptopt.json", f"{renamed}.ptopt.json")
    said = (
        "stale sidecar",
        "cnn.int8.pt is missing",
        "renamed copy",
        "keep the name cnn.int8.pt",
        "--input-shape",
    )
    code, out, _ = cli("inspect", renamed)
    assert code == 0 and "stale" in out and "cnn.int8.pt is missing" in out
    msg = assert_refused(cli, "package", renamed, "--format", "mar", "-o", tmp_path / "m.mar", match=said)
    assert "no sidecar" not in msg
    assert_refused(cli, "serve", renamed, match=said, where=tmp_path)
    assert_refused(package, renamed, "mar", tmp_path / "m.mar", match=said, error=ModelLoadError)
    with pytest.raises(ModelLoadError, match="renamed copy .*nothing to check requests against"):
        ServedModel(renamed)
