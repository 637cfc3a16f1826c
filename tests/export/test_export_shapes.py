"""One InputSpec → torch.export Dims, ONNX dim names, TensorRT Inputs, trtexec shapes (no export here)."""

from __future__ import annotations

import pytest

from ptopt.core.errors import MissingDependencyError, ShapeMismatchError, UsageError
from ptopt.core.inputspec import InputSpec
from ptopt.formats.shapes import (
    onnx_dim_names,
    parse_dynamic_batch,
    settle_specs,
    tensorrt_input_kwargs,
    torch_export_dynamic_shapes,
    trtexec_shapes,
)

IMG = [InputSpec.static("input", (2, 1, 8, 8))]
TOKENS = [
    InputSpec.static("input_ids", (1, 72), "int64", value_range=(1, 18)),
    InputSpec.static("attention_mask", (1, 72), "int64", value_range=(1, 2)),
]


def test_dynamic_batch_parses_and_checks_order():
    assert parse_dynamic_batch("1:8:64") == (1, 8, 64)
    assert parse_dynamic_batch("2:16") == (2, 2, 16)
    for bad, msg in (
        ("8:1:64", "min > opt"),
        ("1:80:64", "opt > max"),
        ("a:b", "MIN:OPT:MAX"),
        ("0:1:2", "positive"),
    ):
        with pytest.raises(UsageError, match=msg):
            parse_dynamic_batch(bad)


def test_dynamic_batch_applies_to_every_input():
    specs = settle_specs(TOKENS, dynamic_batch="1:8:64")
    assert [(s.min_shape, s.opt_shape, s.max_shape) for s in specs] == [((1, 72), (8, 72), (64, 72))] * 2
    assert specs[0].dtype == "int64" and specs[0].value_range == (1, 18)


def test_per_input_named_shapes_and_fill_in():
    specs = settle_specs(
        TOKENS,
        min_shape=["input_ids=1x16", "attention_mask=1x16"],
        opt_shape=["input_ids=4x32", "attention_mask=4x32"],
        max_shape=["input_ids=8x72", "attention_mask=8x72"],
    )
    assert specs[0] == InputSpec("input_ids", (1, 16), (4, 32), (8, 72), "int64", (1, 18))
    # --opt-shape alone is a static shape; an unnamed shape goes to the only input
    (s,) = settle_specs(IMG, opt_shape="4x1x8x8")
    assert s.min_shape == s.opt_shape == s.max_shape == (4, 1, 8, 8)
    (s,) = settle_specs(IMG, min_shape="1x1x8x8", max_shape=(16, 1, 8, 8))
    assert (s.min_shape, s.opt_shape, s.max_shape) == ((1, 1, 8, 8), (16, 1, 8, 8), (16, 1, 8, 8))


@pytest.mark.parametrize(
    "kw, err, msg",
    [
        (dict(min_shape="8x1x8x8", opt_shape="4x1x8x8"), UsageError, "min > opt"),
        (dict(opt_shape="8x1x8x8", max_shape="4x1x8x8"), UsageError, "opt > max"),
        (dict(opt_shape="1x8x8"), ShapeMismatchError, "rank 3, but the model takes rank 4"),
        (dict(opt_shape=["nope=1x8"]), UsageError, "no input 'nope'"),
        # no --opt-shape: the two shapes given are named (it said "min > opt", an opt never written)
        (
            dict(min_shape="1x1x16x16", max_shape="4x1x8x8"),
            UsageError,
            r"--min-shape 1x1x16x16 is larger than --max-shape 4x1x8x8 at dimension 2 \(16 > 8\)",
        ),
    ],
    ids=["min>opt", "opt>max", "rank", "unknown-name", "min>max-without-opt"],
)
def test_bad_shapes(kw, err, msg):
    with pytest.raises(err, match=msg):
        settle_specs(IMG, **kw)


def test_one_dim_shared_by_inputs_with_the_same_range():
    specs = settle_specs(
        TOKENS,
        min_shape=["input_ids=1x16", "attention_mask=1x16"],
        max_shape=["input_ids=8x72", "attention_mask=8x72"],
    )
    dyn = torch_export_dynamic_shapes(specs, "keyword")
    assert dyn["input_ids"][0] is dyn["attention_mask"][0] and dyn["input_ids"][1] is dyn["attention_mask"][1]
    assert dyn["input_ids"][0].__name__ == "batch"
    assert onnx_dim_names(specs) == {
        "input_ids": {0: "batch", 1: "dim1"},
        "attention_mask": {0: "batch", 1: "dim1"},
    }
    assert torch_export_dynamic_shapes(IMG) is None  # all static
    assert isinstance(torch_export_dynamic_shapes(settle_specs(IMG, dynamic_batch="1:2:4")), tuple)


def test_tensorrt_profile_and_trtexec_line():
    specs = settle_specs(IMG, dynamic_batch="1:8:64")
    assert tensorrt_input_kwargs(specs) == [
        {
            "min_shape": [1, 1, 8, 8],
            "opt_shape": [8, 1, 8, 8],
            "max_shape": [64, 1, 8, 8],
            "dtype": "float32",
            "name": "input",
        }
    ]
    assert trtexec_shapes(specs) == (
        "--minShapes=input:1x1x8x8 --optShapes=input:8x1x8x8 --maxShapes=input:64x1x8x8"
    )
    two = settle_specs(TOKENS, dynamic_batch="1:4:8")
    assert trtexec_shapes(two).split()[0] == "--minShapes=input_ids:1x72,attention_mask:1x72"


def test_the_graph_tensorrt_consumes_accepts_min_opt_max():
    """TensorRT compiles the ExportedProgram made with the specs' Dims: it must run at min/opt/max."""
    import torch

    from ptopt.core.inputspec import make_inputs
    from ptopt.formats.capture import export_program
    from tests.helpers import two_input

    model = two_input()
    specs = settle_specs(
        [
            InputSpec.static("input_ids", (2, 8), "int64", value_range=(0, 18)),
            InputSpec.static("attention_mask", (2, 8), "int64", value_range=(1, 2)),
        ],
        min_shape=["input_ids=1x4", "attention_mask=1x4"],
        opt_shape=["input_ids=4x8", "attention_mask=4x8"],
        max_shape=["input_ids=16x32", "attention_mask=16x32"],
    )
    gm = export_program(model, specs, "keyword").module()
    for which in ("min", "opt", "max"):
        x = make_inputs(specs, "keyword", which=which)
        torch.testing.assert_close(gm(**x), model(**x))


def _tensorrt_usable() -> bool:
    from ptopt.core.features import check_tensorrt

    return check_tensorrt().available


@pytest.mark.skipif(
    _tensorrt_usable(), reason="torch_tensorrt is usable here: the missing-dependency path can't run"
)
def test_tensorrt_missing_is_a_clear_exit_2_and_writes_nothing(cli, tmp_path, tiny_cnn_factory):
    from ptopt.export.api import export

    out = tmp_path / "m.ep"
    with pytest.raises(MissingDependencyError, match=r"pip install 'ptopt\[tensorrt\]'"):
        export(tiny_cnn_factory, "tensorrt", out)
    code, _, err = cli(
        "export", tiny_cnn_factory, "--target", "tensorrt", "--dynamic-batch", "1:8:64", "-o", out
    )
    assert code == 2 and "torch_tensorrt" in err and "ptopt[tensorrt]" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.tensorrt
@pytest.mark.skipif(not _tensorrt_usable(), reason="needs torch_tensorrt, TensorRT and a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_engine_with_dynamic_batch(tmp_path, tiny_cnn_factory, precision):
    from ptopt.export.api import export

    art = export(tiny_cnn_factory, "tensorrt", tmp_path / "m.ep", dynamic_batch="1:8:64", precision=precision)
    assert art.format == "tensorrt" and art.precision == precision and art.metrics["parity"]["passed"]


def test_export_takes_one_shape_string_or_a_tuple_per_bound(tmp_path):
    """The Python twin's shapes as a user writes them: a plain string per bound, or a tuple of ints
    (a str was once read character by character: 'bad shape x')."""
    import torch

    import ptopt

    m = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(72, 2)).eval()
    res = ptopt.export(m, "onnx", tmp_path / "m.onnx", min_shape="1x1x8x8", max_shape=(4, 1, 8, 8))
    (spec,) = res.inputs
    assert (spec.min_shape, spec.max_shape) == ((1, 1, 8, 8), (4, 1, 8, 8))


def test_cli_min_above_max_without_opt_names_the_shapes_given(cli, tmp_path, tiny_cnn_factory):
    out = tmp_path / "m.onnx"
    code, _, err = cli(
        "export", tiny_cnn_factory, "--target", "onnx", "--min-shape", "1x1x16x16", "--max-shape", "4x1x8x8",
        "-o", out,
    )  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert "--min-shape 1x1x16x16 is larger than --max-shape 4x1x8x8 at dimension 2 (16 > 8)" in err, err
    assert not out.exists()
