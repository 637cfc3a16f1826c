"""``--format triton``: the model repository, checked for consistency with the model itself (Triton
can't run here): config.pbtxt parsed back and compared with the ONNX graph / the TorchScript outputs."""

from __future__ import annotations

import onnx
import pytest
import torch

from ptopt.core.artifact import Artifact
from ptopt.serve.triton import TRITON_DTYPES, read_config


def _graph_io(path):
    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def one(vi):
        t = vi.type.tensor_type
        return (
            vi.name,
            TRITON_DTYPES[onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name],
            [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim],
        )

    return ([one(v) for v in model.graph.input if v.name not in inits], [one(v) for v in model.graph.output])


def test_onnx_repository_matches_the_graph(cli, tmp_path, serve_artifacts):
    repo = tmp_path / "repo"
    code, stdout, stderr = cli(
        "package",
        serve_artifacts["onnx"],
        "--format",
        "triton",
        "-o",
        repo,
        "--batch-size",
        "8",
        "--max-batch-delay",
        "2",
        "--workers",
        "2",
        "--threads",
        "1",
    )
    assert code == 0, stderr
    assert "tritonserver --model-repository" in stdout
    cfg = read_config(repo / "cnn" / "config.pbtxt")
    assert cfg["name"] == "cnn" and cfg["platform"] == "onnxruntime_onnx"
    assert cfg["max_batch_size"] == 64  # the spec's max batch
    model_file = repo / "cnn" / "1" / "model.onnx"
    inputs, outputs = _graph_io(model_file)
    # a dynamic batch: Triton's dims leave out dimension 0
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == [
        (n, t, d[1:]) for n, t, d in inputs
    ]
    assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == [
        (n, t, d[1:]) for n, t, d in outputs
    ]
    assert all(d[0] == -1 for _, _, d in inputs)
    assert cfg["dynamic_batching"] == {"preferred_batch_size": [8], "max_queue_delay_microseconds": 2000}
    assert cfg["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    assert cfg["parameters"]["key"] == "intra_op_thread_count"
    # self-contained model file that ONNX Runtime runs with the config's input names
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 1, 8, 8).numpy()
    assert sess.run(None, {cfg["input"][0]["name"]: x})[0].shape == (3, *cfg["output"][0]["dims"])
    art = Artifact.load(repo)
    assert art.format == "triton" and art.config["platform"] == "onnxruntime_onnx"
    assert sorted(art.files) == ["repo/cnn/1/model.onnx", "repo/cnn/config.pbtxt"] and art.size_bytes > 0


def test_torchscript_repository(tmp_path, serve_artifacts):
    from ptopt.serve.package import package

    art = package(serve_artifacts["keyword"], "triton", tmp_path / "models", model_name="text")
    cfg = read_config(tmp_path / "models" / "text" / "config.pbtxt")
    assert cfg["platform"] == "pytorch_libtorch" and cfg["max_batch_size"] == 64
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == [
        ("input_ids__0", "TYPE_INT64", [12]),
        ("attention_mask__1", "TYPE_INT64", [12]),
    ]
    assert cfg["output"] == [{"name": "output__0", "data_type": "TYPE_FP32", "dims": [10]}]
    assert "preferred_batch_size" not in cfg["dynamic_batching"]
    model = torch.jit.load(str(tmp_path / "models" / "text" / "1" / "model.pt"))
    ids = torch.zeros(2, 12, dtype=torch.int64)
    assert list(model(ids, torch.ones_like(ids)).shape[1:]) == cfg["output"][0]["dims"]
    assert art.extra["model_name"] == "text"


def test_static_batch_means_max_batch_size_0(tmp_path, serve_artifacts):
    import shutil

    from ptopt.serve.package import package

    bare = tmp_path / "static.pt"
    shutil.copy2(serve_artifacts["fp32"], bare)
    art = Artifact.load(serve_artifacts["fp32"])
    Artifact(bare, "torchscript", [s.with_batch(2, 2, 2) for s in art.inputs]).finalize()
    package(bare, "triton", tmp_path / "repo")
    cfg = read_config(tmp_path / "repo" / "static" / "config.pbtxt")
    assert cfg["max_batch_size"] == 0 and "dynamic_batching" not in cfg
    assert cfg["input"][0]["dims"] == [2, 1, 8, 8] and cfg["output"][0]["dims"] == [2, 10]


def test_output_that_is_a_file_is_refused(cli, tmp_path, serve_artifacts):
    f = tmp_path / "afile"
    f.write_text("x")
    code, _, stderr = cli("package", serve_artifacts["onnx"], "--format", "triton", "-o", f)
    assert code == 2 and "is a folder" in stderr
    assert f.read_text() == "x"


def test_read_config_parses_lists_and_comments(tmp_path):
    p = tmp_path / "config.pbtxt"
    p.write_text(
        '# comment\nname: "a"\nmax_batch_size: 8\ninput [ { name: "x" dims: [ 3, -1 ] } ]\n'
        'input { name: "y" dims: [ 1 ] }\n'
    )
    cfg = read_config(p)
    assert cfg == {
        "name": "a",
        "max_batch_size": 8,
        "input": [{"name": "x", "dims": [3, -1]}, {"name": "y", "dims": [1]}],
    }


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "float16"])
def test_dtype_names(dtype):
    assert TRITON_DTYPES[dtype].startswith("TYPE_")


def test_an_openvino_ir_is_refused_naming_the_packages_that_take_it(cli, tmp_path):
    """Triton's repository takes ONNX, TorchScript and AOTInductor files; an IR cannot be exported to
    TorchScript (it said "already an OpenVINO IR; export starts from a PyTorch model")."""
    from ptopt.export.api import export
    from tests.helpers import assert_refused

    export("tests.helpers:tiny_cnn", "openvino", tmp_path / "m.xml")
    assert_refused(
        cli, "package", tmp_path / "m.xml", "--format", "triton", "-o", tmp_path / "repo",
        match=("m.xml: a Triton repository does not take an OpenVINO IR", "--format mar or --format ray",
               "the PyTorch model it was made from (tests.helpers:tiny_cnn)"),
    )  # fmt: skip
    assert not (tmp_path / "repo").exists()


def test_a_file_no_package_takes_is_refused_in_one_sentence():
    """A TensorRT engine runs in no package's server: the refusal says what to package instead (it read
    "does not take a TensorRT, or package the PyTorch model ...")."""
    from types import SimpleNamespace

    from ptopt.core.errors import UsageError
    from ptopt.serve.prepare import _refuse_unservable

    loaded = SimpleNamespace(format="tensorrt", ref="m.engine", artifact=None)
    with pytest.raises(UsageError) as e:
        _refuse_unservable(loaded, "triton")
    assert str(e.value) == (
        "m.engine: a Triton repository does not take a TensorRT; package the PyTorch model it was made from (MODEL)"
    )


@pytest.mark.parametrize("which", ["fp32", "onnx"])
def test_ray_serves_the_config_the_triton_repository_holds(tmp_path, serve_artifacts, which):
    """Ray Serve's ``GET /v2/models/NAME/config`` follows the repository's rules: with a dynamic batch,
    ``max_batch_size`` and dims without the batch (it gave ``[-1, 1, 8, 8]`` beside ``max_batch_size: 64``);
    a fixed batch gives 0 and whole dims. Names and types as each server names them (TorchScript's
    ``input__0`` on Triton): only dims and the batch are compared."""
    import dataclasses

    import ptopt
    from ptopt.serve.ray_app import _config
    from ptopt.serve.ray_config import RayServeConfig
    from ptopt.serve.ray_package import manifest, prepare_model
    from ptopt.serve.runtime import ServedModel

    def configs(artifact, name):
        cfg = read_config(ptopt.package(artifact, "triton", tmp_path / name).path / "cnn" / "config.pbtxt")
        model = prepare_model(artifact, tmp_path / f"{name}-ray", "cnn")
        entry = manifest([model], "cnn", RayServeConfig())["models"][0]
        ray = _config(ServedModel(artifact, name="cnn", threads=1).metadata(), entry)
        return cfg, ray

    triton, ray = configs(serve_artifacts[which], "repo")
    assert ray["max_batch_size"] == triton["max_batch_size"] == 64
    assert [t["dims"] for t in ray["input"]] == [t["dims"] for t in triton["input"]] == [[1, 8, 8]]
    assert [t["dims"] for t in ray["output"]] == [t["dims"] for t in triton["output"]] == [[10]]
    if which == "onnx":
        return  # Triton's ONNX dims are the graph's (a dynamic batch here): a fixed spec on it would disagree
    fixed = tmp_path / "fixed" / serve_artifacts[which].name
    fixed.parent.mkdir()
    art = Artifact.load(serve_artifacts[which])
    for f in art.file_paths:
        (fixed.parent / f.name).write_bytes(f.read_bytes())
    Artifact(fixed, art.format, [dataclasses.replace(s).with_batch(2, 2, 2) for s in art.inputs], art.input_style,
             precision=art.precision).finalize()  # fmt: skip
    triton, ray = configs(fixed, "repo-fixed")
    assert ray["max_batch_size"] == triton["max_batch_size"] == 0
    assert [t["dims"] for t in ray["input"]] == [t["dims"] for t in triton["input"]] == [[2, 1, 8, 8]]
