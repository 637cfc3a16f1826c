"""Frozen config dataclasses that round-trip through plain dicts with a ``type`` key.

Techniques and targets are configs (quantization, pruning, distillation, training, export). A
sidecar records the config that produced its artifact (``Config.to_dict``), and a recipe step may
give its twin's ``config=`` as such a mapping (``config: {type: prune-global, amount: 0.5}``), read
back by :func:`config_from_dict` through the registry below (``ptopt.pipeline``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from ptopt.core.errors import UsageError
from ptopt.core.options import OPT

_CONFIGS: dict[str, type[Config]] = {}

C = TypeVar("C", bound="Config")


@dataclasses.dataclass(frozen=True)
class Config:
    """Base of every technique/target config. Subclasses set ``type_name`` and register."""

    type_name: ClassVar[str] = "config"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type_name}
        for f in dataclasses.fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        return out

    def replace(self: C, **changes: Any) -> C:
        return dataclasses.replace(self, **changes)


def register_config(cls: type[C]) -> type[C]:
    """Class decorator: make ``config_from_dict`` know ``cls`` by its ``type_name``."""
    name = cls.type_name
    if name in _CONFIGS and _CONFIGS[name] is not cls:
        raise RuntimeError(f"config type {name!r} registered twice")
    _CONFIGS[name] = cls
    return cls


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build a registered config from its dict; unknown types or fields are a UsageError."""
    if not isinstance(data, dict) or "type" not in data:
        raise UsageError(f"a config must be a mapping with a 'type' key, got {data!r}")
    name = data["type"]
    cls = _CONFIGS.get(name)
    if cls is None:
        known = ", ".join(sorted(_CONFIGS)) or "none registered"
        raise UsageError(f"unknown config type {name!r} (known: {known})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    data = _canonical(data, fields)
    unknown = sorted(set(data) - set(fields) - {"type"})
    if unknown:
        raise UsageError(
            f"config {name!r} has no option(s) {', '.join(unknown)}; it takes {', '.join(fields)}"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {k: _coerce(hints.get(k), v) for k, v in data.items() if k != "type"}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise UsageError(f"config {name!r}: {e}") from e


def _canonical(data: dict[str, Any], fields: dict[str, dataclasses.Field]) -> dict[str, Any]:
    """``data`` with an option's other keyword spellings (its ``Opt.aliases`` and old names, e.g. an
    older sidecar's) under the field's name."""
    names = {}
    for name, f in fields.items():
        opt = f.metadata.get(OPT)
        for other in (*getattr(opt, "aliases", ()), *getattr(opt, "deprecated", {})):
            if not other.startswith("-"):
                names[other] = name
    return {names.get(k, k): v for k, v in data.items()}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _coerce(hint: Any, value: Any) -> Any:
    """Lists from JSON/YAML become tuples where the field is a tuple (configs are frozen)."""
    origin = typing.get_origin(hint)
    if isinstance(value, list) and (origin is tuple or hint is tuple):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for arg in typing.get_args(hint):
            if typing.get_origin(arg) is tuple and isinstance(value, list):
                return tuple(value)
    return value


def reconcile(config: Any, options: Mapping[str, Any], fields: Mapping[str, str] | None = None) -> None:
    """Refuse loose ``options`` (not None) that contradict ``config``: a config replaces them.

    ``fields`` maps an option's name to the config field it sets (``exclude`` → ``float_modules``).
    An option equal to the config's value (after the config's own normalization) is accepted.
    """
    fields = fields or {}
    known = {f.name for f in dataclasses.fields(config)}
    for name, value in options.items():
        if value is None:
            continue
        field = fields.get(name, name)
        if field not in known:
            raise UsageError(f"{name}= does not apply to a {type(config).__name__}")
        if dataclasses.replace(config, **{field: value}) != config:
            raise UsageError(
                f"{name}={_show(value)} contradicts the given {type(config).__name__} "
                f"({field}={_show(getattr(config, field))}); set it in the config or leave it out"
            )


def _show(value: Any) -> str:
    return repr(tuple(value) if isinstance(value, list) else value)
