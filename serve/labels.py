"""A classifier's labels, on the server: the ``label`` and ``score`` outputs of a sequence classifier.

A Hugging Face ``...ForSequenceClassification`` folder names its classes in ``config.json``
(``id2label``); the artifact exported from it answers ``logits``. ``serve.ray_package`` reads the names
when it packages such an artifact with the folder's tokenizer, and the Ray Serve ingress adds ``label``
(``BYTES``, one per row: the name of the largest logit) and ``score`` (its softmax probability) to every
answer, as a ``text-classification`` pipeline names its top class and scores it. Not for a multi-label
classifier (several classes may hold: the logits say which) or a regression head (one output), and not
where the names are transformers' placeholders (``LABEL_0`` ...): ``package`` says which.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

OUTPUT = "label"
SCORE = "score"
LOGITS = "logits"


def labels_of(folder: str | Path) -> tuple[list[str] | None, str]:
    """``(names by class index, "")`` for a single-label sequence classifier's folder with named classes;
    ``(None, why not)`` for a classifier that gets no ``label``; ``(None, "")`` for any other model."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, ""
    archs = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        return None, ""
    names = config.get("id2label") or {}
    try:
        ordered = [str(names[k]) for k in sorted(names, key=int)]
    except (TypeError, ValueError):
        return None, f"no {OUTPUT} (its config's id2label is not indexed by class numbers)"
    if config.get("problem_type") == "multi_label_classification":
        return None, f"no {OUTPUT} (a multi-label classifier: its logits say which classes hold)"
    if len(ordered) < 2 or [int(k) for k in sorted(names, key=int)] != list(range(len(ordered))):
        return None, f"no {OUTPUT} (its config names {len(ordered)} class(es), not a class per logit)"
    if all(re.fullmatch(r"LABEL_\d+", n) for n in ordered):
        return None, f"no {OUTPUT} (its config's id2label holds transformers' placeholders, LABEL_0 ...)"
    return ordered, ""


def label_output(logits: np.ndarray, labels: list[str]) -> list[tuple[str, np.ndarray]]:
    """``[(label, [N] names as UTF-8 bytes), (score, [N] softmax probabilities)]`` of ``[N, classes]``
    logits; none where the shape is not that."""
    if logits.ndim != 2 or logits.shape[1] != len(labels):
        return []
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    top = logits.argmax(axis=1)
    names = np.array([labels[i].encode("utf-8") for i in top], dtype=object)
    return [(OUTPUT, names), (SCORE, p[np.arange(len(top)), top].astype(np.float32))]


def with_label_output(meta: dict[str, Any], labels: list[str] | None) -> dict[str, Any]:
    """The model metadata with ``label`` and ``score`` among the outputs, where they are added."""
    from ptopt.serve.oip import tensor_metadata

    if not labels or not any(t["name"] == LOGITS for t in meta["outputs"]):
        return meta
    added = [tensor_metadata(OUTPUT, "BYTES", [-1]), tensor_metadata(SCORE, "FP32", [-1])]
    return {**meta, "outputs": [*meta["outputs"], *added]}
