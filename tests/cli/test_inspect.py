"""``ptopt inspect`` of files that keep their weights outside ``parameters()`` or run in another runtime:
ONNX and OpenVINO IR (one batch in their own runtime with ``--data``; outputs, precision and weights
read from the graph without), int8 TorchScript (packed weights), and package folders."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import warnings

import pytest
import torch

from ptopt.core.errors import ModelLoadError
from ptopt.core.inspect import inspect_model
from tests.helpers import assert_refused, tiny_cnn

needs_openvino = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None,
    reason="openvino is not installed (pip install 'ptopt[openvino]')",
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """tiny_cnn as ONNX (and OpenVINO IR where installed), 5 labelled samples, an int8 TorchScript."""
    import ptopt

    root = tmp_path_factory.mktemp("inspect")
    data = root / "d.pt"
    torch.save({"x": torch.randn(5, 1, 8, 8), "y": torch.arange(5)}, data)
    calib = root / "calib.pt"
    torch.save({"x": torch.randn(32, 1, 8, 8)}, calib)
    out = {"data": data, "onnx": root / "tiny.onnx", "int8": root / "tiny.int8.pt"}
    ptopt.export(tiny_cnn(), "onnx", out["onnx"], input_shapes="2x1x8x8", progress=False)
    ptopt.quantize(tiny_cnn(), "static", out["int8"], calib_data=calib, progress=False)
    if importlib.util.find_spec("openvino") is not None:
        out["xml"] = root / "tiny.xml"
        ptopt.export(tiny_cnn(), "openvino", out["xml"], input_shapes="2x1x8x8", progress=False)
    return out


# -- 1. --data runs one batch through ONNX / OpenVINO files in their own runtime ------------------------


@pytest.mark.parametrize("kind", ["onnx", pytest.param("xml", marks=needs_openvino)])
def test_data_runs_one_batch_in_the_files_runtime(cli, files, kind):
    code, out, err = cli("inspect", files[kind], "--data", files["data"])
    assert code == 0, err  # was: internal error: KeyError: 'ran_batch'
    assert "internal error" not in err
    assert "one batch ran: input 5x1x8x8" in out
    assert [ln for ln in out.splitlines() if ln.startswith("output:") and ": 5x10 float32" in ln], out

    code, out, err = cli("inspect", files[kind], "--data", files["data"], "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ran_batch"] == {"input": "5x1x8x8"}
    assert [(o["shape"], o["dtype"]) for o in report["outputs"]] == [([5, 10], "float32")]

    report = inspect_model(str(files[kind]), data=str(files["data"]))
    assert report["outputs"][0]["shape"] == [5, 10] and report["ran_batch"] == {"input": "5x1x8x8"}


def test_data_that_does_not_fit_an_onnx_file_is_one_line(cli, files, tmp_path):
    torch.save({"x": torch.randn(4, 3, 8, 8)}, tmp_path / "rgb.pt")
    assert_refused(
        cli, "inspect", files["onnx"], "--data", tmp_path / "rgb.pt", match=("does not fit", "4x3x8x8")
    )


# -- 2. int8 TorchScript: packed weights, int8 layers, precision; graphs: outputs, precision, weights ---


def test_int8_torchscript_counts_its_packed_weights(cli, files):
    code, out, err = cli("inspect", files["int8"])
    assert code == 0, err
    assert "parameters: 0 " not in out
    assert "precision:  int8 (from its sidecar)" in out
    assert "int8 layers" in out and "qint8" in out and "conv2d" in out and "linear" in out

    report = inspect_model(str(files["int8"]))
    rows = report["int8_layers"]
    # conv1 (+ReLU) 8x1x3x3, conv2 8x8x3x3, fc 10x512, each with its bias
    assert [r["params"] for r in rows] == [72 + 8, 576 + 8, 5120 + 10]
    assert [r["dtype"] for r in rows] == ["qint8"] * 3
    assert report["parameters"] == sum(r["params"] for r in rows)
    assert report["parameter_bytes"] == sum(r["bytes"] for r in rows) == 80 + 24 + 584 + 24 + 5130 + 30
    assert report["precision"] == "int8" and report["precision_from"] == "sidecar"


def test_int8_module_hierarchy_names_its_layers_without_a_sidecar(cli, tmp_path):
    """A traced (not frozen) int8 module keeps its module names; its precision comes from its weights."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    x = torch.randn(4, 1, 8, 8)
    path = tmp_path / "int8_traced.pt"
    with warnings.catch_warnings():  # torch.ao's deprecation warnings
        warnings.simplefilter("ignore")
        prepared = prepare_fx(tiny_cnn().eval(), get_default_qconfig_mapping("x86"), (x,))
        prepared(x)
        torch.jit.save(torch.jit.trace(convert_fx(prepared), x), str(path))

    report = inspect_model(str(path))
    assert [(r["name"], r["params"]) for r in report["int8_layers"]] == [
        ("conv1", 80),
        ("conv2", 584),
        ("fc", 5130),
    ]
    assert report["precision"] == "int8" and report["precision_from"] == "weights"
    assert not [r for r in report["layers"] if r["name"] in ("conv1", "conv2", "fc")]  # not float rows
    code, out, err = cli("inspect", path)
    assert code == 0, err
    assert "precision:  int8 (from its weights)" in out and "parameters: 5,794" in out


def test_onnx_without_data_lists_outputs_precision_and_initializers(cli, files):
    code, out, err = cli("inspect", files["onnx"])
    assert code == 0, err
    assert "precision:  fp32 (from its sidecar)" in out
    assert "output:     output: [1..64]x10 float32" in out
    # the weights of conv1, conv2 (BatchNorm folded in), fc: ~5.8k float32 values
    assert re.search(r"weights:    \d+ initializers, 5,[78]\d\d values \(23,\d\d\d bytes\)", out), out
    report = inspect_model(str(files["onnx"]))
    assert report["outputs"] == [{"name": "output", "shape": ["1..64", 10], "dtype": "float32"}]
    assert list(report["weights"]) == ["initializers"] and report["weights"]["initializers"]["bytes"] > 23000
    assert report["precision"] == "fp32" and "ran_batch" not in report


def _fp16_onnx(path):
    """A one-MatMul ONNX graph with a float16 initializer and a symbolic batch, no sidecar."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3), dtype=np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", 3])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_onnx_precision_from_its_weights_without_a_sidecar(cli, tmp_path):
    path = _fp16_onnx(tmp_path / "half.onnx")
    report = inspect_model(str(path))
    assert report["precision"] == "fp16" and report["precision_from"] == "weights"  # ONNX records none
    assert report["parameters"] == 12 and report["parameter_bytes"] == 24
    assert report["outputs"] == [{"name": "y", "shape": ["1..64", 3], "dtype": "float16"}]
    code, out, err = cli("inspect", path)
    assert code == 0, err
    assert "precision:  fp16 (from its weights)" in out and "output:     y: [1..64]x3 float16" in out


@needs_openvino
def test_openvino_bf16_and_fp32_irs_read_differently(cli, files, tmp_path):
    """An IR's precision: its sidecar's, else the one ptopt recorded in the IR (rt_info)."""
    import openvino as ov

    from ptopt.formats.openvino import HINT_KEY

    model = ov.Core().read_model(str(files["xml"]))
    model.set_rt_info("bf16", list(HINT_KEY))
    ov.save_model(model, str(tmp_path / "half.xml"), compress_to_fp16=False)
    shutil.copyfile(files["xml"], tmp_path / "full.xml")
    shutil.copyfile(files["xml"].with_suffix(".bin"), tmp_path / "full.bin")

    assert inspect_model(str(tmp_path / "half.xml"))["precision"] == "bf16"
    code, out, err = cli("inspect", files["xml"])
    assert code == 0, err
    assert "precision:  fp32 (from its sidecar)" in out
    assert [ln for ln in out.splitlines() if ln.startswith("output:") and "[1..64]x10 float32" in ln]
    assert "constants" in out and "weights:" in out
    code, out, err = cli("inspect", tmp_path / "half.xml")
    assert code == 0, err
    assert "precision:  bf16 (from its graph)" in out
    report = inspect_model(str(files["xml"]))
    assert report["weights"]["constants"]["bytes"] >= 23120 and report["parameters"] >= 5780
    # no sidecar: the size is the IR's two files (it was the .xml alone)
    full = tmp_path / "full.xml"
    assert (
        inspect_model(str(full))["size_bytes"]
        == full.stat().st_size + full.with_suffix(".bin").stat().st_size
    )


# -- 3. a folder is called a folder ----------------------------------------------------------------------


def test_a_package_folder_is_not_called_a_file(cli, tmp_path):
    folder = tmp_path / "ray"
    folder.mkdir()
    (folder / "ptopt_ray.json").write_text("{}")
    msg = assert_refused(cli, "inspect", folder, match=("a Ray Serve application folder is not a model",))
    assert "folder file" not in msg
    with pytest.raises(ModelLoadError, match="a Ray Serve application folder is not a model") as e:
        inspect_model(str(folder))
    assert "folder file" not in str(e.value)
    (tmp_path / "m.mar").write_bytes(b"PK")
    assert_refused(cli, "inspect", tmp_path / "m.mar", match=("a TorchServe .mar file is not a model",))


# -- 4. a file's inputs are what it declares, whatever the data ------------------------------------------


class _SeqSum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sum(1)


def test_data_runs_a_batch_the_file_takes_and_leaves_its_declared_inputs(cli, tmp_path):
    """`inspect FILE --data D` printed the data's shapes as the file's inputs ([1..64]x5x3 for a file
    that takes [1..4]x[2..6]x3) and ran a batch of 8 past its largest batch."""
    import ptopt

    out = tmp_path / "seq.pt"
    ptopt.export(
        _SeqSum().eval(),
        "torchscript",
        out,
        min_shape="1x2x3",
        opt_shape="2x4x3",
        max_shape="4x6x3",
        progress=False,
    )
    torch.save({"x": torch.randn(16, 5, 3)}, tmp_path / "d.pt")
    code, out_text, err = cli("inspect", out, "--data", tmp_path / "d.pt")
    assert code == 0, err
    assert "input:      input: [1..4]x[2..6]x3 float32" in out_text, out_text
    assert "one batch ran: input 4x5x3" in out_text, out_text
