"""Calibration done once for a search that builds many int8 models of one model (``--engine auto``).

What an observer records during calibration (min/max, a histogram) depends only on the fp32 tensor it
sees: an observed model computes in fp32, so a tensor outside the modules a candidate keeps float has
the same values in every candidate. Within :func:`reused`, the first calibration of each engine
(``key``) runs for real and remembers, for every observer, a fingerprint of what it saw on the first
batch (shape, sum, sum of squares, largest magnitude) and its state after the last batch. A later
calibration runs the first batch once with its observers only fingerprinting (no histogram work), and
when every observer finds a remembered one of its class that saw the same tensor (within float
rounding: a BatchNorm folded in one candidate and not in the other), their states are copied and the
calibration is skipped; otherwise it runs for real (and what it saw is remembered too). The artifact
``--engine auto`` writes is calibrated for real by its engine's handler, outside :func:`reused`.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Callable, Iterator
from typing import Any

#: relative difference under which two fingerprints are one tensor (fp32 rounding of folded BatchNorm)
RTOL = 1e-4
_STORE: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("ptopt_observed", default=None)


@contextlib.contextmanager
def reused(store: dict[str, Any]) -> Iterator[None]:
    """Calibrations inside reuse the observers' states of earlier ones kept in ``store`` (one model's)."""
    token = _STORE.set(store)
    try:
        yield
    finally:
        _STORE.reset(token)


def calibrated(prepared: Any, first: Callable[[], Any], run: Callable[[], Any], key: str) -> Any:
    """``run()`` (calibrating ``prepared``, in eval mode, whose first batch ``first()`` gives) or, within
    :func:`reused`, the observers' states of an earlier calibration of ``key`` that saw the same tensors;
    ``run``'s value either way (the earlier one's when reused). Outside :func:`reused` only ``run`` runs."""
    store = _STORE.get()
    if store is None:
        return run()
    observers, first = _observers(prepared), first()
    if not observers or first is None:
        return run()
    entries, value = store.get(key, ([], None))
    if entries and _copied(prepared, observers, first, entries):
        return value
    seen: dict[str, Any] = {}
    hooks = [obs.register_forward_pre_hook(_recorder(seen, name)) for name, obs in observers.items()]
    try:
        value = run()
    finally:
        for h in hooks:
            h.remove()
    entries = entries + [_entry(seen[n], o) for n, o in observers.items() if seen.get(n) is not None]
    store[key] = (entries, value)
    return value


def _observers(prepared: Any) -> dict[str, Any]:
    """The observers of an observed model (torch.ao's in FX graphs, torchao's in PT2E graphs)."""
    return {
        n: m
        for n, m in prepared.named_modules()
        if "Observer" in type(m).__name__ and hasattr(m, "calculate_qparams")
    }


def _recorder(seen: dict[str, Any], name: str) -> Callable[..., None]:
    def hook(mod: Any, args: Any) -> None:
        if name not in seen and args:
            seen[name] = _fingerprint(args[0])

    return hook


def _fingerprint(x: Any) -> tuple[Any, ...] | None:
    import torch

    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not x.numel():
        return None
    d = x.detach().double()
    return tuple(x.shape), float(d.sum()), float((d * d).sum()), float(d.abs().max())


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Two fingerprints of one tensor (within fp32 rounding)."""
    if a[0] != b[0]:
        return False
    numel = 1
    for n in a[0]:
        numel *= n
    scales = ((a[2] * numel) ** 0.5, a[2], a[3])
    return all(abs(x - y) <= RTOL * s + 1e-12 for x, y, s in zip(a[1:], b[1:], scales, strict=True))


#: what an observer's state means: the same class with the same of these reads it the same
_ATTRS = ("ch_axis", "dtype", "qscheme", "bins", "quant_min", "quant_max", "reduce_range")


def _entry(fp: tuple[Any, ...], obs: Any) -> tuple[Any, ...]:
    state = {k: v.detach().clone() for k, v in obs.state_dict().items()}
    return fp, type(obs), tuple(getattr(obs, a, None) for a in _ATTRS), state


def _copied(prepared: Any, observers: dict[str, Any], first: Any, entries: list) -> bool:
    """Whether every observer of ``prepared`` found an earlier one that saw its tensor on ``first`` (their
    states then copied in); the observers untouched otherwise."""
    import torch

    from ptopt.core.inputspec import call_model

    seen: dict[str, Any] = {}
    for name, obs in observers.items():  # the first batch once, each observer only fingerprinting
        obs.forward = _passing(seen, name)
    try:
        with torch.no_grad():
            call_model(prepared, first)
    except Exception:  # noqa: BLE001 - the real calibration runs (and says what fails)
        return False
    finally:
        for obs in observers.values():
            del obs.forward
    found = {}
    for name, obs in observers.items():
        fp, attrs = seen.get(name), tuple(getattr(obs, a, None) for a in _ATTRS)
        match = fp is not None and next(
            (e for e in entries if e[1] is type(obs) and e[2] == attrs and _same(e[0], fp)), None
        )
        if not match:
            return False
        found[name] = match[3]
    before = {name: copy.deepcopy(obs.state_dict()) for name, obs in observers.items()}
    try:
        for name, obs in observers.items():
            obs.load_state_dict(copy.deepcopy(found[name]))
    except (RuntimeError, KeyError):  # a state this observer cannot take: calibrate for real
        for name, obs in observers.items():
            obs.load_state_dict(before[name])
        return False
    return True


def _passing(seen: dict[str, Any], name: str) -> Callable[..., Any]:
    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        seen.setdefault(name, _fingerprint(x))
        return x

    return forward
