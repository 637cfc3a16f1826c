"""The in-memory Python API: nn.Modules and in-memory data in, a Result out (``.model`` runs here,
``.metrics`` before any save, ``.save(path)`` writes the artifact and its sidecar); bad input gives the
CLI's typed errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import ptopt
from ptopt.core.artifact import Artifact, sidecar_path
from ptopt.core.errors import DataError, ShapeMismatchError, UnsupportedModelError, UsageError
from tests.helpers import assert_refused, tiny_cnn


@pytest.fixture(scope="module")
def digits():
    from ptopt.core.data import load_data

    train = load_data("builtin:digits:train").take(256)
    test = load_data("builtin:digits:test").take(128)
    return train.x, train.y, test.x, test.y


def _jit_load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))


def _saved(res, path: Path) -> Artifact:
    art = res.save(path)
    assert path.is_file() and sidecar_path(path).is_file()
    assert Artifact.load(path).sha256 == art.sha256 == res.sha256
    return art


# -- quantize ----------------------------------------------------------------------------------------


def test_quantize_static_from_a_tensor(digits, tmp_path: Path) -> None:
    x, _, tx, ty = digits
    model = tiny_cnn()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = ptopt.quantize(model, "static", calib_data=x, eval_data=(tx, ty), progress=False)
    assert res.artifact is None and list(tmp_path.iterdir()) == []  # nothing written without output
    assert res.precision == "int8" and res.extra["calibration"]["samples"] == 256
    assert {"int8_accuracy", "fp32_torchscript_bytes", "size_ratio_vs_fp32_torchscript"} <= set(res.metrics)
    assert res.config["mode"] == "static" and "calib_data" not in res.config  # in-memory: no reference
    out = res.model(tx[:5])
    assert out.shape == (5, 10)
    with torch.no_grad():
        assert (out.argmax(-1) == model(tx[:5]).argmax(-1)).float().mean() >= 0.6
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # model untouched
    art = _saved(res, tmp_path / "model.int8.pt")
    assert art.metrics["size_ratio_vs_fp32_torchscript"] == res.metrics["size_ratio_vs_fp32_torchscript"]
    assert torch.equal(_jit_load(tmp_path / "model.int8.pt")(tx[:5]), out)


def test_quantize_dynamic_with_a_list_of_batches(digits, tmp_path: Path) -> None:
    from tests.compress.quant_models import tiny_lstm

    _, _, tx, ty = digits
    seq = tx  # N×1×8×8, read as 8 rows of 8 pixels
    batches = [(seq[i : i + 32], ty[i : i + 32]) for i in range(0, 128, 32)]
    res = ptopt.quantize(tiny_lstm(), "dynamic", eval_data=batches, output=tmp_path / "l.pt", progress=False)
    assert res.artifact is not None and res.path == tmp_path / "l.pt"
    assert res.metrics["eval_samples"] == 128 and "int8_accuracy" in res.metrics
    assert res.model(seq[:3]).shape == (3, 10)


def test_quantize_qat_from_a_dataloader(digits) -> None:
    x, y, _, _ = digits
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=False)
    res = ptopt.quantize(tiny_cnn(), "qat", train_data=loader, epochs=1, progress=False)
    assert res.extra["training"]["samples"] == 256 and res.extra["training"]["loss"] == "cross_entropy"
    assert res.model(x[:2]).shape == (2, 10)


def test_quantize_config_replaces_loose_options(digits) -> None:
    from ptopt.compress.quantize import StaticQuantConfig

    x = digits[0]
    cfg = StaticQuantConfig(observer="minmax", calibration_batches=2)
    res = ptopt.quantize(tiny_cnn(), config=cfg, calib_data=x, observer="min-max", progress=False)
    assert res.config["observer"] == "minmax" and res.config["calibration_batches"] == 2


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"observer": "histogram"}, "observer='histogram' contradicts the given StaticQuantConfig"),
        ({"backend": "qnnpack"}, "backend='qnnpack' contradicts"),
        ({"exclude": ["fc"]}, "float_modules=('fc',) contradicts"),
        ({"epochs": 2}, "--epochs applies to --mode qat, not --mode static"),
        ({"mode": "dynamic"}, "mode 'dynamic' contradicts"),
    ],
    ids=["observer", "backend", "exclude", "other-mode-option", "mode"],
)
def test_quantize_config_contradicted(digits, tmp_path: Path, options: dict, needle: str) -> None:
    from ptopt.compress.quantize import StaticQuantConfig

    cfg = StaticQuantConfig(observer="minmax")
    assert_refused(
        ptopt.quantize,
        tiny_cnn(),
        config=cfg,
        calib_data=digits[0],
        output=tmp_path / "q.pt",
        match=needle,
        where=tmp_path,
        error=UsageError,
        **options,
    )


# -- prune -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["l1-unstructured", "global", "structured"])
def test_prune_an_nn_module(digits, tmp_path: Path, method: str) -> None:
    x, y, tx, ty = digits
    model = tiny_cnn()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    structured = {"prune_first_last": True} if method == "structured" else {}
    pr = ptopt.prune(model, method, 0.5, input_shapes=("1x1x8x8",), eval_data=[(tx, ty)], **structured)
    assert isinstance(pr.model, torch.nn.Module) and not pr.model.training
    assert pr.model(x[:4]).shape == (4, 10)
    assert {"parameters_before", "accuracy_after", "weights_gzip_bytes_after"} <= set(pr.metrics)
    if method == "structured":
        assert pr.metrics["parameters_after"] < pr.metrics["parameters_before"]
    else:
        assert pr.metrics["nonzero_parameters_after"] < pr.metrics["parameters_before"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # model untouched
    art = _saved(pr, tmp_path / "p.pt2")
    assert art.format == "exported_program" and art.precision == pr.precision
    m = torch.export.load(str(tmp_path / "p.pt2")).module()
    torch.testing.assert_close(m(x[:3]), pr.model(x[:3]), rtol=1e-4, atol=1e-4)


def test_prune_fine_tunes_on_a_dataloader(digits) -> None:
    x, y, _, _ = digits
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    pr = ptopt.prune(tiny_cnn(), "structured", 0.25, fine_tune_data=loader, epochs=1, prune_first_last=True)
    assert len(pr.extra["fine_tune_history"]) == 1 and pr.config["fine_tune_data"] == "<DataLoader>"


def test_prune_config_and_contradiction(tmp_path: Path) -> None:
    from ptopt.compress.prune import StructuredPruneConfig

    cfg = StructuredPruneConfig(amount=0.5, criterion="l2", prune_first_last=True)
    pr = ptopt.prune(tiny_cnn(), config=cfg, input_shapes=("1x1x8x8",))
    assert pr.config["criterion"] == "l2" and pr.extra["method"] == "structured"
    for options, needle in (
        ({"amount": 0.25}, "amount=0.25 contradicts the given StructuredPruneConfig"),
        ({"method": "global"}, "method 'global' contradicts"),
        ({"criterion": "l1"}, "criterion='l1' contradicts"),
    ):
        assert_refused(
            ptopt.prune,
            tiny_cnn(),
            config=cfg,
            output=tmp_path / "p.pt",
            input_shapes=("1x1x8x8",),
            match=needle,
            where=tmp_path,
            error=UsageError,
            **options,
        )


# -- distill -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["pair", "batches", "dataloader"])
def test_distill_from_in_memory_data(digits, tmp_path: Path, form: str) -> None:
    from tests.compress.distill_helpers import tiny_student

    x, y, tx, ty = digits
    data = {
        "pair": (x, y),
        "batches": [(x[i : i + 64], y[i : i + 64]) for i in range(0, 256, 64)],
        "dataloader": DataLoader(TensorDataset(x, y), batch_size=50),
    }[form]
    student = tiny_student()
    res = ptopt.distill(tiny_cnn(), student, data, eval_data=(tx, ty), epochs=1, progress=False)
    assert res.model is student and not student.training  # trained in place, in eval mode
    assert res.metrics["eval_accuracy"] is not None and res.metrics["student_parameters"] > 0
    assert res.model(tx[:2]).shape == (2, 10)
    art = _saved(res, tmp_path / "s.pt")
    assert art.format == "torchscript" and art.config["train"]["epochs"] == 1
    torch.testing.assert_close(_jit_load(tmp_path / "s.pt")(tx[:3]), student(tx[:3]))


def test_distill_configs_are_one_source_of_truth(digits, tmp_path: Path) -> None:
    from ptopt.compress.distill import DistillConfig
    from ptopt.compress.trainer import TrainConfig
    from tests.compress.distill_helpers import tiny_student

    x, y = digits[0][:64], digits[1][:64]
    for options, needle in (
        ({"config": DistillConfig(temperature=2.0), "temperature": 4.0}, "temperature=4.0 contradicts"),
        ({"train_config": TrainConfig(epochs=1), "epochs": 3}, "epochs=3 contradicts the given TrainConfig"),
    ):
        assert_refused(
            ptopt.distill,
            tiny_cnn(),
            tiny_student(),
            (x, y),
            output=tmp_path / "s.pt",
            match=needle,
            where=tmp_path,
            error=UsageError,
            **options,
        )


# -- bad input through the Python API: the CLI's typed errors, nothing written -----------------------


def _nan_calib():
    x = torch.rand(16, 1, 8, 8)
    x[3, 0, 2, 2] = float("nan")
    return x


def _bad_input_cases():
    from tests.compress.quant_models import untraceable

    wrong = torch.rand(8, 3, 32, 32)
    labels = torch.zeros(8, dtype=torch.long)
    q, p, d = ptopt.quantize, ptopt.prune, ptopt.distill
    no_fc = {"input_shapes": ("1x3x32x32",)}
    nan_ft = {"fine_tune_data": [_nan_calib()], "epochs": 1, "teacher": "self"}
    return [
        (q, (tiny_cnn(), "static"), {"calib_data": wrong}, ShapeMismatchError, "expected"),
        (q, (tiny_cnn(), "static"), {"calib_data": _nan_calib()}, DataError, "NaN/Inf"),
        (q, (untraceable(), "static"), {"calib_data": torch.rand(8, 1, 8, 8)}, UnsupportedModelError, "gate"),
        (q, (tiny_cnn(), "static"), {"calib_data": "not data"}, DataError, "no such file"),
        (q, (tiny_cnn(), "static"), {"calib_data": 3}, DataError, "a torch Dataset or DataLoader"),
        (
            p,
            (tiny_cnn(), "structured", 0.5),
            {"eval_data": (wrong, labels)},
            ShapeMismatchError,
            "does not fit",
        ),
        (p, (tiny_cnn(), "l1-unstructured", 0.5), no_fc, ShapeMismatchError, "sample input"),
        (p, (tiny_cnn(), "l1-unstructured", 0.5), nan_ft, DataError, "NaN/Inf"),
        (d, (tiny_cnn(), tiny_cnn(), (wrong, labels)), {}, ShapeMismatchError, "does not fit"),
        (d, (tiny_cnn(), tiny_cnn(), _nan_calib()), {"alpha": 0.0}, DataError, "NaN/Inf"),
    ]


@pytest.mark.parametrize(
    "case",
    range(10),
    ids=[
        "quantize-wrong-shape",
        "quantize-nan",
        "quantize-untraceable",
        "quantize-missing-file",
        "quantize-not-data",
        "prune-wrong-shape",
        "prune-wrong-input-shape",
        "prune-nan",
        "distill-wrong-shape",
        "distill-nan",
    ],
)
def test_bad_input_through_the_python_api(tmp_path: Path, case: int) -> None:
    fn, args, kwargs, error, needle = _bad_input_cases()[case]
    out = tmp_path / "out.pt"
    assert_refused(fn, *args, output=out, **kwargs, match=needle, where=tmp_path, error=error)


def test_untraceable_module_refused_by_structured_pruning(tmp_path: Path) -> None:
    from tests.compress.quant_models import untraceable

    assert_refused(
        ptopt.prune,
        untraceable(),
        "structured",
        0.5,
        output=tmp_path / "p.pt",
        input_shapes=("1x1x8x8",),
        where=tmp_path,
        error=UnsupportedModelError,
    )
