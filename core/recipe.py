"""Recipe files: a YAML list of steps, each ``{command: {option: value}}``, replayable by ``ptopt run``.

Each compress/export command can write the recipe of what it just did (``--save-recipe``); the
options are those of the command's Python twin (``ptopt.quantize(**options)``), so a step is
replayed by calling the twin with them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptopt.core.errors import UsageError

RECIPE_VERSION = 1
#: the top-level keys a recipe may have (a typo in one must not be silently ignored)
TOP_LEVEL_KEYS = ("version", "vars", "steps")
#: a step's key that is a flag's name for a twin's own argument, beside its keyword (which
#: ``--save-recipe`` writes: the twin takes it, so a saved step replays in Python): key → keyword.
#: A declared option's recipe key is its flag's name (``ptopt.core.options.Declared.key``).
TWIN_KEYWORDS = {"input_shape": "input_shapes"}


def recipe_step(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """One step, each option under its recipe key (its flag's name: ``batch_size`` for optimize's
    ``--batch-size``, ``per_tensor: true`` for ``--per-tensor``); None values and empty tuples are
    dropped, tuples become lists, paths strings."""
    clean: dict[str, Any] = {}
    for k, v in _recipe_keys(command, options).items():
        if v is None or v == () or v == []:
            continue
        if isinstance(v, tuple):
            v = list(v)
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        clean[k] = v
    return {command: clean}


def _recipe_keys(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` (the twin's keywords) with each declared option under its recipe key (the command's
    ``Options``, found through the command table; the twin takes these keys too)."""
    import importlib

    from ptopt.commands import COMMANDS

    cmd = COMMANDS.get(command)
    if cmd is None or not cmd.twin:
        return options
    module, _, attr = cmd.twin.partition(":")
    spec = getattr(getattr(importlib.import_module(module), attr, None), "__ptopt_options__", None)
    return spec.recipe_keys(options) if spec is not None else options


def save_recipe(path: str | os.PathLike, steps: list[dict[str, Any]]) -> None:
    import yaml

    from ptopt.core.artifact import write_text_atomic

    write_text_atomic(path, yaml.safe_dump({"version": RECIPE_VERSION, "steps": steps}, sort_keys=False))


def load_recipe(path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"recipe {p}: no such file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(
            f"recipe {p}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8"
        ) from None
    except yaml.YAMLError as e:
        raise UsageError(f"recipe {p}: not valid YAML: {_yaml_problem(e)}") from None
    return check_recipe(data, f"recipe {p}")


def _yaml_problem(e: Exception) -> str:
    """PyYAML's multi-line message as one line: the problem and where it is."""
    problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(e).split())


def check_recipe(data: Any, source: str = "recipe") -> dict[str, Any]:
    """The shape of a recipe: a mapping with a ``steps`` list, each step one ``{command: {options}}``."""
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise UsageError(f"{source}: needs a top-level 'steps' list")
    unknown = sorted(str(k) for k in data if k not in TOP_LEVEL_KEYS)
    if unknown:
        raise UsageError(
            f"{source}: unknown top-level key(s) {', '.join(unknown)} (known: {', '.join(TOP_LEVEL_KEYS)})"
        )
    version = data.get("version", RECIPE_VERSION)
    if version != RECIPE_VERSION:
        raise UsageError(
            f"{source}: version {version!r} is not one this ptopt reads (it reads version {RECIPE_VERSION})"
        )
    for i, step in enumerate(data["steps"]):
        if not (
            isinstance(step, dict)
            and len(step) == 1
            and isinstance(next(iter(step.values())), (dict, type(None)))
        ):
            raise UsageError(
                f"{source}: step {i + 1} must be one mapping {{command: {{options}}}}, got {step!r}"
            )
    return data
