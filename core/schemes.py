"""MODEL-reference schemes (``SCHEME:NAME``): a registry, so core resolves ``zoo:resnet`` without
knowing which stage holds the zoo.

A stage (or the package wiring in ``ptopt/_schemes.py``) registers a loader per scheme; core's
``load_model`` looks the scheme up here. Imports nothing heavy: registering happens at ``import ptopt``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

#: loader(name) -> (nn.Module, input specs, input style) for ``SCHEME:name``
SchemeLoader = Callable[[str], "tuple[Any, list[Any], str]"]


@dataclasses.dataclass(frozen=True)
class ModelScheme:
    scheme: str
    loader: SchemeLoader
    #: what ``SCHEME:NAME`` means, for help and error messages
    description: str = ""


_SCHEMES: dict[str, ModelScheme] = {}


def register_model_scheme(scheme: str, loader: SchemeLoader, description: str = "") -> None:
    """Make ``load_model("SCHEME:NAME")`` call ``loader(NAME)``. Registering a scheme twice with
    another loader is a programming error."""
    if not scheme.isidentifier():
        raise ValueError(f"a model scheme is a plain name, got {scheme!r}")
    old = _SCHEMES.get(scheme)
    if old is not None and old.loader is not loader:
        raise RuntimeError(f"model scheme {scheme!r} registered twice")
    _SCHEMES[scheme] = ModelScheme(scheme, loader, description)


def model_scheme(ref: str) -> tuple[ModelScheme, str] | None:
    """``(scheme, name)`` when ``ref`` is ``SCHEME:NAME`` with a registered scheme, else None."""
    scheme, sep, name = ref.partition(":")
    if not sep or scheme not in _SCHEMES:
        return None
    return _SCHEMES[scheme], name


def model_scheme_forms() -> list[str]:
    """``["zoo:NAME", ...]``: the registered schemes, as error messages list them."""
    return [f"{s}:NAME" for s in sorted(_SCHEMES)]
