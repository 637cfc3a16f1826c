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


@pytest.mark.parametrize("text,shape", [("1x1x32x32", (1, 1, 32, 32)), ("8,3", (8, 3)), (" 4X7 ", (4, 7))])
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "1xax3", "0x3", "-1x3"])
def test_parse_shape_rejects(text):
    with pytest.raises(UsageError):
        parse_shape(text)


def test_named_shapes():
    assert parse_named_shapes(["input_ids=1x128", "2x3"]) == [("input_ids", (1, 128)), (None, (2, 3))]


def test_min_opt_max_order_and_rank():
    with pytest.raises(UsageError, match="min > opt at dimension 0"):
        InputSpec("x", (8, 3), (4, 3), (16, 3))
    with pytest.raises(UsageError, match="opt > max"):
        InputSpec("x", (1, 3), (32, 3), (16, 3))
    with pytest.raises(UsageError, match="same rank"):
        InputSpec("x", (1, 3), (2, 3, 1), (4, 3))


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
    assert specs[0].value_range == (int(x["input_ids"].min()), int(x["input_ids"].max()) + 1)
    made = make_inputs(specs, "keyword", which="min")
    assert set(made) == {"input_ids", "attention_mask"} and made["input_ids"].shape == (1, 72)


def test_specs_from_example_tuple():
    specs = specs_from_example((torch.zeros(2, 3), torch.zeros(2, 5)))
    assert [s.name for s in specs] == ["input_0", "input_1"]
    assert isinstance(make_inputs(specs), tuple)


def test_check_inputs_reports_expected_and_got():
    specs = specs_from_example(torch.zeros(2, 1, 32, 32))
    check_inputs(specs, torch.zeros(7, 1, 32, 32))  # another batch size is fine
    with pytest.raises(ShapeMismatchError, match=r"expected input: \[1\.\.64\]x1x32x32 float32, got 7x1x8x8"):
        check_inputs(specs, torch.zeros(7, 1, 8, 8))
    with pytest.raises(ShapeMismatchError, match="wrong dtype"):
        check_inputs(specs, torch.zeros(7, 1, 32, 32, dtype=torch.long))
