"""``--static-batch``: fixed-batch models compiled into the same AOTInductor package beside the
dynamic-batch one (Inductor prepacks convolution weights only at a fixed batch), each checked at its
batch, picked by ptopt's loaders for a batch of exactly that size; plain torch still loads the
dynamic model by default, and each fixed one by name."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import assert_refused, tiny_cnn


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """``ptopt export tests.helpers:tiny_cnn --target aoti --dynamic-batch 1:2:8 --static-batch 4``
    through the CLI (two compiles: ~25 s here)."""
    from click.testing import CliRunner

    from ptopt.cli.main import cli

    out = tmp_path_factory.mktemp("aoti-static") / "tiny.pt2"
    args = ["export", "tests.helpers:tiny_cnn", "--target", "aoti", "--dynamic-batch", "1:2:8"]
    res = CliRunner().invoke(cli, [*args, "--static-batch", "4", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_cli_records_and_checks_each_fixed_batch(package):
    path, stdout = package
    side = json.loads(path.with_name(path.name + ".ptopt.json").read_text())
    assert side["extra"]["static_batches"] == [4]
    fixed = side["metrics"]["parity"]["static_batches"]
    assert list(fixed) == ["4"] and fixed["4"]["passed"] and fixed["4"]["cosine"] > 0.9999
    assert "fixed:   batch-size models 4 (cosine" in stdout
    from ptopt.formats.aoti_files import package_models

    assert package_models(path) == ["batch_4", "model"]


def test_loader_runs_a_batch_of_four_on_the_fixed_model(package):
    from ptopt.formats.aoti_files import FixedBatchDispatch, load_package

    path, _ = package
    model = load_package(path)
    assert isinstance(model, FixedBatchDispatch) and set(model.fixed) == {4}
    calls = []
    fixed = model.fixed[4]
    model.fixed[4] = lambda *a: calls.append(a[0].shape[0]) or fixed(*a)
    src = tiny_cnn().eval()
    for b in (3, 4, 8):
        x = torch.randn(b, 1, 8, 8, generator=torch.Generator().manual_seed(b))
        with torch.no_grad():
            torch.testing.assert_close(model(x), src(x), rtol=1e-4, atol=1e-5)
    assert calls == [4]  # only the batch of 4 ran on the fixed-batch model


def test_plain_torch_loads_the_dynamic_model_and_the_fixed_one_by_name(package):
    from torch._inductor.package import load_package

    path, _ = package
    dynamic = torch._inductor.aoti_load_package(str(path))
    assert dynamic(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    assert load_package(str(path), "batch_4")(torch.randn(4, 1, 8, 8)).shape == (4, 10)


def test_the_child_load_check_loads_every_model_of_the_package(package, monkeypatch, tmp_path):
    """Under an untested torch the child process loads the default model and each fixed-batch one: it is
    given their names (here it only records its arguments)."""
    from ptopt.formats import aoti_files

    record = tmp_path / "argv.txt"
    monkeypatch.setenv(aoti_files.LOAD_CHECK_ENV, "1")
    monkeypatch.setattr(aoti_files, "_LOADS_SAFELY", {})
    script = f"import sys, pathlib; pathlib.Path({str(record)!r}).write_text(' '.join(sys.argv[1:]))"
    monkeypatch.setattr(aoti_files, "CHILD_LOAD", script)
    path, _ = package
    aoti_files.check_loads_in_child(path, -1)
    assert record.read_text() == f"{path} -1 batch_4" and len(aoti_files._LOADS_SAFELY) == 1


def test_the_container_runner_loads_every_model_of_the_package(package, monkeypatch):
    """``PTOPT_AOTI_LOADER=container``: the dynamic model and the fixed-batch one run through torch's
    model-container runner, each the same as through torch's package loader."""
    from ptopt.formats import aoti_files
    from ptopt.formats.aoti_container import ContainerModel

    monkeypatch.setenv(aoti_files.LOADER_ENV, "container")
    path, _ = package
    model = aoti_files.load_package(path)
    assert isinstance(model.default, ContainerModel) and set(model.fixed) == {4}
    for batch in (4, 5):
        x = torch.randn(batch, 1, 8, 8)
        torch.testing.assert_close(model(x), torch._inductor.aoti_load_package(str(path))(x))


def test_handler_dispatches_by_batch():
    from ptopt.serve.handler import _by_batch

    run = _by_batch(lambda x: ("dynamic", x.shape[0]), {4: lambda x: ("fixed", x.shape[0])})
    assert run(torch.zeros(4, 2)) == ("fixed", 4) and run(torch.zeros(3, 2)) == ("dynamic", 3)
    assert run(x=torch.zeros(4, 2)) == ("fixed", 4)


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--static-batch", "16"], ("--static-batch 16", "[1, 8]")),
        (["--static-batch", "two"], ("integers",)),
        (["--static-batch", "0"], ("positive",)),
    ],
    ids=["outside-range", "not-a-number", "zero"],
)
def test_bad_static_batches_refused(cli, tmp_path, extra, match):
    args = ["export", "tests.helpers:tiny_cnn", "--target", "aoti", "--dynamic-batch", "1:2:8"]
    assert_refused(cli, *args, *extra, "-o", tmp_path / "m.pt2", match=match, where=tmp_path)


def test_static_batch_is_for_aoti_only(tmp_path):
    import ptopt

    assert_refused(
        ptopt.export,
        tiny_cnn(),
        "onnx",
        tmp_path / "m.onnx",
        input_shapes="2x1x8x8",
        static_batches="4",
        match=("--static-batch applies to --target aoti",),
        where=tmp_path,
    )


def test_bf16_package_checks_its_fixed_batch_in_bf16(tmp_path):
    import ptopt

    res = ptopt.export(
        tiny_cnn(), "aoti", tmp_path / "h.pt2", input_shapes="2x1x8x8", dynamic_batch="1:2:8",
        static_batches=4, precision="bf16",
    )  # fmt: skip
    assert res.metrics["parity"]["static_batches"]["4"]["passed"]
    assert res.model(torch.randn(4, 1, 8, 8).bfloat16()).dtype == torch.bfloat16


def test_static_batch_options_compare_as_sets_of_sizes():
    from ptopt.export.config import ExportConfig, settle_config

    assert ExportConfig(target="aoti", static_batches=4).static_batches == (4,)
    config = ExportConfig(target="aoti", static_batches="32,1")
    assert (
        settle_config(None, config, {"static_batches": [1, 32]}) is not None
    )  # the same sizes: no contradiction


def test_dispatch_copes_with_scalars_and_copies():
    import copy

    from ptopt.formats.aoti_files import FixedBatchDispatch, static_model_batch, static_model_name

    assert static_model_batch(static_model_name(32)) == 32
    assert static_model_batch("batch_x") is None and static_model_batch("model") is None
    d = FixedBatchDispatch(lambda *a: "dynamic", {2: lambda *a: "fixed"})
    assert d(torch.tensor(1.0), torch.zeros(2, 3)) == "fixed"  # a 0-d tensor has no batch: skipped
    assert d(torch.tensor(1.0)) == "dynamic"
    assert copy.copy(d)(torch.zeros(2, 3)) == "fixed"


def test_torchserve_handler_agrees_with_the_format_table(package):
    """The TorchServe handler keeps a self-contained copy of the loaders (it runs without ptopt): it
    loads exactly the formats the table says TorchServe serves, names fixed-batch models as the
    AOTInductor row does, and its package loader gives the row's outputs, batch for batch."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.formats import get_format
    from ptopt.formats.aoti_files import static_model_batch, static_model_name
    from ptopt.serve import handler
    from ptopt.serve.package import servable_formats

    assert set(handler.LOADED_FORMATS) == set(servable_formats("mar"))
    assert all(handler.STATIC_MODEL.format(b) == static_model_name(b) for b in (1, 4, 32))
    assert static_model_batch(handler.STATIC_MODEL.format(7)) == 7
    path, _ = package
    meta = Artifact.load(path).to_dict()
    ours = handler._load_torch(str(path), "aoti_package", meta)
    table = get_format("aoti_package").reload(path)
    for b in (3, 4):
        x = torch.randn(b, 1, 8, 8, generator=torch.Generator().manual_seed(b))
        with torch.no_grad():
            torch.testing.assert_close(ours(x), table(x), rtol=0, atol=0)
