"""What is measured per artifact besides latency: the task metric on labels, agreement with the
reference, size on disk, and peak memory.

The task metric (``--metric``): ``top1`` (default), ``top5``, ``mse``, ``mae``, or a user function
``pkg.mod:fn`` called as ``fn(outputs, labels) -> float`` on the outputs of the whole data set
(``outputs`` the model's primary output as a float tensor, ``labels`` the data's ``y``). A user
function is taken as higher-is-better in its own units; set ``fn.higher_is_better = False`` for a
loss, or ``fn.percent = True`` when it returns a fraction to show as % (drops then in points).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ptopt.core.errors import UsageError

_FN_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[Any, Any], float]
    higher_is_better: bool = True
    #: a fraction in [0, 1] shown as %; drops are then in percentage points
    percent: bool = False
    needs_labels: bool = True

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "higher_is_better": self.higher_is_better,
            "unit": "%" if self.percent else "",
            "needs_labels": self.needs_labels,
        }

    def scale(self) -> float:
        """Multiplier turning a metric difference into the unit drops are reported in (points for %)."""
        return 100.0 if self.percent else 1.0


def topk_accuracy(outputs: Any, labels: Any, k: int = 1) -> float:
    """Fraction of samples whose label is among the k highest outputs; for [N, tokens, vocab]
    outputs with [N, tokens] labels, the fraction of token positions."""
    import torch

    if outputs.dim() == 3 and tuple(labels.shape) == tuple(outputs.shape[:2]):
        outputs, labels = outputs.reshape(-1, outputs.shape[-1]), labels.reshape(-1)
    if outputs.dim() != 2:
        raise UsageError(f"top-{k} accuracy needs outputs of shape [N, classes], got {tuple(outputs.shape)}")
    k = min(k, outputs.shape[1])
    top = outputs.topk(k, dim=1).indices
    return float((top == labels.reshape(-1, 1).to(top.device)).any(dim=1).to(torch.float64).mean())


def _top1(o: Any, y: Any) -> float:
    return topk_accuracy(o, y, 1)


def _top5(o: Any, y: Any) -> float:
    return topk_accuracy(o, y, 5)


def _mse(o: Any, y: Any) -> float:
    return float(((o.reshape(y.shape).double() - y.double()) ** 2).mean())


def _mae(o: Any, y: Any) -> float:
    return float((o.reshape(y.shape).double() - y.double()).abs().mean())


BUILTIN_METRICS = {
    "top1": Metric("top1", _top1, True, True),
    "top5": Metric("top5", _top5, True, True),
    "mse": Metric("mse", _mse, False, False),
    "mae": Metric("mae", _mae, False, False),
}


def resolve_metric(metric: str | Callable | Metric) -> Metric:
    """A builtin name, ``pkg.mod:fn``, a callable or a Metric."""
    if isinstance(metric, Metric):
        return metric
    if callable(metric):
        return _from_callable(getattr(metric, "__name__", "metric"), metric)
    text = str(metric)
    if text in BUILTIN_METRICS:
        return BUILTIN_METRICS[text]
    if not _FN_RE.match(text):
        raise UsageError(
            f"unknown metric {text!r}: use {', '.join(BUILTIN_METRICS)} or a function pkg.module:fn"
        )
    module_name, _, fn_name = text.partition(":")
    from ptopt.core.data import import_user_module

    try:
        module = import_user_module(module_name)
    except Exception as e:  # noqa: BLE001 - anything the user's module raises
        raise UsageError(f"metric {text!r}: cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise UsageError(f"metric {text!r}: {module_name!r} has no function {fn_name!r}")
    return _from_callable(text, fn)


def _from_callable(name: str, fn: Callable) -> Metric:
    return Metric(
        name,
        fn,
        bool(getattr(fn, "higher_is_better", True)),
        bool(getattr(fn, "percent", False)),
        bool(getattr(fn, "needs_labels", True)),
    )


def compute_metric(metric: Metric, outputs: Any, labels: Any) -> float:
    try:
        value = metric.fn(outputs, labels)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - a user metric failing is a usage problem, reported once
        raise UsageError(f"metric {metric.name!r} failed: {type(e).__name__}: {e}") from None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UsageError(f"metric {metric.name!r} returned {type(value).__name__}, not a number") from None


def is_classification(outputs: Any) -> bool:
    """[N, classes] logits, or [N, tokens, vocab] (a language model's: classes per token)."""
    return outputs.dim() in (2, 3) and outputs.shape[-1] >= 2


def agreement(reference: Any, outputs: Any, *, class_scores: bool = True, mask: Any = None) -> dict[str, Any]:
    """How closely ``outputs`` follow the reference's on the same samples.

    ``top1_agreement``: fraction of samples whose arg-max class matches the reference's, for
    [N, classes] outputs; for [N, tokens, vocab] (language-model logits) the fraction of all token
    positions whose arg-max matches (``top1_per`` says which); None for other outputs, and where
    ``class_scores`` is False (``core.scores``: features, whose arg-max is one feature dimension).
    ``cosine``: mean per-sample cosine similarity of the flattened outputs; ``min_cosine``: the worst
    sample's; ``max_abs_diff``: the largest element-wise difference. ``mask``: the data's
    ``attention_mask`` ([N, T]); an output per token ([N, T, ...]) is then judged at the real tokens
    only (a padded position's output is read by nothing: all-MiniLM-L6-v2's OpenVINO int8
    ``last_hidden_state`` scored a worst cosine of 0.58 with its padding, 0.99 without).
    """
    if tuple(reference.shape) != tuple(outputs.shape):
        return {
            "top1_agreement": None,
            "cosine": None,
            "min_cosine": None,
            "max_abs_diff": None,
            "note": f"output shape {tuple(outputs.shape)} differs from the reference's {tuple(reference.shape)}",
        }
    real = real_token_mask(reference, mask)
    reference, outputs = at_real_tokens(reference, outputs, mask)
    a = reference.reshape(reference.shape[0], -1).double()
    b = outputs.reshape(outputs.shape[0], -1).double()
    cos = per_sample_cosine(reference, outputs)
    top1, per = None, None
    if class_scores and is_classification(reference):
        same = reference.argmax(-1) == outputs.argmax(-1)
        top1 = float(same[real].double().mean() if real is not None else same.double().mean())
        per = "sample" if reference.dim() == 2 else "token"
    out = {"top1_agreement": top1, "cosine": float(cos.mean()), "min_cosine": float(cos.min())}
    out["max_abs_diff"] = float((a - b).abs().max())
    if per == "token":
        out["top1_per"] = "token"
    return out


def real_token_mask(reference: Any, mask: Any) -> Any:
    """The real tokens ([N, T] bool) of an output per token ([N, T, ...], 3-d or more) under the data's
    ``attention_mask``; None where that does not apply (no mask, another shape, no padding)."""
    import torch

    if mask is None or not isinstance(mask, torch.Tensor) or reference.dim() < 3:
        return None
    if mask.dim() != 2 or tuple(reference.shape[:2]) != tuple(mask.shape):
        return None
    real = mask.to(reference.device) != 0
    return None if bool(real.all()) else real


def at_real_tokens(reference: Any, outputs: Any, mask: Any) -> tuple[Any, Any]:
    """``reference`` and ``outputs`` zeroed at the padded positions of ``mask`` where they are per
    token (:func:`real_token_mask`), else as given: a padded position then adds to no figure."""
    real = real_token_mask(reference, mask)
    if real is None:
        return reference, outputs
    keep = real.reshape(*real.shape, *([1] * (reference.dim() - 2)))
    return reference.where(keep, 0), outputs.where(keep, 0)


def real_tokens_only(out: Any, x: Any) -> Any:
    """One batch's output ``out`` zeroed at the padded positions of its inputs ``x`` (their
    ``attention_mask``) where it is per token (:func:`at_real_tokens`): what every figure compares."""
    return at_real_tokens(out, out, attention_mask_of(x))[0]


def attention_mask_of(x: Any) -> Any:
    """The data's ``attention_mask`` (a dict batch's), else None."""
    return x.get("attention_mask") if isinstance(x, dict) else None


def per_sample_cosine(reference: Any, outputs: Any) -> Any:
    """Each sample's cosine similarity between its flattened outputs and the reference's (a float64
    tensor of N values; the shapes must match)."""
    import torch

    a = reference.reshape(reference.shape[0], -1).double()
    b = outputs.reshape(outputs.shape[0], -1).double()
    return torch.nn.functional.cosine_similarity(a, b, dim=1, eps=1e-12)


def size_info(files: list[Path], module: Any = None, gzip: bool = True) -> dict[str, Any]:
    """Bytes on disk of all the artifact's files and after gzip. A model without a file (zoo:NAME,
    pkg.mod:factory) is measured as its serialized state_dict, and says so. ``gzip=False``: no gzip
    figure (a language model's weights: deflating SmolLM2-135M's 540 MB took 48 s for a figure no LM
    report shows; float weights barely compress)."""
    from ptopt.core.artifact import gzip_size

    files = [Path(f) for f in files if Path(f).is_file()]
    if files:
        return {
            "bytes": sum(f.stat().st_size for f in files),
            "gzip_bytes": gzip_size(files) if gzip else None,
            "files": [f.name for f in files],
            "what": "files",
        }
    if module is not None and hasattr(module, "state_dict"):
        import torch

        from ptopt.core.artifact import gzip_bytes

        buf = io.BytesIO()
        torch.save(module.state_dict(), buf)
        raw = buf.getvalue()
        return {
            "bytes": len(raw),
            "gzip_bytes": gzip_bytes(raw) if gzip else None,
            "files": [],
            "what": "state_dict (no file)",
        }
    return {"bytes": None, "gzip_bytes": None, "files": [], "what": "unknown"}


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    """One full ``gc.collect()``, then the heap's objects frozen (``gc.freeze``) until the block ends, so
    the collections inside (``PeakMemory``'s, one per model) scan only the objects made since: the
    probes' and the models' own garbage. A full pass costs ~0.15-0.3 s in a fresh CLI process and grows
    with the heap (seconds in a long-lived one: a notebook, an optimize search, a test worker); it ran
    once per model before (200 s of the profiled test suite's CPU). Process-wide, as ``gc`` is: where
    someone else froze objects already (a pre-forking server, another thread's validate, a test runner),
    nothing is frozen or unfrozen here: the collections inside scan what that freeze left out. Finding
    that out (``gc.get_freeze_count``) walks the frozen objects: ~0.09 s per 6 million, a sixth of a full
    pass over them."""
    import gc

    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class PeakMemory:
    """Peak resident memory while a block runs (Linux: VmHWM, reset through /proc/self/clear_refs).

    ``peak_mb`` is the process's high-water mark during the block; ``delta_mb`` what the block added
    over the resident memory at its start (loading the artifact plus running it). None where the
    kernel does not allow resetting the mark. Its ``gc.collect()`` first frees earlier models' cycles:
    inside ``older_objects_frozen`` it scans only what was made since.
    """

    def __init__(self) -> None:
        self.peak_mb: float | None = None
        self.delta_mb: float | None = None
        self._start: float | None = None

    def __enter__(self) -> PeakMemory:
        import gc

        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
            self._start = _status_kb("VmRSS") / 1024
        except (OSError, TypeError):
            self._start = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._start is None:
            return
        hwm = _status_kb("VmHWM")
        if hwm is not None:
            self.peak_mb = hwm / 1024
            self.delta_mb = max(0.0, self.peak_mb - self._start)


def _status_kb(key: str) -> float | None:
    if not os.path.exists("/proc/self/status"):
        return None
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return float(line.split()[1])
    return None
