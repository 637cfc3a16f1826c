"""Does a compressed model still compute what its source computes? Measured before anything is written.

Every compress step compares its result with the fp32 source on real inputs: the evaluation data when
given, else the calibration / training data, else the example batch (at most ``MAX_SAMPLES``
samples). The rule is export's parity rule (:mod:`ptopt.export.parity`): for every output, the worst
sample's cosine must reach the precision's minimum (int8: ``MIN_COSINE["int8"]``) and the largest
error must stay within ``atol + rtol`` × that output's own scale. Alongside: the top-1 agreement of
the main output (per token for 3-D outputs such as language-model logits).

``quantize`` (post-training: static, dynamic) refuses a model that breaks the rule (ParityError,
exit 2; with ``output`` the file is kept aside as ``<output>.failed``) and names the layers to keep
in float when a search over the layers' sensitivity (``ptopt.compress.quantize.autoquant``) finds a
set that holds. QAT, ``prune`` and ``distill`` change the function on purpose (they train or remove
weights): they record the same numbers (``metrics["vs_fp32"]``, ``["vs_source"]``,
``["vs_teacher"]``) without a gate; their accuracy on eval data says what the change cost.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from ptopt.export.parity import INT8_VS_FP32_RTOL

#: samples the check runs on (the first ones of the data set)
MAX_SAMPLES = 256
#: the rule for an int8 model against its *fp32* source (``export.parity.INT8_VS_FP32_RTOL``, which
#: export applies too when it quantizes an fp32 source): the int8 cosine minimum, and each output
#: within 20 % of its scale
INT8_VS_FP32: dict[str, Any] = {"precision": "int8", "rtol": INT8_VS_FP32_RTOL}
_BATCH = 64


def fidelity_data(*datasets: Any, example: Any = None) -> Any:
    """The first of ``datasets`` that is given (at most MAX_SAMPLES samples), else the example batch
    as a Dataset."""
    from ptopt.core.data import Dataset

    for ds in datasets:
        if ds is not None and len(ds):
            return ds.take(MAX_SAMPLES) if len(ds) > MAX_SAMPLES else ds
    return Dataset(example, name="the example batch")


def measure_fidelity(
    source: Any,
    model: Any,
    data: Any,
    *,
    precision: str = "int8",
    min_cosine: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> dict[str, Any]:
    """``model`` against ``source`` on ``data`` (a Dataset) under export's parity rule.

    Returns ``{"data", "samples", "min_cosine", "mean_cosine", "top1_agreement", "max_rel_error",
    "rule": {...}, "outputs": [...], "worst_output", "passed"}``; never raises for a failed rule.
    """
    import numpy as np
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.core.tensors import flatten_named_outputs, flatten_outputs
    from ptopt.export.parity import compare, judge, min_cosine_for, padding_left_out
    from ptopt.export.parity import tolerances as default_tolerances

    refs: list[list[Any]] = []
    gots: list[list[Any]] = []
    names: list[str] = []
    with torch.inference_mode():
        for b in data.batches(_BATCH):
            named = flatten_named_outputs(call_model(source, b.x))
            names = [n for n, _ in named]
            refs.append([a for _, a in named])
            gots.append(flatten_outputs(call_model(model, b.x)))
    ref = [np.concatenate([r[i] for r in refs]) if refs[0][i].ndim else refs[0][i] for i in range(len(names))]
    got = [
        np.concatenate([g[i] for g in gots]) if gots[0][i].ndim else gots[0][i] for i in range(len(gots[0]))
    ]
    mask = data.x.get("attention_mask") if isinstance(data.x, dict) else None
    if mask is not None and len(ref) == len(got):  # per-token outputs at the real tokens, as export's parity
        ref, got, _ = padding_left_out(mask, ref, got)
    m = compare(ref, got, names)
    atol, rtol = default_tolerances(precision, atol, rtol)
    min_cos = min_cosine_for(precision, min_cosine)
    judge(m, atol, rtol, min_cos)
    worst = min(m["outputs"], key=lambda o: (o["ok"], o["cosine"] if o["cosine"] == o["cosine"] else -2.0))
    return {
        "data": data.name,
        "samples": int(len(data)),
        "min_cosine": m["cosine"],
        "mean_cosine": min(o["mean_cosine"] for o in m["outputs"]) if m["outputs"] else 1.0,
        "top1_agreement": top1_agreement(ref[0], got[0])
        if ref and _class_scores(source, data, ref[0])
        else None,
        "max_rel_error": m["rel_error"],
        "max_abs_ref": m["max_abs_ref"],
        "rule": {"precision": precision, "atol": atol, "rtol": rtol, "min_cosine": min_cos},
        "outputs": m["outputs"],
        "worst_output": worst if m["outputs"] else None,
        "passed": bool(m["ok"]),
    }


#: ``core.scores.output_layer`` of each source measured, while it lives
_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _class_scores(source: Any, data: Any, ref: Any) -> bool:
    """Whether ``source``'s first output (``ref``, on ``data``) is class scores (``core.scores``)."""
    import torch

    from ptopt.core.scores import class_scores, output_layer

    if ref.ndim not in (2, 3) or ref.shape[-1] < 2:
        return False
    try:
        layer = _LAYERS[source]
    except (KeyError, TypeError):  # TypeError: a source that takes no weak reference
        layer = output_layer(source, data.take(min(2, len(data))).x)
        with contextlib.suppress(TypeError):
            _LAYERS[source] = layer  # a search measures one source against many candidates
    return class_scores(ref.shape, layer, labels=data.has_labels, outputs=torch.as_tensor(ref))[0]


def top1_agreement(ref: Any, got: Any) -> float | None:
    """Share of samples (tokens, for 3-D outputs) whose argmax over the last axis agrees; None for
    outputs without classes (a vector per sample of length 1, or a scalar)."""
    if ref.ndim < 2 or ref.shape[-1] < 2:
        return None
    return float((ref.argmax(-1) == got.argmax(-1)).mean())


def describe(fid: dict[str, Any]) -> str:
    """One line: the numbers against the source."""
    from ptopt.export.parity import VANISHING_OUTPUT

    agree = fid.get("top1_agreement")
    top1 = f", top-1 agreement {100 * agree:.2f}%" if agree is not None else ""
    top = fid.get("max_abs_ref")
    zero = (
        f"; the reference's outputs are zero there (largest |value| {top:.2g}), so this compared nothing: "
        "random weights do this (a head that starts at zero, activations that die out), trained weights do not"
        if top is not None and 0 <= top < VANISHING_OUTPUT
        else ""
    )
    return (
        f"min cosine {fid['min_cosine']:.4f} (mean {fid['mean_cosine']:.4f}){top1} "
        f"on {fid['samples']} samples of {fid['data']}{zero}"
    )


def failure(fid: dict[str, Any], what: str) -> str:
    """The ParityError text of a failed check: the worst output and its numbers, and the rule."""
    w = fid["worst_output"]
    rule = fid["rule"]
    return (
        f"{what} does not compute what its fp32 source computes: output {w['output']} ({w['shape']}) "
        f"{w.get('why', '')} on {fid['samples']} samples of {fid['data']} "
        f"(rule for {rule['precision']}: worst-sample cosine >= {rule['min_cosine']:g}, max abs diff <= "
        f"{rule['atol']:g} + {rule['rtol']:g} × the output's scale)"
    )


def vs_source(source: Any, model: Any, data: Any) -> dict[str, Any] | None:
    """The headline numbers of ``model`` against ``source`` on ``data`` (min / mean cosine, top-1
    agreement), for steps that change the function on purpose (prune, distill): recorded, not gated.
    None when the two do not return outputs of the same shapes."""
    from ptopt.core.errors import ParityError

    try:
        fid = measure_fidelity(source, model, data, precision="fp32")
    except ParityError:
        return None
    keys = ("data", "samples", "min_cosine", "mean_cosine", "top1_agreement", "max_abs_ref")
    return {k: fid[k] for k in keys}
