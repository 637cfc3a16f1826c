""".pt2 artifacts served: AOTInductor packages and ExportedPrograms (fp32, PT2E int8) through the
handler and a Ray Serve replica's runtime, a real TorchServe answering from an AOTInductor .mar, and
Triton's torch_aoti repository.

The package fixture compiles one tiny CNN (~10-20 s); one TorchServe serves both .pt2 archives."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import torch

from tests.helpers import assert_refused
from tests.serve.conftest import torchserve_missing
from tests.serve.test_handler import _handler, _json


def _samples(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _want(path, x) -> np.ndarray:
    """What the format table's loader gives: the handler's self-contained copy must agree with it."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.formats import get_format

    model = get_format(Artifact.load(path).format).reload(path)
    with torch.no_grad():
        return model(x).numpy()


@pytest.mark.parametrize("kind", ["aoti", "ep", "int8_ep"])
def test_ray_replica_runs_pt2(pt2_artifacts, kind):
    """What a Ray Serve replica runs (``serve.runtime.ServedModel``, the format table's runner): the
    artifact's own output; an AOTInductor package only with consent (native code)."""
    from ptopt.core.errors import ModelLoadError
    from ptopt.serve.runtime import ServedModel

    path = pt2_artifacts[kind]
    if kind == "aoti":
        assert_refused(ServedModel, path, match="--allow-pickle", error=ModelLoadError)
    served = ServedModel(path, allow_pickle=kind == "aoti", threads=1)
    x = _samples(3, seed=2)
    ((name, got),) = served.run({served.specs[0]["name"]: x.numpy()})
    np.testing.assert_allclose(got, _want(path, x), atol=1e-5)
    assert name == "output__0" and served.metadata()["outputs"][0]["shape"] == [-1, 10]


@pytest.mark.parametrize("kind", ["aoti", "ep", "int8_ep"])
def test_handler_runs_pt2(tmp_path, pt2_artifacts, kind):
    path = pt2_artifacts[kind]
    h, ctx = _handler(tmp_path, path)
    x = _samples(5, seed=1)
    answers = h.handle([_json({"inputs": x.tolist()}), _json({"inputs": x[2].tolist()})], ctx)
    want = _want(path, x)
    np.testing.assert_allclose(np.array(json.loads(answers[0])["outputs"]), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(json.loads(answers[1])["outputs"]), want[2], rtol=1e-4, atol=1e-4)
    assert not ctx.status  # every request answered 200


def test_handler_refuses_a_package_of_another_torch(tmp_path, pt2_artifacts):
    src = pt2_artifacts["aoti"]
    d = tmp_path / "other"
    d.mkdir()
    (d / src.name).write_bytes(src.read_bytes())
    side = json.loads((src.parent / (src.name + ".ptopt.json")).read_text())
    side["extra"]["torch_version"] = "2.0.0"
    (d / (src.name + ".ptopt.json")).write_text(json.dumps(side))
    with pytest.raises(RuntimeError, match=r"built by torch 2\.0\.0, but this worker has torch"):
        _handler(tmp_path, d / src.name)


def test_package_of_an_aoti_package_needs_allow_pickle(cli, tmp_path, pt2_artifacts):
    """Loading a package runs its native code: packaging it asks for the same consent."""
    from ptopt.serve.package import package

    aoti = pt2_artifacts["aoti"]
    assert_refused(
        cli, "package", aoti, "--format", "mar", "-o", "m.mar", match="--allow-pickle", where=tmp_path
    )
    assert_refused(package, aoti, "mar", tmp_path / "m.mar", match="--allow-pickle", where=tmp_path)


def test_triton_repository_for_an_aoti_package(cli, tmp_path, pt2_artifacts):
    from ptopt.serve.triton import read_config

    code, stdout, stderr = cli(
        "package", pt2_artifacts["aoti"], "--format", "triton", "-o", "repo", "--allow-pickle"
    )
    assert code == 0, stderr
    name = json.loads((tmp_path / "repo.ptopt.json").read_text())["extra"]["model_name"]
    cfg = read_config(tmp_path / "repo" / name / "config.pbtxt")
    assert cfg["backend"] == "pytorch" and cfg["platform"] == "torch_aoti" and cfg["max_batch_size"] == 0
    assert cfg["input"][0]["name"] == "INPUT__0" and cfg["input"][0]["dims"] == [-1, 1, 8, 8]
    assert cfg["output"][0]["name"] == "OUTPUT__0" and cfg["output"][0]["dims"] == [-1, 10]
    model_file = tmp_path / "repo" / name / "1" / "model.pt2"
    assert model_file.read_bytes() == pt2_artifacts["aoti"].read_bytes()
    assert_refused(
        cli,
        "package",
        pt2_artifacts["aoti"],
        "--format",
        "triton",
        "-o",
        "repo2",
        "--allow-pickle",
        "--batch-size",
        "4",
        match="torch_aoti platform does not batch requests",
        where=tmp_path,
    )


@pytest.mark.torchserve
@pytest.mark.skipif(torchserve_missing() is not None, reason=f"no TorchServe here: {torchserve_missing()}")
def test_real_torchserve_answers_from_pt2_archives(tmp_path, pt2_artifacts):
    from ptopt.serve.package import package
    from ptopt.serve.server import TorchServeServer

    aoti = package(pt2_artifacts["aoti"], "mar", tmp_path / "cnn_aoti.mar", allow_pickle=True, threads=1)
    ep = package(pt2_artifacts["ep"], "mar", tmp_path / "cnn_ep.mar", threads=1)
    assert aoti.extra["model_format"] == "aoti_package" and ep.extra["model_format"] == "exported_program"
    with zipfile.ZipFile(aoti.path) as z:  # served as is, no TorchScript in between
        assert z.read("cnn.aoti.pt2") == pt2_artifacts["aoti"].read_bytes()
    srv = TorchServeServer([aoti.path, ep.path])
    try:
        srv.start()
        x = _samples(3, seed=2)
        for model, src in (("cnn_aoti", "aoti"), ("cnn_ep", "ep")):
            code, body = srv.predict(x.tolist(), model=model)
            assert code == 200, body
            np.testing.assert_allclose(
                np.array(body["outputs"]), _want(pt2_artifacts[src], x), rtol=1e-4, atol=1e-4
            )
    finally:
        srv.stop()
