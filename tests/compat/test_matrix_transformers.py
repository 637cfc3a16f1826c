"""The compatibility matrix's BERT and GPT-2 rows (see tests/compat/test_matrix.py)."""

from __future__ import annotations

import pytest

from tests.compat.test_matrix import PASS, cell_ids, cells_of, check_cell

pytestmark = pytest.mark.compat

HERE = cells_of("bert", "gpt2")


@pytest.mark.parametrize("name,stage", HERE, ids=cell_ids(HERE))
def test_cell(matrix, name, stage):
    check_cell(matrix, name, stage)


def test_gpt2_onnx_runs_eager_attention(matrix):
    """GPT-2's ONNX folder (with its KV cache) passes its parity check at random (left-padded) masks:
    the ONNX format captures attention as eager and the model's own sdpa is left in place."""
    pytest.importorskip("transformers")
    from ptopt.formats.onnx_lm import OnnxLMFolder

    cell = matrix.cell("gpt2", "export onnx")
    assert cell.status == PASS, cell.detail
    assert (cell.result / "model.onnx").is_file() and OnnxLMFolder.attention == "eager"
    assert matrix.fp32("gpt2")[0].config._attn_implementation == "sdpa"
