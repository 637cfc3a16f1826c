"""optimize's ``int8-pt2e`` candidate gets a fixed-batch model per timed batch size, as ``fp32-aoti`` does
(Inductor prepacks int8 weights only at a fixed batch: ~1.6x the dynamic model at batch 1 on an AVX2 EPYC,
docs/quantize.md), and the dynamic model alone where the model's batch range refuses them."""

from __future__ import annotations

import pytest

from ptopt.core.errors import UsageError
from ptopt.optimize import candidates


def _ctx(batch_sizes):
    return candidates.Context(
        module="m", calib="c", evald=None, train=None, input_shapes=(), max_accuracy_drop=1.0, min_cosine=None,
        seconds_left=lambda: 60.0, batch_sizes=batch_sizes,
    )  # fmt: skip


@pytest.mark.parametrize("refuse", [False, True], ids=["fixed-batches", "narrow-range"])
def test_pt2e_candidate_asks_for_a_fixed_batch_model_per_timed_batch(monkeypatch, refuse):
    import ptopt.compress.quantize as quantize_api

    calls = []

    def fake(module, mode, **kwargs):
        calls.append(kwargs.get("static_batches"))
        if refuse and kwargs.get("static_batches"):
            raise UsageError("--static-batch 1: outside the model's batch range")
        return "built"

    monkeypatch.setattr(quantize_api, "quantize", fake)
    assert candidates._quantize("static", "pt2e")(_ctx((1, 32, 256))) == "built"
    assert calls == ([[1, 32], None] if refuse else [[1, 32]])  # 256: past the package's batch range
    calls.clear()
    candidates._quantize("static", "fx")(_ctx((1, 32)))
    assert calls == [None]  # fx has no fixed-batch models
