"""Output parity: after every export (and every compress step), the new artifact (in its own
runtime) and its source run the same sample inputs at the min, opt and max shapes, and their outputs
are compared **output by output**.

The rule (one rule for every format and precision), at every shape and for every output ``i``:

    max|diff_i| <= atol + rtol * max|source output_i|      (tolerance relative to that output's scale)
    min over samples of cosine(source_i[s], artifact_i[s]) >= min_cosine

The first bounds the error relative to the output's own scale (logits near zero would otherwise fail
an int8 artifact that ranks every sample the same); the second catches an artifact whose outputs are
*wrong* yet small: an absolute tolerance of 0.1 once let an int8 model with outputs around 1e-9 and
cosine 0.000 against its source pass. The cosine is taken per sample (the batch's first dimension)
and the worst sample counts; samples whose source output is (numerically) zero are judged by the
first rule only. Defaults by precision are in ``DEFAULT_TOLERANCES`` (atol, rtol) and
``MIN_COSINE``; callers override them with ``atol`` / ``rtol`` / ``min_cosine``.

Metrics per shape: ``max_abs_diff``, ``rel_error`` (max abs diff / max |source output|),
``cosine`` (the worst sample's, over all outputs), ``outputs`` (the same per output) and overall the
worst output (``worst_output``). A failure raises ParityError naming the worst output and its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import ParityError
from ptopt.core.inputspec import InputSpec, call_args, format_shape, make_inputs
from ptopt.core.tensors import flatten_named_outputs, flatten_outputs

#: (atol, rtol) by precision of the artifact: the absolute term is only a floor for outputs that are
#: (numerically) zero; what matters is rtol × the output's own scale
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-5, 1e-4),
    "fp16": (1e-4, 1e-2),
    # bf16 keeps 8 significant bits (fp16: 11): its rounding error is ~8x fp16's. Measured with
    # benchmarks/bench_half_parity.py (trained zoo CNNs/LSTM on test and random inputs, a MiniLM-shaped
    # encoder, random-weight CNN/MLP): bf16 vs fp32 rel error at most 0.017, cosine at least 0.99955;
    # rtol 5e-2 and MIN_COSINE 0.995 leave ~3x / ~10x that for deeper models
    "bf16": (1e-3, 5e-2),
    # an int8 artifact may be quantized anew (ORT's static quantization of the fp32 parent): two int8
    # roundings of the same model differ by a few quantization steps; measured on zoo:resnet vs its
    # torch int8 source on real samples: max abs diff 0.53 at logits up to 9.1 (5.8 %), cosine 0.9992
    "int8": (1e-6, 1e-1),
}
#: rtol for an int8 artifact quantized here from an *fp32* source (not re-quantized from an int8 one):
#: each output within 20 % of its scale (a few activation quantization steps on the small logits of an
#: untrained tiny CNN reach 13.5 %), the rule quantize judges its int8 models by
#: (``compress.fidelity.INT8_VS_FP32``); the cosine minimum is the int8 one
INT8_VS_FP32_RTOL = 0.2
#: the worst sample's cosine each output must reach, by precision (the same rule for every format)
MIN_COSINE: dict[str, float] = {"fp32": 0.9999, "fp16": 0.999, "bf16": 0.995, "int8": 0.99}
SHAPES = ("min", "opt", "max")
#: a sample whose source output norm is below this share of the largest sample's is judged by the
#: tolerance rule only (the cosine of a zero vector says nothing)
_ZERO_SAMPLE = 1e-6
#: a source whose outputs never reach this magnitude computes nothing a lower precision can follow (a
#: random-init EfficientNet-B0 gives |y| ~ 3e-13 on random images: its int8 twin gives zeros, cosine 0)
VANISHING_OUTPUT = 1e-6


def vanishing(max_abs_ref: float | None) -> str | None:
    """The clause that explains a failed cosine when the source's outputs vanish, else None."""
    if max_abs_ref is None or not 0 <= max_abs_ref < VANISHING_OUTPUT:
        return None
    return (
        f"the fp32 outputs vanish (largest |value| {max_abs_ref:.2g}), which no cosine can follow: random "
        "weights whose activations die out do this, trained weights do not"
    )


def all_zero_note(metrics: dict[str, Any]) -> str | None:
    """What a passed check is worth when the source's outputs were all zero at every shape (a random-init
    torchvision ViT: its head starts at zero): no cosine was taken, only ``|artifact| <= atol``."""
    tops = [m.get("max_abs_ref") for m in (metrics.get("shapes") or {}).values()]
    if not tops or any(t is None or t > 0 for t in tops):
        return None
    return (
        "the source's outputs are all zero on these inputs, so the check compared nothing but the artifact's "
        "zeros (no cosine); check it on real --data, or on trained weights"
    )


def tolerances(precision: str, atol: float | None = None, rtol: float | None = None) -> tuple[float, float]:
    d_atol, d_rtol = DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["int8"])
    return (d_atol if atol is None else float(atol)), (d_rtol if rtol is None else float(rtol))


def min_cosine_for(precision: str, min_cosine: float | None = None) -> float:
    """The minimum per-sample cosine of ``precision`` (``min_cosine`` overrides it)."""
    if min_cosine is not None:
        return float(min_cosine)
    return MIN_COSINE.get(precision, MIN_COSINE["int8"])


def sample_cosines(ref: Any, got: Any) -> tuple[float, int, float]:
    """(worst per-sample cosine, that sample's index, mean cosine) of one output; samples along the
    first dimension (a vector or one value per sample: the whole output is one sample)."""
    import numpy as np

    if ref.ndim >= 2 and ref.size // max(ref.shape[0], 1) > 1:
        a, b = ref.reshape(ref.shape[0], -1), got.reshape(got.shape[0], -1)
    else:
        a, b = ref.reshape(1, -1), got.reshape(1, -1)
    if a.size == 0:
        return 1.0, 0, 1.0
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    top = float(na.max())
    if top == 0.0:  # the source output is all zeros: only the tolerance rule can judge it
        return 1.0, 0, 1.0
    judged = na > _ZERO_SAMPLE * top
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(nb > 0, (a * b).sum(1) / (na * np.where(nb > 0, nb, 1.0)), 0.0)
    cos = np.where(judged, cos, 1.0)
    worst = int(np.argmin(cos))
    return float(cos[worst]), worst, float(cos[judged].mean())


def compare(ref: Sequence[Any], got: Sequence[Any], names: Sequence[str] | None = None) -> dict[str, Any]:
    """max abs diff, relative error and worst-sample cosine of two flattened output lists: overall
    (``max_abs_diff``, ``rel_error``, ``cosine``, ``max_abs_ref``) and per output (``outputs``)."""
    import numpy as np

    if len(ref) != len(got):
        raise ParityError(f"the artifact returns {len(got)} output(s) but the source returns {len(ref)}")
    names = list(names) if names is not None else [str(i) for i in range(len(ref))]
    outputs = []
    for i, (a, b) in enumerate(zip(ref, got, strict=False)):
        if a.shape != b.shape:
            raise ParityError(
                f"output {i}: the artifact's shape {format_shape(b.shape)} differs from the "
                f"source's {format_shape(a.shape)}"
            )
        scale = float(np.max(np.abs(a))) if a.size else 0.0
        if not np.isfinite(b).all():
            m = {
                "max_abs_diff": math.inf,
                "rel_error": math.inf,
                "cosine": float("nan"),
                "mean_cosine": float("nan"),
            }
            m |= {"worst_sample": 0, "max_abs_ref": scale}
        else:
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            cos, worst, mean = sample_cosines(a, b)
            m = {"max_abs_diff": diff, "rel_error": diff / scale if scale > 0 else diff, "cosine": cos}
            m |= {"mean_cosine": mean, "worst_sample": worst, "max_abs_ref": scale}
        outputs.append({"output": names[i], "shape": format_shape(a.shape), **m})
    return {
        "max_abs_diff": max((o["max_abs_diff"] for o in outputs), default=0.0),
        "rel_error": max((o["rel_error"] for o in outputs), default=0.0),
        "cosine": min((o["cosine"] for o in outputs), default=1.0, key=_nan_low),
        "max_abs_ref": max((o["max_abs_ref"] for o in outputs), default=0.0),
        "outputs": outputs,
    }


def _nan_low(x: float) -> float:
    return -math.inf if x != x else x


def judge(m: dict[str, Any], atol: float, rtol: float, min_cosine: float) -> list[str]:
    """Mark each output of one shape's comparison ``ok``; the reasons of those that fail."""
    reasons = []
    for o in m["outputs"]:
        within = o["max_abs_diff"] <= atol + rtol * o["max_abs_ref"]
        aligned = o["cosine"] >= min_cosine  # False for NaN
        o["ok"] = bool(within and aligned)
        if not o["ok"]:
            vanish = "" if aligned or not vanishing(o["max_abs_ref"]) else f"; {vanishing(o['max_abs_ref'])}"
            why = (
                []
                if aligned
                else [
                    f"worst-sample cosine {o['cosine']:.6f} < {min_cosine:g} (sample {o['worst_sample']}{vanish})"
                ]
            )
            if not within:
                why.append(
                    f"max abs diff {o['max_abs_diff']:.3g} > {atol:g} + {rtol:g}×{o['max_abs_ref']:.3g}"
                )
            o["why"] = "; ".join(why)
            reasons.append(f"output {o['output']} ({o['shape']}): {o['why']}")
    m["ok"] = not reasons
    return reasons


def worst_output(per_shape: dict[str, Any]) -> dict[str, Any] | None:
    """The output (at its shape) furthest from its source: failing ones first, then lowest cosine,
    then largest error relative to its scale."""
    rows = [dict(o, at=which) for which, m in per_shape.items() for o in m["outputs"]]
    if not rows:
        return None
    return min(rows, key=lambda o: (o.get("ok", True), _nan_low(o["cosine"]), -o["rel_error"]))


def check_parity(
    source: Callable[[Any], Any],
    artifact: Callable[[Any], Any],
    specs: Sequence[InputSpec],
    style: str,
    *,
    precision: str = "fp32",
    atol: float | None = None,
    rtol: float | None = None,
    min_cosine: float | None = None,
    what: str = "artifact",
    seed: int = 0,
    samples: Any = None,
) -> dict[str, Any]:
    """Run both on the min/opt/max sample inputs; return the metrics or raise ParityError (with
    ``.metrics``) naming the worst output and its numbers.

    ``source`` and ``artifact`` take a batch in the model's calling style (tensor, tuple or dict).
    ``samples`` (a Dataset, e.g. the calibration data) gives real inputs where its samples fit the
    shape: an int8 model is calibrated for real data, and random inputs outside that range only
    measure how two quantizations clip differently.
    """
    budget = min_cosine is not None and atol is None and rtol is None
    # the user's budget is the rule: a cosine they set alone replaces the default tolerances too
    atol, rtol = (math.inf, 0.0) if budget else tolerances(precision, atol, rtol)
    min_cos = min_cosine_for(precision, min_cosine)
    per_shape: dict[str, Any] = {}
    failures = []
    for which in SHAPES:
        x = _real_inputs(samples, specs, which) if samples is not None else None
        source_of_inputs = "data" if x is not None else "random"
        if x is None:
            x = make_inputs(specs, style, which=which, seed=seed)
        named = flatten_named_outputs(source(x))
        ref, got, padded = real_tokens(specs, x, [a for _, a in named], flatten_outputs(artifact(x)))
        m = compare(ref, got, [n for n, _ in named])
        if padded:
            m["padding"] = f"{padded} padded position(s) of attention_mask left out of per-token outputs"
        m["shape"] = ", ".join(f"{s.name}={format_shape(s.shape(which))}" for s in specs)
        m["inputs"] = source_of_inputs
        if judge(m, atol, rtol, min_cos):
            failures.append(which)
        per_shape[which] = m
    metrics = summarize(per_shape, atol, rtol, min_cos)
    metrics["rule"] = "your budget (min cosine)" if budget else f"default for {precision}"
    if failures:
        err = ParityError(f"{what} drifts from its source beyond tolerance at {failure_text(metrics)}")
        err.metrics = metrics  # type: ignore[attr-defined]
        raise err
    return metrics


def real_tokens(specs: Sequence[InputSpec], x: Any, ref: list[Any], got: list[Any]) -> tuple[list, list, int]:
    """``ref`` and ``got`` with every per-token output (``[N, T, ...]``, 3-d or more, beside an
    ``attention_mask`` input ``[N, T]``) zeroed at the padded positions (mask 0), and how many positions
    that is. Nothing reads a padded position's output (attention and pooling mask it out), and its
    values are whatever the model computed for a token it ignores: all-MiniLM-L6-v2's ORT dynamic int8
    export measured a worst-sample cosine of 0.646 on ``last_hidden_state`` with its padding, 0.951
    on its real tokens. Zeroed in both, a padded position adds nothing to the difference, the scale or
    either side of the cosine."""
    from ptopt.core.inputspec import flatten_inputs

    names = [s.name for s in specs]
    inputs = flatten_inputs(x)
    if "attention_mask" not in names or len(inputs) != len(names) or len(ref) != len(got):
        return ref, got, 0
    # a dict is read by name: the data's order (a tokenizer's input_ids, token_type_ids, attention_mask)
    # need not be the specs' (the model's signature: input_ids, attention_mask, token_type_ids)
    mask = x["attention_mask"] if isinstance(x, dict) else inputs[names.index("attention_mask")][1]
    return padding_left_out(mask, ref, got)


def padding_left_out(mask: Any, ref: list[Any], got: list[Any]) -> tuple[list, list, int]:
    """:func:`real_tokens` under a given ``attention_mask`` ([N, T]): the per-token outputs zeroed at its
    padded positions in both, and how many positions that is."""
    import numpy as np

    mask = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask) != 0
    per_token = [a.ndim >= 3 and a.shape[:2] == mask.shape for a in ref]
    if mask.ndim != 2 or mask.all() or not any(per_token):
        return ref, got, 0

    def keep(a: Any, token: bool) -> Any:
        return np.where(mask.reshape(mask.shape + (1,) * (a.ndim - 2)), a, 0.0) if token else a

    ref = [keep(a, t) for a, t in zip(ref, per_token, strict=True)]
    got = [keep(b, t and b.shape == a.shape) for a, b, t in zip(ref, got, per_token, strict=True)]
    return ref, got, int((~mask).sum())


def failure_text(metrics: dict[str, Any]) -> str:
    """The worst output and its numbers, then where else the rule fails: for ParityError."""
    w = metrics["worst_output"]
    where = metrics["shapes"][w["at"]].get("shape")
    text = (
        f"{w['at']}" + (f" ({where})" if where else "") + f": output {w['output']} ({w['shape']}): {w['why']}"
    )
    if "cosine" not in w["why"] and w.get("cosine") is not None:
        text += f" (worst-sample cosine {w['cosine']:.4f})"
    others = [
        f"{which}/{o['output']}"
        for which, m in metrics["shapes"].items()
        for o in m["outputs"]
        if not o["ok"] and (which, o["output"]) != (w["at"], w["output"])
    ]
    return text + (f"; also fails at {', '.join(others)}" if others else "")


def summarize(per_shape: dict[str, Any], atol: float, rtol: float, min_cos: float) -> dict[str, Any]:
    """The parity metrics of all shapes: the worst numbers, the tolerances, the worst output."""
    return {
        "max_abs_diff": max(m["max_abs_diff"] for m in per_shape.values()),
        "rel_error": max(m["rel_error"] for m in per_shape.values()),
        "cosine": min((m["cosine"] for m in per_shape.values()), key=_nan_low),
        "atol": None if math.isinf(atol) else atol,  # None: no tolerance rule (the user's cosine budget)
        "rtol": None if math.isinf(atol) else rtol,
        "min_cosine": min_cos,
        "worst_output": worst_output(per_shape),
        "shapes": per_shape,
        "passed": all(m["ok"] for m in per_shape.values()),
    }


def loosen_hint(metrics: dict[str, Any] | None) -> str:
    """What a caller can do about a failed check: a drift within the cosine minimum can be accepted
    with looser tolerances; outputs pointing elsewhere (cosine below the minimum) cannot."""
    rows = [
        o for m in (metrics or {}).get("shapes", {}).values() for o in m["outputs"] if not o.get("ok", True)
    ]
    if rows and all(o["cosine"] >= (metrics or {}).get("min_cosine", 1.0) for o in rows):
        return " (loosen with --atol/--rtol if this drift is acceptable)"
    return (
        " (the outputs no longer follow the source's: no tolerance makes this artifact right; if a lower "
        "worst-sample cosine is within your budget, say so with --min-cosine)"
    )


def _real_inputs(samples: Any, specs: Sequence[InputSpec], which: str) -> Any:
    """The first samples of the data set at this shape's batch size (repeated when the set is smaller
    than the batch), if they fit the spec's other dims. Repeating real samples beats random inputs: on
    all-MiniLM-L6-v2 with 32 calibration sentences, random token ids at batch 64 put NNCF int8's worst
    cosine at 0.845 while it held 0.96 on unseen sentences, and refused every OpenVINO int8 artifact."""
    from ptopt.core.data import rebatch
    from ptopt.core.inputspec import flatten_inputs

    batch = specs[0].shape(which)[0] if specs and specs[0].rank else 1
    if not len(samples):
        return None
    x = samples.take(batch).x if len(samples) >= batch else rebatch(samples.x, batch)
    x = _token_length(x, specs, which)
    got = flatten_inputs(x)
    if len(got) != len(specs):
        return None
    for spec, (_, t) in zip(specs, got, strict=False):
        if tuple(t.shape) != spec.shape(which):
            return None
    return x


def _token_length(x: Any, specs: Sequence[InputSpec], which: str) -> Any:
    """Token data (a dict with an ``attention_mask``) at this shape's sequence length: its sentences cut
    to it, or padded to it (ids 0, mask 0: positions the model ignores and :func:`real_tokens` leaves
    out). A token model takes any length up to its position table (``core.input_infer.token_lengths``)
    while its data has one: real sentences padded to the longest length a request may have are what a
    server sees; random ids there measured all-MiniLM-L6-v2's NNCF int8 at 0.986 and rejected it. Other
    data, or a length the specs do not ask for, stays as it is."""
    import torch

    if not isinstance(x, dict) or "attention_mask" not in x:
        return x
    want = {s.name: s.shape(which) for s in specs}
    out = {}
    for name, t in x.items():
        shape = want.get(name)
        if (
            shape is None
            or t.dim() != 2
            or len(shape) != 2
            or t.shape[0] != shape[0]
            or t.shape[1] == shape[1]
        ):
            out[name] = t
        elif t.shape[1] > shape[1]:
            out[name] = t[:, : shape[1]]
        else:
            out[name] = torch.nn.functional.pad(t, (0, shape[1] - t.shape[1]), value=0)
    return out


# -- runners: each artifact in its own runtime -------------------------------------------------


def torch_runner(module: Any, device: str = "cpu", dtype: Any = None) -> Callable[[Any], Any]:
    """Run ``module`` on a batch: inputs moved to ``device`` and their floating-point tensors cast to
    ``dtype`` (a half-precision artifact's; None: as given), outputs back on the host."""
    import torch

    from ptopt.core.device import to_device, to_host

    def run(x: Any) -> Any:
        args, kwargs = call_args(to_device(x, device, dtype))
        with torch.inference_mode():
            return to_host(module(*args, **kwargs))

    return run


def artifact_runner(
    path: str | Path, fmt: str, specs: Sequence[InputSpec], device: str = "cpu", dtype: Any = None
) -> Callable[[Any], Any]:
    """A callable running the artifact at ``path`` the way a user would load it (its format's
    ``reload``), taking a batch in the model's calling style."""
    from ptopt.core.formats import get_format

    if fmt == "tensorrt":
        device = "cuda" if device == "cpu" else device
    style = "keyword" if len(specs) > 1 else "positional"
    return torch_runner(get_format(fmt).reload(Path(path), style=style, device=device), device, dtype)
