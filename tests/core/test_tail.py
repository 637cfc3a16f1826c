"""``ptopt.core.tail``: a worst-sample cosine projected to more samples than were measured. A heavy tail
(and a light-looking sample whose mean is too large for the budget) is rejected, a tight one accepted,
and a few samples, none, or more than the reference count are handled."""

from __future__ import annotations

import math

import pytest

from ptopt.core.tail import MIN_TAIL_SAMPLES, REFERENCE_SAMPLES, harmonic, project_worst_cosine

#: all-MiniLM-L6-v2's 32 held-out sentences of ``bench_real.py`` (1 - cosine with the fp32 embedding):
#: NNCF int8 (worst 0.9902 here, 0.9637 on the bench's 128 unseen sentences) and OpenVINO bf16
NNCF_INT8 = [
    0.002191, 0.005499, 0.005431, 0.003654, 0.003036, 0.003404, 0.006269, 0.004041, 0.003309, 0.001972,
    0.001864, 0.005061, 0.002299, 0.003332, 0.009769, 0.003651, 0.002963, 0.003112, 0.002633, 0.003906,
    0.00331, 0.002923, 0.005042, 0.003135, 0.005339, 0.004482, 0.003212, 0.002313, 0.003059, 0.001316,
    0.00485, 0.004252,
]  # fmt: skip
BF16 = [
    1.2e-05, 1e-05, 1.1e-05, 1.1e-05, 1.4e-05, 1.1e-05, 1.3e-05, 9e-06, 1.5e-05, 9e-06, 1e-05, 1.4e-05,
    1e-05, 1.3e-05, 9e-06, 1.3e-05, 1.2e-05, 1.4e-05, 1e-05, 1.4e-05, 1e-05, 1.1e-05, 1.1e-05, 1.3e-05,
    1e-05, 1.1e-05, 1e-05, 1e-05, 1.1e-05, 1.2e-05, 1.4e-05, 1.5e-05,
]  # fmt: skip


def cosines(deviations):
    return [1.0 - d for d in deviations]


def test_minilm_nncf_int8_is_rejected_at_098_and_bf16_passes():
    """The case of issue 27: NNCF int8 held 0.9902 on 32 sentences; projected to 1000 it is 0.972, below
    the user's 0.98 (it was 0.9637 on 128 unseen ones); bf16's projection stays at 0.9999."""
    nncf = project_worst_cosine(cosines(NNCF_INT8))
    assert nncf.measured == pytest.approx(0.990231) and nncf.samples == 32
    assert nncf.reference == REFERENCE_SAMPLES == 1000 and nncf.by == "exponential"
    assert nncf.projected == pytest.approx(1 - sum(NNCF_INT8) / 32 * harmonic(1000))
    assert 0.97 < nncf.projected < 0.98 <= nncf.measured
    bf16 = project_worst_cosine(cosines(BF16))
    assert bf16.projected >= 0.9999 and bf16.measured - bf16.projected < 1e-4


def test_tight_samples_accepted_close_to_their_measured_worst():
    tight = project_worst_cosine(cosines([2e-6 * (1 + 0.01 * (i % 5)) for i in range(64)]))
    assert tight.projected >= 1 - 2e-5 and tight.projected <= tight.measured
    assert tight.mean == pytest.approx(1 - 2.04e-6, abs=1e-8)


def test_a_tail_the_samples_show_is_extrapolated_past_the_measured_worst():
    """Pareto-like deviations (a few samples far worse than the rest): the top quarter's tail, not the
    exponential of the mean, sets the projection, below the measured worst."""
    n = 32
    heavy = [1e-4 * (1 - (i + 0.5) / n) ** -1.5 for i in range(n)]  # quantiles of a Pareto, alpha 2/3
    est = project_worst_cosine(cosines(heavy))
    assert est.by == "tail"
    assert est.projected < est.measured < 1 - sum(heavy) / n * harmonic(1000)


def test_exponential_samples_project_like_their_own_law():
    """Deviations that are the quantiles of an exponential of mean m: both estimates agree on about
    m * H(1000), the expected worst of 1000 such samples."""
    m, n = 1e-3, 200
    devs = [-m * math.log(1 - (i + 0.5) / n) for i in range(n)]
    est = project_worst_cosine(cosines(devs))
    assert 1 - est.projected == pytest.approx(m * harmonic(1000), rel=0.15)


@pytest.mark.parametrize("n", [1, 2, MIN_TAIL_SAMPLES - 1, MIN_TAIL_SAMPLES])
def test_few_samples(n):
    """Below MIN_TAIL_SAMPLES only the exponential of the mean; one sample projects to d * H(1000); the
    relative error says how little a few samples know."""
    est = project_worst_cosine(cosines([1e-4] * n))
    assert est.samples == n and est.measured == pytest.approx(1 - 1e-4)
    assert est.projected == pytest.approx(1 - 1e-4 * harmonic(1000))
    assert est.relative_error == pytest.approx(1 / math.sqrt(n))


def test_edge_cases():
    with pytest.raises(ValueError, match="at least one"):
        project_worst_cosine([])
    with pytest.raises(ValueError, match="NaN"):
        project_worst_cosine([0.99, float("nan")])
    exact = project_worst_cosine([1.0] * 10)  # identical outputs: nothing to project
    assert exact.projected == exact.measured == 1.0 and exact.by == "measured"
    rounded = project_worst_cosine([1.0 + 1e-12, 1.0])  # a cosine above 1 by rounding counts as 1
    assert rounded.projected == 1.0
    wrecked = project_worst_cosine([0.2] * 4)
    assert wrecked.projected == -1.0  # clamped to a cosine
    many = project_worst_cosine(cosines([1e-4] * 1999 + [0.05]))  # more samples than the reference
    assert many.reference == 2000 and many.projected == pytest.approx(0.95) and many.by == "measured"


def test_tensors_and_the_record():
    import torch

    est = project_worst_cosine(torch.tensor([[0.999, 0.998], [0.9995, 0.997]], dtype=torch.float64))
    assert est.samples == 4 and est.measured == pytest.approx(0.997)
    d = est.to_dict()
    assert set(d) == {"measured", "projected", "mean", "samples", "reference_samples", "by"}
    assert "projected to 1000 samples (measured worst 0.9970 on 4)" in est.describe()


def test_harmonic():
    assert harmonic(0) == 0.0 and harmonic(1) == 1.0 and harmonic(2) == 1.5
    assert harmonic(1000) == pytest.approx(7.48547, abs=1e-5)
    assert harmonic(10_001) == pytest.approx(harmonic(10_000) + 1 / 10_001, abs=1e-7)
