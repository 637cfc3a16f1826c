"""Figures kept between runs: a measurement that depends only on what its facts name (a distillation
teacher's perplexity on an evaluation text: its weights, the text, the window, the libraries) is
computed once and read back by the next run that names the same facts.

Entries live in ``$PTOPT_CACHE_DIR/figures/<kind>/<key>.json`` (default ``~/.cache/ptopt``): the facts
and the figure, written atomically; ``key`` is the sha256 of the facts, and a read compares the
stored facts too. A cache folder that cannot be written is no error (the figure is just not kept).
``PTOPT_FIGURE_CACHE=0`` turns the cache off (a benchmark that times the measurement does).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "cache_root", "figure_key", "read_figure", "store_figure"]

#: "0" turns the cache off
CACHE_ENV = "PTOPT_FIGURE_CACHE"


def cache_root() -> Path:
    """ptopt's cache folder: ``$PTOPT_CACHE_DIR``, else ``~/.cache/ptopt``."""
    root = os.environ.get("PTOPT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ptopt")
    return Path(root)


def _enabled() -> bool:
    return os.environ.get(CACHE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _canonical(facts: dict[str, Any]) -> str:
    return json.dumps(facts, sort_keys=True, default=str)


def figure_key(facts: dict[str, Any]) -> str:
    """The sha256 (40 hex) of ``facts`` (JSON, keys sorted; what JSON cannot hold by its ``str``)."""
    return hashlib.sha256(_canonical(facts).encode()).hexdigest()[:40]


def _entry(kind: str, facts: dict[str, Any]) -> Path:
    return cache_root() / "figures" / kind / f"{figure_key(facts)}.json"


def read_figure(kind: str, facts: dict[str, Any]) -> dict[str, Any] | None:
    """The figure stored for ``facts``, or None (none stored, the cache off, an unreadable entry)."""
    if not _enabled():
        return None
    try:
        stored = json.loads(_entry(kind, facts).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("facts") != json.loads(_canonical(facts)):
        return None
    figure = stored.get("figure")
    return figure if isinstance(figure, dict) else None


def store_figure(kind: str, facts: dict[str, Any], figure: dict[str, Any]) -> None:
    """Keep ``figure`` for ``facts`` (atomically; nothing when the cache is off or not writable)."""
    if not _enabled():
        return
    from ptopt.core.atomic import atomic_path

    body = json.dumps({"facts": json.loads(_canonical(facts)), "figure": figure}, sort_keys=True, default=str)
    try:
        with atomic_path(_entry(kind, facts)) as tmp:
            tmp.write_text(body)
    except OSError:
        return
