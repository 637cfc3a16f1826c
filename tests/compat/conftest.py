"""The compatibility suite's setup: torchvision importable beside the CPU torch, one matrix per session.

PyPI's torchvision 0.28.0 is a CUDA build whose C++ ops cannot load here, and ``import torchvision``
(which transformers and timm do too) then fails; ``ensure_torchvision_ops`` defines the two op
names its import registers fake kernels for (see docs/compat.md). It runs at collection, before
any test imports those libraries.
"""

from __future__ import annotations

import pytest

from tests.compat.models import ensure_torchvision_ops

ensure_torchvision_ops()


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory):
    from tests.compat.matrix import Matrix

    return Matrix(tmp_path_factory.mktemp("compat"))


@pytest.fixture(autouse=True)
def _two_threads():
    """Two threads, as on CI's machine (the session's conftest restores the count after)."""
    import torch

    from tests.helpers import worker_threads

    torch.set_num_threads(worker_threads() or 2)
