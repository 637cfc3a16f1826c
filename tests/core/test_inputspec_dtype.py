"""Shapes with a dtype: ``input_ids=1x32:int64`` (the dtype flows into the InputSpec)."""

import pickle

import pytest
import torch

from ptopt.core.errors import UsageError
from ptopt.core.inputspec import TypedShape, dtype_of, parse_named_shapes, parse_shape
from tests.helpers import assert_refused


@pytest.mark.parametrize(
    "text,shape,dtype",
    [
        ("1x3x32x32", (1, 3, 32, 32), None),
        ("1x32:int64", (1, 32), "int64"),
        ("2x16:long", (2, 16), "int64"),
        ("2x16:int32", (2, 16), "int32"),
        ("2x16:bool", (2, 16), "bool"),
        ("1x3x8x8:half", (1, 3, 8, 8), "float16"),
        ("1x3x8x8:torch.bfloat16", (1, 3, 8, 8), "bfloat16"),
        (" 4X7 : Float16 ", (4, 7), "float16"),
    ],
    ids=["plain", "int64", "alias-long", "int32", "bool", "alias-half", "torch-prefix", "spaces-case"],
)
def test_parse_shape_with_dtype(text, shape, dtype):
    got = parse_shape(text)
    assert got == shape and dtype_of(got) == dtype


@pytest.mark.parametrize(
    "text,match",
    [
        ("1x32:int65", ("bad dtype 'int65'", "int64")),
        ("1x32:", ("bad dtype ''",)),
        ("1xfoo:int64", ("bad shape '1xfoo:int64'",)),
    ],
    ids=["unknown-dtype", "empty-dtype", "bad-dims"],
)
def test_bad_dtype_is_refused(tmp_path, text, match):
    assert_refused(parse_shape, text, match=match, where=tmp_path, error=UsageError)


def test_named_shapes_keep_their_dtype():
    (n1, s1), (n2, s2) = parse_named_shapes(["input_ids=1x128:int64", "attention_mask=1x128"])
    assert (n1, s1, dtype_of(s1)) == ("input_ids", (1, 128), "int64")
    assert (n2, s2, dtype_of(s2)) == ("attention_mask", (1, 128), None)


def test_typed_shape_is_a_tuple_that_survives_pickle():
    s = TypedShape((1, 32), "int32")
    assert isinstance(s, tuple) and s == (1, 32) and hash(s) == hash((1, 32))
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.dtype == "int32"
    assert dtype_of((1, 32)) is None and dtype_of(torch.Size([1, 32])) is None
