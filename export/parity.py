"""Output parity: after every export, the new artifact (in its own runtime) and its source run the
same sample inputs at the min, opt and max shapes, and their outputs are compared.

Metrics per shape and overall: ``max_abs_diff``, ``rel_error`` (max abs diff / max |source output|)
and ``cosine`` (of the flattened outputs). The check passes when, at every shape,

    max_abs_diff <= atol + rtol * max|source output|

i.e. tolerance relative to the output's scale, not element-wise (logits near zero would otherwise
fail an int8 artifact that ranks every sample the same). Defaults are tighter for fp32 than for
fp16/int8 (``DEFAULT_TOLERANCES``); ``--atol/--rtol`` override them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import ParityError, UnsupportedModelError
from ptopt.core.inputspec import InputSpec, call_args, format_shape, make_inputs

#: (atol, rtol) by precision of the exported artifact.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 1e-4),
    "fp16": (1e-2, 1e-2),
    # an int8 artifact may be quantized anew (ORT's static quantization of the fp32 parent): two int8
    # roundings of the same model differ by a few quantization steps; measured on zoo:resnet vs its
    # torch int8 source on real samples: max abs diff 0.53 at logits up to 9.1 (5.8 %), cosine 0.9992
    "int8": (1e-1, 1e-1),
}
SHAPES = ("min", "opt", "max")


def tolerances(precision: str, atol: float | None = None, rtol: float | None = None) -> tuple[float, float]:
    d_atol, d_rtol = DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["int8"])
    return (d_atol if atol is None else float(atol)), (d_rtol if rtol is None else float(rtol))


def flatten_outputs(out: Any) -> list[Any]:
    """Model outputs (tensor, tuple/list, dict, numpy) → a list of float64 numpy arrays."""
    import numpy as np
    import torch

    if isinstance(out, dict):
        items: Sequence[Any] = list(out.values())
    elif isinstance(out, (tuple, list)):
        items = out
    else:
        items = [out]
    arrays = []
    for o in items:
        if isinstance(o, (tuple, list, dict)):
            arrays += flatten_outputs(o)
        elif isinstance(o, torch.Tensor):
            t = o.detach()
            if t.is_quantized:
                t = t.dequantize()
            arrays.append(t.cpu().to(torch.float64).numpy())
        else:
            try:
                arrays.append(np.asarray(o, dtype=np.float64))
            except (TypeError, ValueError):
                raise UnsupportedModelError(
                    f"the model returns a {type(o).__name__} ({str(o)[:40]!r}); ptopt exports models whose "
                    f"outputs are tensors, or tuples, lists or dicts of tensors"
                ) from None
    return arrays


def compare(ref: Sequence[Any], got: Sequence[Any]) -> dict[str, float]:
    """max abs diff, relative error and cosine of two flattened output lists."""
    import numpy as np

    if len(ref) != len(got):
        raise ParityError(f"the artifact returns {len(got)} output(s) but the source returns {len(ref)}")
    for i, (a, b) in enumerate(zip(ref, got, strict=False)):
        if a.shape != b.shape:
            raise ParityError(
                f"output {i}: the artifact's shape {format_shape(b.shape)} differs from the "
                f"source's {format_shape(a.shape)}"
            )
    a = np.concatenate([r.ravel() for r in ref]) if ref else np.zeros(0)
    b = np.concatenate([g.ravel() for g in got]) if got else np.zeros(0)
    if not (np.isfinite(b).all()):
        return {"max_abs_diff": math.inf, "rel_error": math.inf, "cosine": float("nan"), "max_abs_ref": 0.0}
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    cos = float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    return {
        "max_abs_diff": diff,
        "rel_error": diff / scale if scale > 0 else diff,
        "cosine": cos,
        "max_abs_ref": scale,
    }


def check_parity(
    source: Callable[[Any], Any],
    artifact: Callable[[Any], Any],
    specs: Sequence[InputSpec],
    style: str,
    *,
    precision: str = "fp32",
    atol: float | None = None,
    rtol: float | None = None,
    what: str = "artifact",
    seed: int = 0,
    samples: Any = None,
) -> dict[str, Any]:
    """Run both on the min/opt/max sample inputs; return the metrics or raise ParityError.

    ``source`` and ``artifact`` take a batch in the model's calling style (tensor, tuple or dict).
    ``samples`` (a Dataset, e.g. the calibration data) gives real inputs where its samples fit the
    shape: an int8 model is calibrated for real data, and random inputs outside that range only
    measure how two quantizations clip differently.
    """
    atol, rtol = tolerances(precision, atol, rtol)
    per_shape: dict[str, Any] = {}
    failures = []
    for which in SHAPES:
        x = _real_inputs(samples, specs, which) if samples is not None else None
        source_of_inputs = "data" if x is not None else "random"
        if x is None:
            x = make_inputs(specs, style, which=which, seed=seed)
        ref = flatten_outputs(source(x))
        got = flatten_outputs(artifact(x))
        m = compare(ref, got)
        m["shape"] = ", ".join(f"{s.name}={format_shape(s.shape(which))}" for s in specs)
        m["inputs"] = source_of_inputs
        m["ok"] = bool(m["max_abs_diff"] <= atol + rtol * m["max_abs_ref"])
        per_shape[which] = m
        if not m["ok"]:
            failures.append(
                f"{which} ({m['shape']}): max abs diff {m['max_abs_diff']:.3g} > "
                f"{atol:g} + {rtol:g}×{m['max_abs_ref']:.3g}, cosine {m['cosine']:.6f}"
            )
    metrics = {
        "max_abs_diff": max(m["max_abs_diff"] for m in per_shape.values()),
        "rel_error": max(m["rel_error"] for m in per_shape.values()),
        "cosine": min(m["cosine"] for m in per_shape.values()),
        "atol": atol,
        "rtol": rtol,
        "shapes": per_shape,
        "passed": not failures,
    }
    if failures:
        err = ParityError(f"{what} drifts from its source beyond tolerance at " + "; ".join(failures))
        err.metrics = metrics  # type: ignore[attr-defined]
        raise err
    return metrics


def _real_inputs(samples: Any, specs: Sequence[InputSpec], which: str) -> Any:
    """The first samples of the data set at this shape's batch size, if they fit the spec's other dims."""
    from ptopt.core.inputspec import flatten_inputs

    batch = specs[0].shape(which)[0] if specs and specs[0].rank else 1
    if len(samples) < batch:
        return None
    x = samples.take(batch).x
    got = flatten_inputs(x)
    if len(got) != len(specs):
        return None
    for spec, (_, t) in zip(specs, got, strict=False):
        if tuple(t.shape) != spec.shape(which):
            return None
    return x


# -- runners: each artifact in its own runtime -------------------------------------------------


def torch_runner(module: Any, device: str = "cpu") -> Callable[[Any], Any]:
    import torch

    def run(x: Any) -> Any:
        args, kwargs = call_args(x)
        args = tuple(a.to(device) for a in args)
        kwargs = {k: v.to(device) for k, v in kwargs.items()}
        with torch.inference_mode():
            return module(*args, **kwargs)

    return run


def onnx_session(path: str | Path, threads: int | None = None, optimization: str | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def onnx_runner(
    path: str | Path, specs: Sequence[InputSpec], threads: int | None = None
) -> Callable[[Any], Any]:
    """Run an ONNX file in ONNX Runtime; inputs are matched by name, else in order."""
    import torch

    sess = onnx_session(path, threads or torch.get_num_threads())
    names = [i.name for i in sess.get_inputs()]

    def run(x: Any) -> Any:
        from ptopt.core.inputspec import flatten_inputs

        pairs = flatten_inputs(x)
        if isinstance(x, dict) and all(n in x for n in names):
            feed = {n: x[n] for n in names}
        else:
            feed = {n: t for n, (_, t) in zip(names, pairs, strict=False)}
        return sess.run(None, {n: t.detach().cpu().numpy() for n, t in feed.items()})

    return run


def artifact_runner(path: str | Path, fmt: str, specs: Sequence[InputSpec]) -> Callable[[Any], Any]:
    """A callable running the artifact at ``path`` the way a user would load it
    (``ptopt.export.writers.reload``), taking a batch in the model's calling style."""
    from ptopt.export.writers import reload

    if fmt == "onnx":
        return onnx_runner(path, specs)
    return torch_runner(reload(path, fmt), device="cuda" if fmt == "tensorrt" else "cpu")
