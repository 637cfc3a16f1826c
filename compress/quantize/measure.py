"""What every int8 model is measured by, whatever engine made it: accuracy (or agreement) against
fp32 on the eval data, fidelity under export's parity rule (``ptopt.compress.fidelity``), and the
share of the model that is int8 (layers, parameters, multiply-accumulates)."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Any

from ptopt.compress.quantize.base import Prepared

#: random samples the fidelity check runs on when no data is given (the example batch has 2: dynamic
#: int8 of EfficientNet-B0 passed on those with cosine 0.99 and measured 0.85 on 8 others)
CHECK_SAMPLES = 16
#: why the int8 check runs on the calibration (or training) data, after its name: the quantize command's
#: hint, or what a caller that withholds its eval data on purpose says (``no_eval_data_because``)
_NO_EVAL = contextvars.ContextVar("no_eval", default="no --eval-data given")


@contextlib.contextmanager
def no_eval_data_because(why: str) -> Iterator[None]:
    """Inside: a check on the calibration data names ``why`` no eval data was passed (``optimize`` judges its
    candidates on its --eval-data itself, after the stages' own checks) instead of "no --eval-data given"."""
    token = _NO_EVAL.set(why)
    try:
        yield
    finally:
        _NO_EVAL.reset(token)


def accuracy(fp32: Any, int8: Any, ds: Any, ref: Any, batch: int = 256) -> dict[str, Any]:
    """fp32 vs int8 on ``ds`` (in batches of ``batch``): top-1 accuracy with labels, else top-1
    agreement with fp32. ``ref``: the eval data as given (a reference is named as given)."""
    if ds is None:
        return {}
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.formats.runner import primary_output

    n = positions = correct32 = correct8 = agree = 0  # positions: samples, or tokens of [N, T, vocab]
    why = None if ds.has_labels else not_class_scores(fp32, ds)
    labels_note = labels_on_features(fp32, ds) if ds.has_labels else None
    with torch.no_grad():
        for b in ds.batches(batch):
            p32 = primary_output(call_model(fp32, b.x)).argmax(-1)
            p8 = primary_output(call_model(int8, b.x)).argmax(-1)
            n += int(p32.shape[0])
            positions += int(p32.numel())
            agree += int((p32 == p8).sum())
            if b.y is not None:
                correct32 += int((p32 == b.y).sum())
                correct8 += int((p8 == b.y).sum())
    out: dict[str, Any] = {
        "eval_data": str(ref) if isinstance(ref, (str, os.PathLike)) else ds.name,
        "eval_samples": n,
        "top1_agreement": agree / positions,
    }
    if why:  # the arg-max of an embedding is one feature dimension: its agreement says nothing
        del out["top1_agreement"]
        out["top1_not_measured"] = why
    if ds.has_labels:
        out |= {
            "fp32_accuracy": correct32 / positions,
            "int8_accuracy": correct8 / positions,
            "accuracy_drop_points": round(100.0 * (correct32 - correct8) / positions, 4),
        }
    if labels_note:  # measured as asked, but the outputs look like features
        out["labels_note"] = labels_note
    return out


def check_data(prep: Prepared) -> Any:
    """What the int8 model is checked on: the data given, else ``CHECK_SAMPLES`` random inputs of the
    model's input specs (at most their largest batch)."""
    from ptopt.compress.fidelity import fidelity_data
    from ptopt.core.data import Dataset

    if any(ds is not None and len(ds) for ds in (prep.evald, prep.calib, prep.train)):
        found = fidelity_data(prep.evald, prep.calib, prep.train)
        if prep.evald is None or not len(prep.evald):  # a figure on the data it was fitted on says so
            role = "calibration" if prep.calib is not None and len(prep.calib) else "training"
            found = Dataset(found.x, found.y, name=f"{found.name} (the {role} data; {_NO_EVAL.get()})")
        return found
    specs = prep.loaded.input_specs
    if not specs:
        return fidelity_data(example=prep.example)
    batch = min([CHECK_SAMPLES] + [s.max_shape[0] for s in specs if s.max_shape])
    x = prep.loaded.example_inputs(which="opt", batch=batch)
    return Dataset(x, name="random inputs of the model's input shapes (no data given)")


def not_class_scores(model: Any, ds: Any) -> str | None:
    """Why ``model``'s outputs on ``ds`` are not class scores (``core.scores``), or None if they are."""
    from ptopt.core.scores import model_class_scores

    return model_class_scores(model, ds.take(min(2, len(ds))).x, labels=ds.has_labels)[1]


def labels_on_features(model: Any, ds: Any) -> str | None:
    """With labels, the note that ``model``'s outputs on ``ds`` look like features (``core.scores``)."""
    from ptopt.core.scores import model_labels_on_features

    return model_labels_on_features(model, ds.take(min(2, len(ds))).x)


def vs_fp32(fp32: Any, model: Any, prep: Prepared, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """The int8 model against its fp32 source under export's parity rule (``compress.fidelity``):
    ``vs_fp32`` (the full record) and its headline numbers ``min_cosine`` / ``top1_agreement_vs_fp32``.
    ``known``: that record, when the handler already measured this model on ``check_data(prep)``."""
    from ptopt.compress.fidelity import INT8_VS_FP32, measure_fidelity

    fid = known or measure_fidelity(fp32, model, check_data(prep), **INT8_VS_FP32)
    out = {"vs_fp32": fid, "min_cosine": fid["min_cosine"]}
    if fid["top1_agreement"] is not None:
        out["top1_agreement_vs_fp32"] = fid["top1_agreement"]
    return out


def sizes(int8_bytes: int, fp32_bytes: int) -> dict[str, Any]:
    """The int8 artifact's bytes against the fp32 TorchScript's."""
    return {
        "fp32_torchscript_bytes": fp32_bytes,
        "size_ratio_vs_fp32_torchscript": round(int8_bytes / fp32_bytes, 4),
        # an "int8" file larger than its source is said loudly (the CLI warns; here the flag)
        "larger_than_fp32": int8_bytes > fp32_bytes,
    }


def layer_macs(module: Any, example: Any) -> dict[str, float]:
    """Multiply-accumulates per sample of each layer with a weight matrix (or recurrent weights), by
    name (weights × output positions): what keeping it float costs."""
    import torch

    from ptopt.core.inputspec import batch_size_of, call_model

    out: dict[str, float] = {}
    hooks = []
    for name, m in module.named_modules():
        w = (
            getattr(m, "weight", None)
            if not isinstance(m, torch.nn.RNNBase)
            else getattr(m, "weight_ih_l0", None)
        )
        if not name or not isinstance(w, torch.Tensor) or w.dim() < 2:
            continue
        params = sum(p.numel() for p in m.parameters(recurse=False))

        def hook(mod, inp, y, name=name, rows=w.shape[0], params=params):
            y = y[0] if isinstance(y, (tuple, list)) else y
            if isinstance(y, torch.Tensor):
                out[name] = params * y.numel() / max(rows, 1) / max(batch_size_of(example), 1)

        hooks.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            call_model(module, example)
    finally:
        for h in hooks:
            h.remove()
    return out


def weight_layers(module: Any) -> dict[str, Any]:
    """The layers with weights: ``{name: (module, parameter count)}`` of each module with parameters of
    its own. A parametrized layer (``weight_norm``: ``conv.parametrizations.weight`` holds ``original0``
    and ``original1``) is one layer, its parametrizations' parameters counted as its own."""
    out: dict[str, Any] = {}
    for n, m in module.named_modules():
        count = sum(p.numel() for p in m.parameters(recurse=False))
        owner, sep, _ = n.rpartition(".parametrizations.")
        if sep and count:
            out[owner] = (module.get_submodule(owner), out.get(owner, (None, 0))[1] + count)
        elif n and count and not sep:
            out[n] = (m, count)
    return out


def int8_share(module: Any, example: Any, float_layers: dict[str, str]) -> dict[str, Any]:
    """What share of the model is int8: its layers with weights (:func:`weight_layers`), their
    parameters, and their multiply-accumulates per sample (:func:`layer_macs`), each layer int8 unless
    ``float_layers`` lists it."""
    own = {n: count for n, (_, count) in weight_layers(module).items()}
    int8 = [n for n in own if n not in float_layers]
    macs = layer_macs(module, example)
    total_params, total_macs = sum(own.values()), sum(macs.values())
    return {
        "layers": len(int8),
        "of_layers": len(own),
        "parameters": sum(own[n] for n in int8) / total_params if total_params else 0.0,
        "macs": sum(macs.get(n, 0.0) for n in int8) / total_macs if total_macs else 0.0,
    }
