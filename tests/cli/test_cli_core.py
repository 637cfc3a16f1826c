"""The CLI's contract: fast help without torch, exit codes, one-line errors, inspect and doctor."""

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import assert_refused, tiny_cnn


def test_help_does_not_import_torch():
    code = (
        "import sys; from ptopt.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'torch' not in sys.modules, 'ptopt --help imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "inspect" in out.stdout and "doctor" in out.stdout


def test_no_commands_help_imports_torch():
    """``ptopt distill --help`` and ``ptopt prune --help`` imported torch (1.3 s against 0.15 s): the
    distillation configs lived beside the loss. Every command's help is read without it."""
    code = (
        "import sys; from ptopt.cli.main import main; from ptopt.commands import COMMANDS\n"
        "for name in COMMANDS:\n"
        "    try:\n        main([name, '--help'])\n    except SystemExit as e:\n        assert e.code == 0, name\n"
        "    assert 'torch' not in sys.modules, f'ptopt {name} --help imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--output-loss" in out.stdout and "--seq-len" in out.stdout  # distill's options, all of them


def test_version(cli):
    code, out, _ = cli("--version")
    assert code == 0 and "0.1.0" in out


def test_unknown_command_is_usage_error(cli):
    code, _, err = cli("frobnicate")
    assert code == 2 and "No such command" in err


def test_one_command_table_feeds_the_cli_the_api_and_the_pipeline(cli):
    """ptopt.commands is the only list of commands: the CLI shows exactly its commands with their help
    lines, ``ptopt.<name>`` is each twin, and recipe steps are the commands marked as steps."""
    import ptopt
    from ptopt.commands import COMMANDS, step_commands
    from ptopt.core.formats import file_suffixes, targets
    from ptopt.pipeline import resolve_twin

    code, out, _ = cli("--help")
    flat = " ".join(out.split())
    for suffix in file_suffixes():  # (issue 40) every MODEL form from the format table, not by hand
        assert f"model{suffix} (" in flat
    assert "hf:DIR" in flat and "builtin:pydoc-text" in flat
    runtimes = " ".join(cli("validate", "--help")[1].split())
    assert all(f.label in runtimes for f in targets().values()), runtimes
    listed = [
        ln.split()[0] for ln in out.split("Commands:")[1].splitlines() if ln.startswith("  ") and ln[2] != " "
    ]
    assert code == 0 and listed == sorted(COMMANDS)
    for name, command in COMMANDS.items():
        assert command.help.split()[0] in out
        if command.api_target:
            assert name in dir(ptopt) and callable(getattr(ptopt, name))
    assert set(step_commands()) == {
        "quantize",
        "prune",
        "distill",
        "export",
        "validate",
        "package",
        "optimize",
    }
    assert resolve_twin("validate", "test") is ptopt.validate.api.validate
    assert ptopt.quantize is resolve_twin("quantize", "test")


@pytest.fixture
def scripted(tmp_path):
    path = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.trace(tiny_cnn().eval(), torch.randn(2, 1, 8, 8)), str(path))
    return path


def test_inspect_factory(cli):
    code, out, err = cli("inspect", "tests.helpers:tiny_cnn")
    assert code == 0, err
    assert "parameters: " in out and "input:      input: [1..64]x1x8x8 float32" in out
    assert "output:     output: 2x10 float32 (from a batch of 2)" in out  # not the model's fixed width
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


def _text_model(tmp_path):
    (tmp_path / "model.pt").write_text("hello")
    return [tmp_path / "model.pt"]


def _pickled(tmp_path):
    torch.save(tiny_cnn(), tmp_path / "full.pt")
    return [tmp_path / "full.pt"]


def _bad_weights(tmp_path):
    torch.save({"conv1.weight": torch.zeros(3, 3)}, tmp_path / "w.pt")
    return ["tests.helpers:tiny_cnn", "--weights", tmp_path / "w.pt"]


def _data_32x32(tmp_path, model="tests.helpers:tiny_cnn"):
    torch.save({"x": torch.randn(4, 3, 32, 32)}, tmp_path / "d.pt")
    return [model, "--data", tmp_path / "d.pt"]


def _scripted_with_32x32_data(tmp_path):
    path = tmp_path / "tiny.pt"
    torch.jit.save(torch.jit.trace(tiny_cnn().eval(), torch.randn(2, 1, 8, 8)), str(path))
    return _data_32x32(tmp_path, path)


#: case -> (arguments of `ptopt inspect`, or a function of tmp_path making them; what the line says)
BAD_INSPECT = {
    "missing-file": (["nope.pt"], ("no such file",)),
    "text-file-named-model-pt": (_text_model, ("not a PyTorch model file",)),
    "pickled-module-without-allow-pickle": (_pickled, ("--allow-pickle", "arbitrary code")),
    "factory-that-does-not-import": (["not_a_module.sub:factory"], ("cannot import 'not_a_module.sub'",)),
    "weights-that-dont-fit": (
        _bad_weights,
        ("don't fit the model", "missing keys: bn1.bias", "conv1.weight (3, 3) vs model (8, 1, 3, 3)"),
    ),
    "data-that-does-not-fit": (
        _data_32x32,
        ("does not fit", "expected input: [1..64]x1x8x8 float32", "got 4x3x32x32 float32"),
    ),
    "data-that-does-not-fit-undeclared-inputs": (
        _scripted_with_32x32_data,
        ("does not fit model", "got input: 4x3x32x32 float32"),
    ),
}


@pytest.mark.parametrize("case", list(BAD_INSPECT), ids=list(BAD_INSPECT))
def test_bad_input_is_one_line_exit_2(cli, tmp_path, case):
    args, match = BAD_INSPECT[case]
    args = args(tmp_path) if callable(args) else args
    assert_refused(cli, "inspect", *args, match=match, where=tmp_path)


def test_pickled_module_loads_with_allow_pickle(cli, tmp_path):
    code, out, err = cli("inspect", *_pickled(tmp_path), "--allow-pickle")
    assert code == 0, err


def test_debug_shows_traceback(run_ptopt):
    out = run_ptopt("--debug", "inspect", "nope.pt")
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_subprocess_exit_code(run_ptopt, tmp_path):
    msg = assert_refused(run_ptopt, "inspect", "nope.pt", where=tmp_path)
    assert msg.startswith("error: model 'nope.pt': no such file")


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
    assert code == 0 and "Runtimes and backends" in out and "ptopt[tensorrt]" in out
    isa = next(line for line in out.splitlines() if line.startswith("isa:"))
    assert "has avx2" in isa or "lacks avx2" in isa
    assert len(isa) <= 100, isa  # it read "avx2 yes, fma yes, ...": 118 columns


def test_doctor_lists_every_runtime_a_format_needs_with_its_fix(cli, monkeypatch):
    """Every package a format row names (OpenVINO, NNCF, transformers, TensorRT, ...) is a doctor row or
    named in one; a missing one shows the line that installs it."""
    import ptopt  # noqa: F401 - registers the formats
    from ptopt.core import features
    from ptopt.core.formats import formats

    code, out, err = cli("doctor", "--json")
    assert code == 0, err
    rows = json.loads(out)["features"]
    assert {"openvino", "nncf", "transformers", "torchao", "torchserve", "java", "torch_tensorrt"} <= set(
        rows
    )
    text = json.dumps(rows)
    for fmt in formats():
        for package in fmt.packages:
            assert package.replace("-", "_") in rows or package in text, (fmt.name, package)
    for name in ("openvino", "transformers"):  # installed here (the test extra): a version
        assert rows[name]["available"] and rows[name]["version"], rows[name]

    monkeypatch.setattr(features, "package_version", lambda dist: None)  # nothing optional installed
    code, out, err = cli("doctor")
    assert code == 0, err
    for fix in ("pip install 'ptopt[openvino]'", "pip install 'ptopt[llm]'", "pip install 'ptopt[torchao]'"):
        assert fix in out, fix
    assert "missing: each row says how to install it" in out


def test_every_command_takes_quiet(cli, run_ptopt, tmp_path):
    """``--quiet`` / ``-q`` was on validate, optimize and run only (quantize and distill: ``--no-progress``;
    export, prune, package, inspect: neither), though the docs said every command has it."""
    from ptopt.commands import COMMANDS

    for name in COMMANDS:
        code, out, _ = cli(name, "--help")
        assert code == 0 and "-q, --quiet" in out, name
    args = ("export", "tests.helpers:tiny_cnn", "--target", "torchscript", "-o")
    run = run_ptopt(*args, tmp_path / "new" / "a.pt")  # a note on stderr: "created folder new/ ..."
    assert run.returncode == 0 and "created folder" in run.stderr, run.stderr
    run = run_ptopt(*args, tmp_path / "new2" / "b.pt", "-q")
    assert run.returncode == 0 and run.stderr == "", run.stderr
    code, _, err = cli(
        "quantize", "tests.helpers:tiny_cnn", "--mode", "dynamic", "--no-progress", "-o", tmp_path / "q.pt"
    )
    assert code == 0, err  # the older name still works


def test_an_accuracy_gain_is_not_a_negative_drop():
    """prune printed '(drop -3.12 points)' where the pruned model scored higher."""
    from ptopt.cli.options import drop_text

    assert drop_text(-3.12) == "up 3.12 points" and drop_text(0.56) == "drop 0.56 points"
    assert drop_text(-0.001) == "drop 0.00 points"  # no 'up 0.00', no 'drop -0.00'
