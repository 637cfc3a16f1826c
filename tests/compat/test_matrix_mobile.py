"""The compatibility matrix's MobileNetV3 and EfficientNet-B0 rows (see tests/compat/test_matrix.py)."""

from __future__ import annotations

import pytest

from tests.compat.test_matrix import cell_ids, cells_of, check_cell

pytestmark = pytest.mark.compat

HERE = cells_of("mobilenet_v3_small", "efficientnet_b0")


@pytest.mark.parametrize("name,stage", HERE, ids=cell_ids(HERE))
def test_cell(matrix, name, stage):
    check_cell(matrix, name, stage)
