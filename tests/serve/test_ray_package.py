"""``ptopt package --format ray``: a folder a Ray cluster serves without ptopt's CLI (its Serve config,
application file, manifest and the artifact with its sidecar); the language-model folders as they are;
bad input refused before anything is written. Serving the folder: ``test_ray_serve.py``."""

from __future__ import annotations

import json

import pytest
import yaml

import ptopt
from ptopt.core.artifact import Artifact
from ptopt.core.errors import ModelLoadError, UsageError
from tests.helpers import assert_refused
from tests.serve.conftest import ray_banner


def test_cli_writes_the_folder(cli, serve_artifacts, tmp_path):
    args = ("package", serve_artifacts["onnx"], "--format", "ray", "-o", tmp_path / "out", "--replicas", "3",
            "--max-batch-size", "16", "--batch-wait-ms", "2", "--cpus-per-replica", "0.5", "--threads", "2")  # fmt: skip
    code, out, err = cli(*args)
    assert code == 0, err
    assert "ray of an onnx fp32 model, served as 'cnn'" in out
    assert "batching: up to 16 row(s), 2 ms wait; 3 replica(s) x 0.5 CPU" in out
    assert f"serve it: serve run {tmp_path / 'out'}/serve_config.yaml" in out
    folder = tmp_path / "out"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == ["model/cnn/cnn.onnx", "model/cnn/cnn.onnx.data", "model/cnn/cnn.onnx.ptopt.json",
                     "ptopt_ray.json", "ptopt_ray_app.py", "serve_config.yaml"]  # fmt: skip
    man = json.loads((folder / "ptopt_ray.json").read_text())
    assert (
        man["replicas"] == 3
        and man["threads"] == 2
        and man["max_batch_size"] == 16
        and man["cpus_per_replica"] == 0.5
    )
    (model,) = man["models"]
    assert (
        model["format"] == "onnx"
        and model["kind"] == "tensor"
        and model["inputs"][0]["max_shape"] == [64, 1, 8, 8]
    )
    # the copied model keeps a trusted sidecar (its sha256 is the copy's): the replicas load it as ptopt wrote it
    assert Artifact.load(folder / "model/cnn/cnn.onnx").format == "onnx"
    config = yaml.safe_load((folder / "serve_config.yaml").read_text())
    (app,) = config["applications"]
    assert (
        app["import_path"] == "ptopt_ray_app:app"
        and app["runtime_env"]["working_dir"] == f"local://{folder.resolve()}"
    )
    deps = {d["name"]: d for d in app["deployments"]}
    assert deps["model_cnn"]["num_replicas"] == 3 and deps["model_cnn"]["ray_actor_options"] == {
        "num_cpus": 0.5
    }
    assert deps["ingress"]["ray_actor_options"] == {"num_cpus": 0}
    # a deleted replica looks for its last requests every 0.2 s, not Serve's 2 s (the least a stop took)
    assert (
        deps["ingress"]["graceful_shutdown_wait_loop_s"]
        == deps["model_cnn"]["graceful_shutdown_wait_loop_s"]
        == 0.2
    )
    assert config["http_options"]["host"] == "127.0.0.1"
    # Serve's per-request access lines are off (proxy and replicas; --access-log turns them on)
    assert (
        config["logging_config"]
        == app["logging_config"]
        == {"enable_access_log": False, "log_level": "WARNING"}
    )
    side = Artifact.load(folder)
    assert side.format == "ray" and side.extra["models"] == ["cnn"] and side.config["replicas"] == 3


def test_api_language_model_folder_as_it_is(serve_lm_int8, tmp_path):
    serve_lm = serve_lm_int8.parent
    art = ptopt.package(serve_lm / "llama.int8", "ray", tmp_path / "lm", max_tokens=32)
    man = json.loads((art.path / "ptopt_ray.json").read_text())
    (model,) = man["models"]
    assert (
        model["kind"] == "text"
        and model["format"] == "hf_weight_only"
        and model["path"] == "model/llama/llama.int8"
    )
    assert man["max_tokens"] == 32 and man["config"]["max_tokens"] == 32
    copied = sorted(p.name for p in (art.path / "model/llama/llama.int8").iterdir())
    assert copied == sorted(p.name for p in (serve_lm / "llama.int8").iterdir())


def test_autoscaling_in_the_config(serve_artifacts, tmp_path):
    art = ptopt.package(
        serve_artifacts["fp32"],
        "ray",
        tmp_path / "a",
        autoscale="0:4",
        target_ongoing_requests=1,
        access_log=True,
    )
    dep = [d for d in yaml.safe_load((art.path / "serve_config.yaml").read_text())["applications"][0]["deployments"]
           if d["name"] == "model_cnn"][0]  # fmt: skip
    assert dep["autoscaling_config"] == {"min_replicas": 0, "max_replicas": 4, "target_ongoing_requests": 1.0}
    assert "num_replicas" not in dep
    config = yaml.safe_load((art.path / "serve_config.yaml").read_text())
    assert config["applications"][0]["logging_config"]["enable_access_log"] is True
    # serving the folder imports its application file: a changed one is refused before Ray starts
    from ptopt.serve.ray_server import RayServer

    app_file = art.path / "ptopt_ray_app.py"
    app_file.write_text(app_file.read_text() + "\nimport os  # anything\n")
    assert_refused(RayServer, art.path, match="is not what ptopt package writes", error=UsageError)


@pytest.mark.parametrize(
    "args, words",
    [
        (("--workers", "2"), "--workers applies to --format mar, triton, not --format ray"),
        (("--batch-size", "4"), "--batch-size applies to --format mar, triton, not --format ray"),
        (("--max-batch-size", "128"), "--max-batch-size 128 is larger than the model's max batch 64"),
        (("--autoscale", "2"), "--autoscale 2: give MIN:MAX"),
        (("--batch-wait-ms", "-1"), "--batch-wait-ms -1.0: must be between 0 and 60000"),
    ],
    ids=["workers", "batch-size", "over-max-batch", "autoscale", "wait"],
)
def test_bad_options_are_refused(cli, serve_artifacts, tmp_path, args, words):
    assert_refused(
        cli,
        "package",
        serve_artifacts["fp32"],
        "--format",
        "ray",
        "-o",
        tmp_path / "o",
        *args,
        match=words,
        where=tmp_path,
    )


def test_ray_options_only_for_ray_and_an_existing_folder_is_not_overwritten(cli, serve_artifacts, tmp_path):
    assert_refused(cli, "package", serve_artifacts["fp32"], "--format", "mar", "-o", tmp_path / "m.mar", "--replicas", "2",
                   match="--replicas applies to --format ray, not --format mar", where=tmp_path)  # fmt: skip
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    assert_refused(
        ptopt.package,
        serve_artifacts["fp32"],
        "ray",
        tmp_path / "busy",
        match="exists and is not empty",
        error=UsageError,
    )
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"


def test_language_model_without_tokenizer_is_refused(serve_lm, tmp_path):
    assert_refused(
        ptopt.package,
        serve_lm / "bare",
        "ray",
        tmp_path / "o",
        match="has no tokenizer",
        error=ModelLoadError,
        where=tmp_path,
    )


@pytest.mark.parametrize(
    "entry, allow, words, error",
    [
        (
            {"name": "m", "path": "m.pt2", "allow_pickle": True},
            False,
            "was packaged with --allow-pickle",
            "usage",
        ),
        ({"name": "m", "path": "../../etc/passwd"}, True, "points outside the package", "load"),
        ({"name": "m"}, True, "has no name or path", "load"),
        ({"name": "m", "path": "m.onnx", "tokenizer": "../../tok"}, True, "tokenizer points outside", "load"),
        (
            {"name": "m", "path": "m.onnx", "tokenizer": "tok"},
            True,
            "tokenizer (tok) holds no tokenizer",
            "load",
        ),
        (
            {"name": "m", "path": "m.onnx", "pooling": {"modes": ["mean_tokens", "x"]}},
            True,
            "pooling is not one",
            "load",
        ),
        ({"name": "m", "path": "m.onnx", "labels": [1, 2]}, True, "labels are not a list of names", "load"),
    ],
    ids=[
        "pickle-needs-the-flag",
        "path-outside",
        "no-path",
        "tokenizer-outside",
        "no-tokenizer",
        "pooling",
        "labels",
    ],
)
def test_a_handed_package_folder_is_checked_before_ray_starts(tmp_path, entry, allow, words, error):
    """A package folder from elsewhere: its manifest's word does not allow pickles (this command's
    --allow-pickle does), and its models' paths stay inside it; refused before any Ray process."""
    import json

    from ptopt.core.errors import ModelLoadError, UsageError
    from ptopt.serve.ray_package import MANIFEST, SCHEMA
    from ptopt.serve.ray_server import RayServer

    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / MANIFEST).write_text(json.dumps({"schema": SCHEMA, "models": [entry]}))
    err = UsageError if error == "usage" else ModelLoadError
    assert_refused(RayServer, folder, allow_pickle=allow, match=words, error=err)


def test_a_language_model_is_not_described_as_batched(cli, serve_lm, tmp_path, capsys):
    """A language model generates one prompt at a time (the ingress never batches text), so neither
    ``ptopt package --format ray`` nor ``ptopt serve``'s banner may promise "batching: up to 4 row(s)"
    for one; both did when --max-batch-size was given."""
    code, out, err = cli(
        "package", serve_lm / "llama", "--format", "ray", "-o", tmp_path / "lm", "--max-batch-size", "4"
    )
    assert code == 0, err
    assert "batching: none (a language model generates one prompt at a time)" in out and "row(s)" not in out

    banner = ray_banner(serve_lm / "llama", capsys, max_batch_size=4)
    assert "no batching" in banner and "batches up to" not in banner, banner
