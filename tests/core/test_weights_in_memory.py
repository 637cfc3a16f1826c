"""Weights given with a model that is already built (an nn.Module, a Result, a LoadedModel) were dropped
without a word (prune's --teacher-weights with an nn.Module teacher trained from its own weights); they
are refused, naming what to do instead."""

from __future__ import annotations

import pytest
import torch

import ptopt
from ptopt.core.errors import UsageError
from ptopt.core.modelref import as_loaded
from tests.helpers import tiny_cnn


def test_weights_with_a_built_model_are_refused(tmp_path):
    weights = tmp_path / "w.pt"
    torch.save(tiny_cnn().state_dict(), weights)
    with pytest.raises(UsageError, match=r"weights .*w\.pt go with a MODEL reference .* a built TinyCNN"):
        as_loaded(tiny_cnn(), weights)
    with pytest.raises(UsageError, match="a built TinyCNN takes them itself"):
        ptopt.quantize(tiny_cnn(), "dynamic", weights=weights, input_shapes=("1x1x8x8",), progress=False)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    with pytest.raises(UsageError, match="a built TinyCNN takes them itself"):
        ptopt.prune(
            tiny_cnn(), "l1-unstructured", 0.3, fine_tune_data=(x, y), epochs=1, teacher=tiny_cnn(),
            teacher_weights=weights, progress=False,
        )  # fmt: skip
    assert as_loaded("tests.helpers:tiny_cnn", weights).module is not None  # a reference takes them
