"""``ptopt.export`` in memory: an nn.Module in, ``.model`` (the checked artifact, reloaded) runs here,
``.save(path)`` writes exactly those files plus a sidecar whose sha256 matches."""

from __future__ import annotations

import json

import pytest
import torch

from ptopt.core.artifact import Artifact, sha256_file
from ptopt.core.errors import PtoptError, UsageError
from ptopt.core.inputspec import InputSpec
from tests.helpers import SUFFIX, assert_refused, tiny_cnn, two_input

TOKENS = [
    InputSpec("input_ids", (1, 4), (4, 8), (16, 32), "int64", (0, 18)),
    InputSpec("attention_mask", (1, 4), (4, 8), (16, 32), "int64", (1, 2)),
]


@pytest.mark.parametrize(
    "target, runs_as",
    [
        ("torchscript", torch.jit.ScriptModule),
        ("exported_program", torch.nn.Module),
        ("onnx", None),
    ],
    ids=["torchscript", "exported_program", "onnx"],
)
def test_module_in_model_runs_here_and_save_writes_file_and_sidecar(tmp_path, target, runs_as):
    import ptopt

    source = tiny_cnn().eval()
    res = ptopt.export(source, target, input_shapes="2x1x8x8")
    assert list(tmp_path.iterdir()) == []  # nothing written before save
    if runs_as is not None:
        assert isinstance(res.model, runs_as)
    x = torch.randn(5, 1, 8, 8)
    got = res.model(x)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, source(x), atol=1e-4, rtol=1e-4)
    assert res.metrics["parity"]["passed"] and res.format == target and res.precision == "fp32"
    assert res.inputs[0].min_shape == (1, 1, 8, 8) and res.inputs[0].max_shape == (64, 1, 8, 8)

    out = tmp_path / f"m{SUFFIX[target]}"
    art = res.save(out)
    side = json.loads((tmp_path / f"m{SUFFIX[target]}.ptopt.json").read_text())
    assert side["sha256"] == sha256_file(out) == art.sha256 == res.sha256
    assert side["format"] == target and side["config"]["target"] == target
    assert side["metrics"]["parity"]["passed"] and side["parent"]["path"] == "<TinyCNN>"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"m{SUFFIX[target]}",
        f"m{SUFFIX[target]}.ptopt.json",
    ]
    assert Artifact.load(out).size_bytes == out.stat().st_size


def test_saved_file_is_the_checked_one(tmp_path):
    """``.save`` copies the file that was checked (same bytes twice), it does not export again."""
    from ptopt.export.api import export

    res = export(tiny_cnn(), "torchscript", input_shapes="2x1x8x8")
    a, b = res.save(tmp_path / "a.pt"), res.save(tmp_path / "b.pt")
    assert a.sha256 == b.sha256 and a.path != b.path


def test_output_saves_and_the_result_falls_through_to_the_artifact(tmp_path):
    from ptopt.export.api import export

    res = export(tiny_cnn(), "onnx", tmp_path / "m.onnx", input_shapes=torch.randn(3, 1, 8, 8))
    assert res.path == tmp_path / "m.onnx" and res.sha256 == sha256_file(tmp_path / "m.onnx")
    assert res.extra["trtexec_shapes"].startswith("--minShapes=input:1x1x8x8")
    assert res.model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


@pytest.mark.parametrize(
    "shapes",
    [
        "4x1x8x8",
        ["4x1x8x8"],
        [InputSpec("input", (1, 1, 8, 8), (4, 1, 8, 8), (64, 1, 8, 8))],
        torch.randn(4, 1, 8, 8),
    ],
    ids=["string", "list", "specs", "tensor"],
)
def test_input_shapes_forms(shapes):
    from ptopt.export.api import export

    res = export(tiny_cnn(), "torchscript", input_shapes=shapes)
    (spec,) = res.inputs
    assert (spec.min_shape, spec.opt_shape, spec.max_shape) == ((1, 1, 8, 8), (4, 1, 8, 8), (64, 1, 8, 8))


@pytest.mark.parametrize(
    "data",
    [
        torch.randn(128, 1, 8, 8),
        [torch.randn(16, 1, 8, 8) for _ in range(8)],
        "loader",
    ],
    ids=["tensor", "batches", "dataloader"],
)
def test_in_memory_data_gives_shapes_and_calibration(data):
    from torch.utils.data import DataLoader, TensorDataset

    from ptopt.export.api import export

    if data == "loader":
        data = DataLoader(
            TensorDataset(torch.randn(128, 1, 8, 8), torch.randint(0, 10, (128,))), batch_size=16
        )
    # a module without example_inputs: the data tells the shapes; int8 ONNX calibrates on it, and the
    # parity check compares on it (128 samples cover the max batch, 64)
    body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10)).eval()
    res = export(body, "onnx", data=data, precision="int8")
    assert res.precision == "int8" and res.config["int8_method"] == "ort_static"
    assert res.config["calib_data"] is None  # in-memory data has no reference to record
    assert res.inputs[0].opt_shape[1:] == (1, 8, 8) and res.model(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_keyword_inputs_onnx_external_data_saved_under_another_name(tmp_path):
    import onnxruntime as ort

    from ptopt.export.api import export

    source = two_input().eval()
    res = export(source, "onnx", input_specs=TOKENS, external_data=True)
    x = {"input_ids": torch.randint(0, 18, (3, 20)), "attention_mask": torch.ones(3, 20, dtype=torch.long)}
    torch.testing.assert_close(res.model(**x), source(**x), atol=1e-4, rtol=1e-4)
    art = res.save(tmp_path / "renamed.onnx")
    assert art.files == ["renamed.onnx", "renamed.onnx.data"]
    sess = ort.InferenceSession(str(art.path))  # the .onnx points at its own .data
    got = sess.run(None, {k: v.numpy() for k, v in x.items()})[0]
    torch.testing.assert_close(torch.from_numpy(got), source(**x), atol=1e-4, rtol=1e-4)


def test_config_replaces_the_loose_options():
    from ptopt.export.api import ExportConfig, export

    cfg = ExportConfig(target="torchscript", script=True, atol=1e-3)
    res = export(tiny_cnn(), config=cfg, input_shapes="2x1x8x8")
    assert res.extra["method"] == "torch.jit.script" and res.metrics["parity"]["atol"] == 1e-3
    assert res.config["script"] is True and res.config["target"] == "torchscript"
    # an agreeing loose option is fine; a contradicting one is refused
    assert (
        export(tiny_cnn(), "torchscript", config=cfg, script=True, input_shapes="2x1x8x8").format
        == "torchscript"
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(target="onnx"), "target 'onnx' contradicts the config's target 'torchscript'"),
        (dict(script=False), "script=False contradicts the given ExportConfig (script=True)"),
        (dict(atol=1e-2), "atol=0.01 contradicts"),
        (dict(config={"target": "onnx"}), "config must be an ExportConfig"),
    ],
    ids=["target", "script", "atol", "not-a-config"],
)
def test_config_plus_contradicting_option_is_refused(tmp_path, kwargs, message):
    from ptopt.export.api import ExportConfig, export

    kwargs.setdefault("config", ExportConfig(target="torchscript", script=True))
    assert_refused(
        export, tiny_cnn(), input_shapes="2x1x8x8", **kwargs, match=message, where=tmp_path, error=UsageError
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(target="torchscript", precision="int8"), "not available for --target torchscript"),
        (dict(target="onnx", precision="bf8"), "unknown precision 'bf8'"),
        (dict(target="onnx", int8_method="magic"), "unknown int8 ONNX method"),
        (dict(target="onnx", opset=0), "--opset is an ONNX opset, 7 or later"),
        (dict(target="onnx", atol=-1.0), "atol must be >= 0"),
    ],
    ids=["precision-target", "precision", "int8-method", "opset", "atol"],
)
def test_config_validates_itself(kwargs, message):
    from ptopt.export.api import ExportConfig

    with pytest.raises(UsageError, match=message):
        ExportConfig(**kwargs)


def test_parity_failure_in_memory_writes_nothing(tmp_path):
    from ptopt.core.errors import ParityError
    from ptopt.export.api import export
    from tests.export.export_models import batch_baked

    msg = assert_refused(
        export, batch_baked(), "torchscript", dynamic_batch="1:2:8", where=tmp_path, error=ParityError
    )
    assert "drifts from its source" in msg and ".failed" not in msg


def test_an_exported_program_file_exports_again(tmp_path):
    """A .pt2 source (its module cannot switch train/eval) goes to every other target."""
    from ptopt.export.api import export

    src = export("tests.helpers:tiny_cnn", "exported_program", tmp_path / "a.pt2", dynamic_batch="1:2:8")
    for target in ("onnx", "torchscript"):
        res = export(src.path, target)
        assert res.metrics["parity"]["passed"] and res.parent["path"] == str(src.path)


def test_a_stage_result_exports_in_memory_int8_onnx_from_its_fp32_source(tmp_path):
    """quantize -> export without files in between: ORT quantizes the fp32 model the int8 Result was
    made from, held in memory (no parent file to reload; an unsaved fp32 parent has none)."""
    import ptopt

    x = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    q = ptopt.quantize(tiny_cnn().eval(), "static", calib_data=x, progress=False)
    res = ptopt.export(q, "onnx", data=x)
    assert res.precision == "int8" and res.extra["int8_method"] == "ort_static"
    out = res.model(x[:4])
    assert out.shape == (4, 10) and torch.isfinite(out).all()
    art = res.save(tmp_path / "q.onnx")
    assert art.config["precision"] == "int8" and not list(tmp_path.glob("*.pt"))
    # without a Result, an int8 file whose fp32 parent was never saved says so in one line
    q.save(tmp_path / "q.pt")
    with pytest.raises(PtoptError, match="parent"):
        ptopt.export(tmp_path / "q.pt", "onnx", tmp_path / "q2.onnx", data=x)


def test_progress_goes_where_the_twin_is_told(monkeypatch):
    """``progress=`` as every Python twin takes it (docs/reference.md): a callable gets the plain lines,
    ``False`` mutes them (it was refused: "export() takes no option progress="). Seen from inside the
    export, where its steps report (a fast export's steps end before any heartbeat)."""
    import ptopt
    from ptopt.core import progress
    from ptopt.export import api

    seen = []
    saved = api._saved
    monkeypatch.setattr(api, "_saved", lambda *a: (seen.append(progress._current()), saved(*a))[1])
    lines: list[str] = []
    ptopt.export(torch.nn.Linear(4, 2), "onnx", input_shapes="1x4", progress=lines.append)
    ptopt.export(torch.nn.Linear(4, 2), "onnx", input_shapes="1x4", progress=False)
    assert seen[0] is not None and seen[0].write == lines.append and seen[1] is None


def test_an_unsaved_result_goes_away_quietly_with_its_folder(tmp_path, monkeypatch):
    """An export nobody saves is collected with its temporary folder, and says nothing: the folder was a
    TemporaryDirectory, whose collection warns ``ResourceWarning: Implicitly cleaning up`` (seen with
    ``python -W default``), though nothing leaked (``core.atomic.ScratchDir``)."""
    import gc
    import tempfile
    import warnings

    import ptopt

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    res = ptopt.export(tiny_cnn(), target="onnx", input_shapes="1x1x8x8")
    (folder,) = tmp_path.glob("ptopt-export-*")
    assert (folder / "model.onnx").is_file()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del res
        gc.collect()
    assert not folder.exists()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)], [str(w.message) for w in seen]
