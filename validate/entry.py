"""One model's row of a validate report (the reference's or an artifact's): its JSON form is what
users' CI parses (schema in docs/validate.md). Both paths fill it: ``api`` (any model on samples) and
``lm`` (causal language models on text: their figures in ``lm``, absent from other entries)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Entry:
    """One model's row of the report (the reference's or an artifact's); ``to_dict`` is its JSON form
    (schema in docs/validate.md: the keys and their order are what users' CI parses)."""

    name: str
    ref: str
    role: str  # "reference" | "artifact"
    format: str
    runtime: str
    precision: str
    parent: dict[str, Any] | None
    config: dict[str, Any] | None
    batch_range: list[int] | None
    eval_batch_size: int
    metric: float | None = None
    accuracy_drop: float | None = None
    agreement: dict[str, Any] | None = None
    size: dict[str, Any] = dataclasses.field(default_factory=dict)
    latency: dict[str, dict] = dataclasses.field(default_factory=dict)  # filled by the interleaved timing
    speedup: dict[str, float] = dataclasses.field(default_factory=dict)
    peak_memory_mb: float | None = None
    peak_memory_delta_mb: float | None = None
    #: on a CUDA device: the most GPU memory torch allocated while loading and evaluating it
    #: (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``); None on the CPU
    peak_gpu_memory_mb: float | None = None
    device: str = "cpu"
    gates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    passed: bool = True
    best: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    elapsed_s: dict[str, float] = dataclasses.field(default_factory=dict)
    #: was it made from the reference? ``ptopt.validate.lineage`` (None for the reference itself)
    lineage: dict[str, Any] | None = None

    #: a causal language model's figures (``ptopt.validate.lm``): perplexity, tokens/s, weight bytes
    lm: dict[str, Any] | None = None
    #: ``validate --isa``: level -> its figures there (``ptopt.validate.isa``)
    by_isa: dict[str, dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("lm", "by_isa"):
            if d[key] is None:
                del d[key]
        return d
