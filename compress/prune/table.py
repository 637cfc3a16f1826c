"""The pruning table: config class -> pruner, one row per method, filled by registration.

A file of ``ptopt.compress.prune.techniques`` decorates its pruner class with
``registry.register_pruner`` (``@register_pruner(StructuredPruneConfig)``); the table imports every
module of that package the first time it is read, so a new method is its config (``config.py``), its
pruner file and the row its decorator adds: no list names them. ``ptopt prune --method`` choices
are :func:`methods`.

A pruner is built as ``cls(config, model, example_inputs)`` and has ``step(model, amount) -> model``
(masks may stay trainable) and ``finish(model) -> (model, report)``, plus ``precision``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ptopt.compress.prune.registry import PRUNERS
from ptopt.core.errors import UsageError

_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    from ptopt.compress.prune import techniques

    for info in pkgutil.iter_modules(techniques.__path__):
        importlib.import_module(f"{techniques.__name__}.{info.name}")
    _loaded = True


def configs() -> dict[str, type]:
    """method name -> its config class, in registration order."""
    _load()
    return {cls.method: cls for cls in PRUNERS}


def methods() -> list[str]:
    """The ``--method`` choices."""
    return list(configs())


def config_class(method: str) -> type:
    known = configs()
    if method not in known:
        raise UsageError(f"unknown pruning method {method!r} (choose from {', '.join(known)})")
    return known[method]


def make_pruner(config: Any, model: Any, example_inputs: Any) -> Any:
    _load()
    return PRUNERS[type(config)](config, model, example_inputs)


def options() -> Any:
    """The options of ``ptopt prune`` / ``ptopt.prune`` (``ptopt.core.options``): every method's config,
    the fine-tuning's, and the trainer's and distillation loss's it uses."""
    return _OPTIONS


def _groups() -> tuple[Any, ...]:
    from ptopt.compress.distill_config import DistillConfig
    from ptopt.compress.prune.config import FineTuneOptions
    from ptopt.compress.trainer import TrainConfig
    from ptopt.core.options import Part

    return (
        *configs().values(),
        FineTuneOptions,
        Part(TrainConfig, ("lr", "batch_size", "seed")),
        Part(DistillConfig, ("temperature", "alpha")),
    )


def _takes(method: str) -> Any:
    from ptopt.core.options import fields_of

    return fields_of(config_class(method)).keys()


def _make_options() -> Any:
    from ptopt.core.options import Options, Selector

    return Options(
        "prune",
        _groups,
        Selector(
            "method",
            "l1-unstructured: each layer to --amount sparsity; global: one ranking across layers; structured: "
            "remove whole channels (a smaller, faster model).",
            methods,
            _takes,
            label=lambda c: getattr(c, "method", "") or c.__name__,
        ),
    )


_OPTIONS = _make_options()
