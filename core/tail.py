"""A worst-sample cosine budget, honest about how many samples it was measured on.

The worst of n samples is an optimistic estimate of the worst of more: the minimum over more samples is
lower, and the heavier the tail, the lower. On all-MiniLM-L6-v2, NNCF's int8 held a worst cosine of 0.990
on 32 held-out sentences (mean 0.996) and 0.964 on 128 unseen ones; with its worst of 32 at only 2.6x its
mean deviation, those 32 samples looked light-tailed, and the worst of the 128 was 9.8x.

So a budget on the worst sample (``--min-cosine``) is judged on a **projection**: the expected worst
cosine over ``REFERENCE_SAMPLES`` (1000) samples like the measured ones (about their 99.9th percentile),
from the per-sample deviations ``d = 1 - cosine`` (clipped at 0). It is the lowest of three cosines:

- **measured**: the worst sample seen (a projection never claims better than what was measured);
- **exponential**: the deviations assumed no lighter-tailed than an exponential of their mean, whose
  expected maximum over N samples is ``mean * H(N)`` (H: the harmonic number, ~ln N + 0.577). A few dozen
  samples cannot show that a tail is lighter than that, so none is trusted to be; 1 - cos is about half
  the squared error orthogonal to the output, an exponential when that error lies in one or two
  directions and lighter when it spreads over many;
- **tail**: where the samples themselves show a heavier tail, an exponential fitted to the excesses of
  their top quarter over the next sample (peaks over a threshold), extrapolated to the N * k / n
  reference samples that would exceed it (needs 8 samples or more).

On MiniLM's 697 non-calibration sentences, resampling 32 to project from: NNCF int8's projection to 1000
is 0.972 in the median (its true worst there 0.964; projected above 0.98 in none of 2000 draws); bf16
OpenVINO's 0.99991 (true 0.99997). The projection is an expected value, not a bound: its relative
standard error is about 1/sqrt(n) (``relative_error``), which a search fitted to the budget aims inside.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

#: the sample count a worst-sample cosine is projected to (about the 99.9th percentile of the samples)
REFERENCE_SAMPLES = 1000
#: the fewest samples the top-quarter tail is fitted on (fewer: the exponential of the mean alone)
MIN_TAIL_SAMPLES = 8
_EULER = 0.5772156649015329


def harmonic(n: float) -> float:
    """H(n) = 1 + 1/2 + ... + 1/n: the expected maximum of n exponentials of mean 1 (0 for n < 1)."""
    n = int(n)
    if n < 1:
        return 0.0
    if n <= 10_000:
        return math.fsum(1.0 / i for i in range(1, n + 1))
    return math.log(n) + _EULER + 1.0 / (2 * n)


@dataclasses.dataclass(frozen=True)
class WorstCosine:
    """A worst-sample cosine as measured on ``samples`` and projected to ``reference`` samples."""

    measured: float
    projected: float
    mean: float
    samples: int
    reference: int
    #: which estimate set ``projected``: "measured" | "exponential" | "tail"
    by: str

    @property
    def relative_error(self) -> float:
        """The projection's relative standard error (of the mean deviation it scales): 1/sqrt(n)."""
        return 1.0 / math.sqrt(max(self.samples, 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured": round(self.measured, 6),
            "projected": round(self.projected, 6),
            "mean": round(self.mean, 6),
            "samples": self.samples,
            "reference_samples": self.reference,
            "by": self.by,
        }

    def describe(self) -> str:
        """``0.9718 projected to 1000 samples (measured worst 0.9902 on 32)``."""
        return (
            f"{self.projected:.4f} projected to {self.reference} samples (measured worst {self.measured:.4f} "
            f"on {self.samples})"
        )


def project_worst_cosine(cosines: Iterable[float], reference: int = REFERENCE_SAMPLES) -> WorstCosine:
    """The worst of ``cosines`` (per-sample cosines with the reference outputs) and its projection to
    ``reference`` samples (the module docstring); with more samples than ``reference``, to their count."""
    cos = [float(c) for c in _flat(cosines)]
    if not cos or any(math.isnan(c) for c in cos):
        raise ValueError("project_worst_cosine needs at least one per-sample cosine, and no NaN")
    n = len(cos)
    target = max(int(reference), n)
    devs = sorted(max(0.0, 1.0 - c) for c in cos)
    estimates = {
        "measured": devs[-1],
        "exponential": math.fsum(devs) / n * harmonic(target),
        "tail": _tail(devs, target),
    }
    by = max(estimates, key=lambda k: estimates[k])  # ties: the measured one (listed first)
    projected = max(-1.0, 1.0 - estimates[by])
    return WorstCosine(min(cos), min(projected, min(cos)), math.fsum(cos) / n, n, target, by)


def _tail(devs: list[float], target: int) -> float:
    """The top quarter's excesses over the next sample, an exponential extrapolated to the reference
    samples beyond that threshold (0 below ``MIN_TAIL_SAMPLES``)."""
    n = len(devs)
    if n < MIN_TAIL_SAMPLES:
        return 0.0
    k = math.ceil(n / 4)
    threshold = devs[n - k - 1]
    scale = math.fsum(d - threshold for d in devs[n - k :]) / k
    return threshold + scale * harmonic(max(1, round(target * k / n)))


def _flat(values: Any) -> Iterable[float]:
    """A tensor, an array or an iterable of numbers, flattened."""
    if hasattr(values, "reshape") and hasattr(values, "tolist"):
        return values.reshape(-1).tolist()
    return values
