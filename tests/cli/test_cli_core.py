"""The CLI's contract: fast help without torch, exit codes, one-line errors, inspect and doctor."""

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import tiny_cnn


def test_help_does_not_import_torch():
    code = (
        "import sys; from ptopt.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'torch' not in sys.modules, 'ptopt --help imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "inspect" in out.stdout and "doctor" in out.stdout


def test_version(cli):
    code, out, _ = cli("--version")
    assert code == 0 and "0.1.0" in out


def test_unknown_command_is_usage_error(cli):
    code, _, err = cli("frobnicate")
    assert code == 2 and "No such command" in err


@pytest.fixture
def scripted(tmp_path):
    path = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.trace(tiny_cnn().eval(), torch.randn(2, 1, 8, 8)), str(path))
    return path


def test_inspect_factory(cli):
    code, out, err = cli("inspect", "tests.helpers:tiny_cnn")
    assert code == 0, err
    assert "parameters: " in out and "input:      input: [1..64]x1x8x8 float32" in out
    assert "output:     output: 2x10 float32" in out
    assert "conv1" in out and "static-int8" in out and "classifier" in out


def test_inspect_with_data_json(cli, scripted, tmp_path):
    data = tmp_path / "d.pt"
    torch.save({"x": torch.randn(5, 1, 8, 8), "y": torch.arange(5)}, data)
    code, out, err = cli("inspect", scripted, "--data", data, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["format"] == "torchscript" and report["data"]["samples"] == 5
    assert report["outputs"][0]["shape"] == [5, 10] and report["size_bytes"] == scripted.stat().st_size


def test_inspect_input_shape_without_data(cli, scripted):
    code, out, err = cli("inspect", scripted, "--input-shape", "3x1x8x8", "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["shape"] == [3, 10]


def test_inspect_multi_input_keyword_model(cli, tmp_path):
    data = tmp_path / "tok.pt"
    torch.save(
        {
            "x": {
                "input_ids": torch.randint(1, 18, (4, 9)),
                "attention_mask": torch.ones(4, 9, dtype=torch.long),
            }
        },
        data,
    )
    code, out, err = cli("inspect", "tests.helpers:two_input", "--data", data, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert [i["name"] for i in r["inputs"]] == ["input_ids", "attention_mask"] and r[
        "input_style"
    ] == "keyword"


# -- bad input: one clear line, exit 2, no traceback ----------------------------------------------


def _bad(cli, *args, match):
    code, out, err = cli(*args)
    assert code == 2, (code, out, err)
    assert match in err, err
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    return err


def test_missing_file(cli):
    _bad(cli, "inspect", "nope.pt", match="no such file")


def test_text_file_named_model_pt(cli, tmp_path):
    (tmp_path / "model.pt").write_text("hello")
    _bad(cli, "inspect", tmp_path / "model.pt", match="not a PyTorch model file")


def test_pickled_module_without_allow_pickle(cli, tmp_path):
    torch.save(tiny_cnn(), tmp_path / "full.pt")
    err = _bad(cli, "inspect", tmp_path / "full.pt", match="--allow-pickle")
    assert "arbitrary code" in err
    code, out, err = cli("inspect", tmp_path / "full.pt", "--allow-pickle")
    assert code == 0, err


def test_factory_that_does_not_import(cli):
    _bad(cli, "inspect", "not_a_module.sub:factory", match="cannot import 'not_a_module.sub'")


def test_weights_that_dont_fit(cli, tmp_path):
    torch.save({"conv1.weight": torch.zeros(3, 3)}, tmp_path / "w.pt")
    err = _bad(
        cli, "inspect", "tests.helpers:tiny_cnn", "--weights", tmp_path / "w.pt", match="don't fit the model"
    )
    assert "missing keys: bn1.bias" in err and "conv1.weight (3, 3) vs model (8, 1, 3, 3)" in err


def test_data_that_does_not_fit(cli, tmp_path):
    torch.save({"x": torch.randn(4, 3, 32, 32)}, tmp_path / "d.pt")
    err = _bad(cli, "inspect", "tests.helpers:tiny_cnn", "--data", tmp_path / "d.pt", match="does not fit")
    assert "expected input: [1..64]x1x8x8 float32" in err and "got 4x3x32x32 float32" in err


def test_data_that_does_not_fit_model_without_declared_inputs(cli, tmp_path, scripted):
    torch.save({"x": torch.randn(4, 3, 32, 32)}, tmp_path / "d.pt")
    err = _bad(cli, "inspect", scripted, "--data", tmp_path / "d.pt", match="does not fit model")
    assert "got input: 4x3x32x32 float32" in err


def test_debug_shows_traceback(run_ptopt):
    out = run_ptopt("--debug", "inspect", "nope.pt")
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_subprocess_exit_code(run_ptopt):
    out = run_ptopt("inspect", "nope.pt")
    assert out.returncode == 2 and out.stderr.startswith("error: model 'nope.pt': no such file")


def test_doctor(cli):
    code, out, err = cli("doctor", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert set(r["features"]) >= {
        "torch",
        "onnxruntime",
        "torch_tensorrt",
        "torchserve",
        "java",
        "cuda",
        "torchao",
    }
    assert (
        r["features"]["onnxruntime"]["available"]
        and "CPUExecutionProvider" in r["features"]["onnxruntime"]["detail"]
    )
    assert "avx2" in r["cpu"]["isa"] and "x86" in r["quantized_engines"]
    trt = r["features"]["torch_tensorrt"]
    if not trt["available"]:
        assert "ptopt[tensorrt]" in trt["fix"]
    code, out, _ = cli("doctor")
    assert code == 0 and "Backends" in out and "ptopt[tensorrt]" in out
