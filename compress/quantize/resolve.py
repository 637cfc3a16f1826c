"""The options of ``quantize`` resolved: one config (the mode's, from ``config=`` or the loose keywords
of ``config.OPTIONS``) and the search's options, the config checked against the technique table
(``table.check_config``). Apart from ``config``: the table's rows import the configs, and a config
reading the table would close that loop."""

from __future__ import annotations

from typing import Any

from ptopt.compress.quantize.config import CONFIGS, OPTIONS, QuantConfig, SearchOptions, _modes
from ptopt.core.config import reconcile
from ptopt.core.errors import UsageError


def resolve_config(
    mode: str | None, config: QuantConfig | None, options: dict[str, Any]
) -> tuple[QuantConfig, SearchOptions]:
    """The config and the search options from ``config`` or the loose ``options`` (keywords of
    ``OPTIONS``, refused where they do not apply to the mode); a config with a contradicting option
    (or another ``mode``) is refused."""
    if config is not None and mode is not None and mode != config.mode:
        raise UsageError(
            f"mode {mode!r} contradicts the given {type(config).__name__} (mode {config.mode!r})"
        )
    chosen = config.mode if config is not None else mode
    if chosen not in CONFIGS:
        raise UsageError(f"unknown mode {chosen!r} (known: {', '.join(_modes())})")
    given = OPTIONS.check(options, chosen)
    search = OPTIONS.build(SearchOptions, given)
    if config is None:
        config = OPTIONS.build(CONFIGS[chosen], given)
    else:
        reconcile(config, OPTIONS.of(type(config), given))
    check_engine(config)
    return config, search


def check_engine(config: QuantConfig) -> QuantConfig:
    """``config`` when the technique table has a row for its mode and engine that takes its options;
    UsageError otherwise. (Not in ``__post_init__``: the table's rows import the configs, and a config
    reading the table would close that loop; every path from options to a quantized model calls it.)"""
    from ptopt.compress.quantize.table import check_config  # loads every row

    check_config(config)
    return config
