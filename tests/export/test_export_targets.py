"""TorchScript, ONNX and ExportedProgram targets: each written atomically with a sidecar, dynamic
shapes honoured, and the parity check recorded (or failing loudly)."""

from __future__ import annotations

import json

import pytest
import torch

from ptopt.core.artifact import Artifact
from ptopt.core.inputspec import InputSpec

TOKENS = [
    InputSpec("input_ids", (1, 4), (4, 8), (16, 32), "int64", (0, 18)),
    InputSpec("attention_mask", (1, 4), (4, 8), (16, 32), "int64", (1, 2)),
]


def _sidecar(path) -> dict:
    return json.loads((path.parent / (path.name + ".ptopt.json")).read_text())


def test_cli_torchscript_dynamic_batch(cli, tmp_path, tiny_cnn_factory):
    out = tmp_path / "m.pt"
    code, stdout, err = cli(
        "export",
        tiny_cnn_factory,
        "--target",
        "torchscript",
        "--dynamic-batch",
        "1:8:64",
        "-o",
        out,
        "--save-recipe",
        tmp_path / "r.yaml",
    )
    assert code == 0, err
    assert "parity:" in stdout and "input:   input: [1..64]x1x8x8 float32" in stdout
    side = _sidecar(out)
    assert side["format"] == "torchscript" and side["precision"] == "fp32"
    assert side["config"]["type"] == "export" and side["config"]["target"] == "torchscript"
    assert side["parent"]["path"] == tiny_cnn_factory
    parity = side["metrics"]["parity"]
    assert (
        parity["passed"] and set(parity["shapes"]) == {"min", "opt", "max"} and parity["max_abs_diff"] < 1e-4
    )
    m = torch.jit.load(str(out))  # plain torch, no ptopt
    assert m(torch.randn(64, 1, 8, 8)).shape == (64, 10) and m(torch.randn(1, 1, 8, 8)).shape == (1, 10)
    # the recipe replays through the Python twin
    from ptopt.core.recipe import load_recipe
    from ptopt.export.api import export

    (step,) = load_recipe(tmp_path / "r.yaml")["steps"]
    opts = dict(step["export"], output=str(tmp_path / "replayed.pt"))
    assert opts["dynamic_batch"] == "1:8:64"
    assert export(**opts).inputs == Artifact.load(out).inputs


def test_cli_input_shape_exports_a_model_that_declares_no_inputs(cli, tmp_path):
    """``--input-shape`` as quantize, prune and inspect take it (the batch dynamic from 1 to 64,
    ``--dynamic-batch`` setting that range): a factory model with no example_inputs() and no --data
    exports; the saved recipe replays it. Before, export had no --input-shape (click: no such option)."""
    from ptopt.core.recipe import load_recipe
    from ptopt.export.api import export

    ref, out = "tests.compat.models:pooled_cnn", tmp_path / "m.pt"
    code, stdout, err = cli("export", ref, "--target", "torchscript", "--input-shape", "1x3x32x32",
                            "-o", out, "--save-recipe", tmp_path / "r.yaml")  # fmt: skip
    assert code == 0, err
    assert (
        "input:   input: [1..64]x3x32x32 float32" in stdout and _sidecar(out)["metrics"]["parity"]["passed"]
    )
    (step,) = load_recipe(tmp_path / "r.yaml")["steps"]
    assert step["export"]["input_shapes"] == ["1x3x32x32"]
    assert (
        export(**dict(step["export"], output=str(tmp_path / "replayed.pt"))).inputs
        == Artifact.load(out).inputs
    )
    code, stdout, err = cli("export", ref, "--target", "torchscript", "--input-shape", "2x3x32x32",
                            "--dynamic-batch", "1:2:8", "-o", tmp_path / "b.pt")  # fmt: skip
    assert code == 0 and "input:   input: [1..8]x3x32x32 float32" in stdout, err


def test_cli_onnx_single_file_symbolic_batch_and_trtexec_line(cli, tmp_path, tiny_cnn_factory, monkeypatch):
    import onnx
    import onnxruntime as ort

    monkeypatch.setattr("ptopt.cli.export._gpu_here", lambda: True)  # the trtexec line: where a GPU is

    out = tmp_path / "m.onnx"
    code, stdout, err = cli(
        "export",
        tiny_cnn_factory,
        "--target",
        "onnx",
        "--min-shape",
        "1x1x8x8",
        "--opt-shape",
        "8x1x8x8",
        "--max-shape",
        "32x1x8x8",
        "-o",
        out,
    )
    assert code == 0, err
    assert (
        "trtexec: trtexec --onnx=" in stdout
        and "--minShapes=input:1x1x8x8 --optShapes=input:8x1x8x8 --maxShapes=input:32x1x8x8" in stdout
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.ptopt.json"]
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and [d.dim_value for d in dims[1:]] == [1, 8, 8]
    y = ort.InferenceSession(str(out)).run(None, {"input": torch.randn(5, 1, 8, 8).numpy()})[0]
    assert y.shape == (5, 10)
    art = Artifact.load(out)
    assert art.extra["opset"] >= 18 and art.extra["trtexec_shapes"].startswith("--minShapes=")


def test_python_keyword_inputs_onnx_external_data_and_torchscript(tmp_path):
    from ptopt.export.api import export
    from tests.helpers import two_input

    art = export(two_input(), "onnx", tmp_path / "t.onnx", input_specs=TOKENS, external_data=True, opset=18)
    assert art.files == ["t.onnx", "t.onnx.data"] and art.input_style == "keyword"
    assert art.size_bytes == sum((tmp_path / f).stat().st_size for f in art.files)
    assert art.extra["input_names"] == ["input_ids", "attention_mask"] and art.extra["opset"] == 18
    assert art.metrics["parity"]["shapes"]["max"]["shape"] == "input_ids=16x32, attention_mask=16x32"

    ts = export(two_input(), "torchscript", tmp_path / "t.pt", input_specs=TOKENS)
    m = torch.jit.load(str(ts.path))
    x = {"input_ids": torch.randint(0, 18, (3, 20)), "attention_mask": torch.ones(3, 20, dtype=torch.long)}
    torch.testing.assert_close(m(**x), two_input()(**x))


def test_python_script_optimize_and_exported_program(tmp_path, tiny_cnn_factory):
    from ptopt.export.api import export

    s = export(tiny_cnn_factory, "torchscript", tmp_path / "s.pt", script=True, dynamic_batch="1:2:8")
    assert s.extra["method"] == "torch.jit.script" and s.extra["frozen"]
    o = export(tiny_cnn_factory, "onnx", tmp_path / "o.onnx", optimize=True, dynamic_batch="1:2:8")
    assert o.extra["optimized"] and o.metrics["parity"]["passed"]
    p = export(tiny_cnn_factory, "exported_program", tmp_path / "p.pt2", dynamic_batch="1:2:8")
    assert p.format == "exported_program"
    assert torch.export.load(str(p.path)).module()(torch.randn(8, 1, 8, 8)).shape == (8, 10)


def test_parity_failure_keeps_the_artifact_aside(cli, tmp_path):
    """A trace that baked in the example's batch size drifts at the min/max shapes: exit 2, .failed kept."""
    out = tmp_path / "b.pt"
    code, _, err = cli(
        "export",
        "tests.export.export_models:batch_baked",
        "--target",
        "torchscript",
        "--dynamic-batch",
        "1:2:8",
        "-o",
        out,
    )
    assert code == 2 and "drifts from its source beyond tolerance" in err and "b.pt.failed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.pt.failed"]
    # with a tolerance loose enough it passes (the user's call)
    from ptopt.export.api import export

    with pytest.raises(Exception, match="drifts"):
        export(
            "tests.export.export_models:batch_baked",
            "torchscript",
            tmp_path / "c.pt",
            dynamic_batch="1:2:8",
            atol=1e-3,
        )


def test_a_successful_export_removes_the_failed_files_of_its_output(cli, tmp_path):
    """A failed export's ``b.pt.failed`` stayed beside the ``b.pt`` a later export wrote; only the output's
    own ``.failed`` names go (an OpenVINO IR's ``.xml.failed`` and ``.bin.failed``), nothing else."""
    from ptopt.export.api import export

    code, _, _ = cli("export", "tests.export.export_models:batch_baked", "--target", "torchscript",
                     "--dynamic-batch", "1:2:8", "-o", tmp_path / "b.pt")  # fmt: skip
    assert code == 2 and (tmp_path / "b.pt.failed").is_file()
    (tmp_path / "other.pt.failed").write_text("not this output's")
    code, _, err = cli("export", "tests.export.export_models:batch_baked", "--target", "torchscript",
                       "--opt-shape", "2x1x8x8", "-o", tmp_path / "b.pt")  # fmt: skip
    assert code == 0, err
    assert "removed" in err and sorted(p.name for p in tmp_path.iterdir() if "failed" in p.name) == [
        "other.pt.failed"
    ]
    pytest.importorskip("openvino")
    for name in ("m.xml.failed", "m.bin.failed", "m.xml.failed.txt"):
        (tmp_path / name).write_text("stale")
    export("tests.helpers:tiny_cnn", "openvino", tmp_path / "m.xml", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir() if "failed" in p.name) == [
        "m.xml.failed.txt",
        "other.pt.failed",
    ]


def test_the_opset_asked_for_is_the_opset_written(cli, tmp_path):
    """``--opset 13`` (torch's dynamo exporter writes 18 and later, REFERENCE.md): the TorchScript exporter
    writes 13, and the file, the sidecar and ORT agree; an opset onnx does not know, or below 7, is refused
    before anything is exported, and nothing is written."""
    import onnx

    from ptopt.export.api import export
    from tests.helpers import assert_refused, tiny_cnn

    code, _, err = cli(
        "export", "tests.helpers:tiny_cnn", "--target", "onnx", "--opset", "13", "-o", "m13.onnx"
    )
    assert code == 0, err
    assert [o.version for o in onnx.load(str(tmp_path / "m13.onnx")).opset_import if o.domain == ""] == [13]
    art = Artifact.load(tmp_path / "m13.onnx")
    assert art.config["opset"] == art.extra["opset"] == 13 and "dynamo=False" in art.extra["exporter"]
    assert (
        export(tiny_cnn(), "onnx", tmp_path / "m21.onnx", input_shapes="1x1x8x8", opset=21).extra["opset"]
        == 21
    )
    assert_refused(cli, "export", "tests.helpers:tiny_cnn", "--target", "onnx", "--opset", "99", "-o", "x.onnx",
                   match="the newest opset onnx", where=tmp_path)  # fmt: skip
    assert_refused(cli, "export", "tests.helpers:tiny_cnn", "--target", "onnx", "--opset", "3", "-o", "x.onnx",
                   match="7 or later", where=tmp_path)  # fmt: skip
    # the TorchScript exporter passes inputs by position: a model of named inputs is refused below 18
    assert_refused(cli, "export", "tests.helpers:two_input", "--target", "onnx", "--opset", "17", "--min-shape",
                   "input_ids=1x6", "--min-shape", "attention_mask=1x6", "-o", "t.onnx",
                   match=("named inputs (input_ids, attention_mask)", "--opset 18 or later"), where=tmp_path)  # fmt: skip
    # ORT's static int8 writes per-channel weights: opset 13 or later
    assert_refused(cli, "export", "tests.helpers:tiny_cnn", "--target", "onnx", "--opset", "12", "--precision",
                   "int8", "--data", "builtin:digits:train", "-o", "q.onnx", match="need opset 13 or later",
                   where=tmp_path)  # fmt: skip
