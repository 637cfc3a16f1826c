import pytest
import torch

from ptopt.core.errors import ShapeMismatchError, UsageError
from ptopt.core.inputspec import (
    InputSpec,
    check_inputs,
    make_inputs,
    parse_named_shapes,
    parse_shape,
    specs_from_example,
)
from tests.helpers import assert_refused


@pytest.mark.parametrize("text,shape", [("1x1x32x32", (1, 1, 32, 32)), ("8,3", (8, 3)), (" 4X7 ", (4, 7))])
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "1xax3", "0x3", "-1x3"], ids=["empty", "letter", "zero", "negative"])
def test_parse_shape_rejects(tmp_path, text):
    assert_refused(parse_shape, text, match=repr(text), where=tmp_path, error=UsageError)


def test_named_shapes():
    assert parse_named_shapes(["input_ids=1x128", "2x3"]) == [("input_ids", (1, 128)), (None, (2, 3))]


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((8, 3), (4, 3), (16, 3)), "min > opt at dimension 0"),
        (((1, 3), (32, 3), (16, 3)), "opt > max"),
        (((1, 3), (2, 3, 1), (4, 3)), "same rank"),
    ],
    ids=["min-above-opt", "opt-above-max", "ranks-differ"],
)
def test_min_opt_max_order_and_rank(tmp_path, shapes, match):
    assert_refused(InputSpec, "x", *shapes, match=match, where=tmp_path, error=UsageError)


def test_roundtrip_and_dynamic_dims():
    s = InputSpec("input_ids", (1, 16), (8, 64), (64, 128), "int64", (0, 100))
    assert InputSpec.from_dict(s.to_dict()) == s
    assert s.dynamic_dims == [0, 1]
    t = s.example("max")
    assert t.shape == (64, 128) and t.dtype == torch.int64 and int(t.max()) < 100
    assert "input_ids: [1..64]x[16..128] int64" == s.describe()


def test_specs_from_example_multi_input_dict():
    x = {"input_ids": torch.randint(1, 18, (4, 72)), "attention_mask": torch.ones(4, 72, dtype=torch.long)}
    specs = specs_from_example(x)
    assert [s.name for s in specs] == ["input_ids", "attention_mask"]
    assert specs[0].min_shape == (1, 72) and specs[0].opt_shape == (4, 72) and specs[0].max_shape == (64, 72)
    assert specs[0].value_range == (0, int(x["input_ids"].max()) + 1)  # no low bound from data
    made = make_inputs(specs, "keyword", which="min")
    assert set(made) == {"input_ids", "attention_mask"} and made["input_ids"].shape == (1, 72)


def test_specs_from_example_tuple():
    specs = specs_from_example((torch.zeros(2, 3), torch.zeros(2, 5)))
    assert [s.name for s in specs] == ["input_0", "input_1"]
    assert isinstance(make_inputs(specs), tuple)


def test_check_inputs_accepts_another_batch_size():
    specs = specs_from_example(torch.zeros(2, 1, 32, 32))
    check_inputs(specs, torch.zeros(7, 1, 32, 32))


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.zeros(7, 1, 8, 8), "expected input: [1..64]x1x32x32 float32, got 7x1x8x8"),
        (torch.zeros(7, 1, 32, 32, dtype=torch.long), "wrong dtype"),
    ],
    ids=["shape", "dtype"],
)
def test_check_inputs_reports_expected_and_got(tmp_path, x, match):
    specs = specs_from_example(torch.zeros(2, 1, 32, 32))
    assert_refused(check_inputs, specs, x, match=match, where=tmp_path, error=ShapeMismatchError)
