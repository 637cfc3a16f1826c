"""``ptopt run recipe.yaml``: a pipeline of steps, each calling one command's Python twin by name.

A recipe (the ``ptopt.core.recipe`` format, as ``--save-recipe`` writes it)::

    version: 1
    vars:                       # optional; ${name} anywhere in a step; --var name=value overrides
      model: zoo:resnet
      out: build
    steps:
      - quantize: {id: int8, model: "${model}", mode: static, calib_data: builtin:digits32:train,
                   output: "${out}/resnet.int8.pt"}
      - export:   {model: "${int8.output}", target: onnx, output: "${out}/resnet.int8.onnx"}
      - validate: {reference: "${model}", artifacts: ["${int8}", "${prev}"], data: builtin:digits32:test,
                   max_accuracy_drop: 1.0, json_path: "${out}/validate.json"}

Each step is ``{command: {option: value}}``; the options are the twin's keyword arguments
(``ptopt.quantize(model=..., mode=..., output=...)``). ``id`` names a step so later steps can refer
to what it produced: ``${ID}`` or ``${ID.output}`` is the artifact path it wrote, ``${prev}`` the
previous step's; a validate step offers ``${ID.passed}``, ``${ID.best}`` and ``${ID.json}``. A value
that is exactly ``${...}`` keeps its type (a list var stays a list). Relative paths are relative to
the working directory.

Before any step runs, every step is checked: known command, its twin importable, its options
accepted by the twin's signature, every ``${...}`` defined by a var or an earlier step. A validate
step whose gates fail stops the pipeline with exit 1 (its reports are written first).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
from collections.abc import Callable
from typing import Any

from ptopt.core.errors import GateFailedError, UsageError

#: step name -> its Python twin
TWINS: dict[str, str] = {
    "quantize": "ptopt.compress.quantize:quantize",
    "prune": "ptopt.compress.prune:prune",
    "distill": "ptopt.compress.distill:distill",
    "export": "ptopt.export.api:export",
    "validate": "ptopt.validate.api:validate",
    "package": "ptopt.serve.package:package",
}

#: what ``${ID.attr}`` can name, per kind of step result
ARTIFACT_ATTRS = ("output", "path", "format", "precision")
VALIDATE_ATTRS = ("passed", "best", "json", "junit", "markdown", "html")

_REF = re.compile(r"\$\{([A-Za-z_][\w-]*)(?:\.([A-Za-z_]\w*))?\}")


@dataclasses.dataclass
class Step:
    number: int  # 1-based
    command: str
    options: dict[str, Any]
    id: str | None
    twin: Callable[..., Any]

    @property
    def label(self) -> str:
        return f"step {self.number} ({self.command}{', id ' + self.id if self.id else ''})"


@dataclasses.dataclass
class StepResult:
    step: Step
    options: dict[str, Any]  # after substitution
    value: Any  # what the twin returned
    outputs: dict[str, Any]


def resolve_twin(command: str, where: str) -> Callable[..., Any]:
    if command not in TWINS:
        raise UsageError(f"{where}: unknown command {command!r} (known: {', '.join(TWINS)})")
    module_name, _, attr = TWINS[command].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(
            f"{where}: the {command!r} step's Python twin {TWINS[command]} is not available in this "
            f"installation ({e})"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"{where}: {module_name} has no function {attr!r} (the {command!r} step's twin)")
    return fn


def parse_vars(items: Any) -> dict[str, Any]:
    """``["out=build", ...]`` (``--var``) → dict; values parsed as YAML scalars (1.0, true, [a, b])."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or ():
        name, sep, value = str(item).partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--var {item!r}: write NAME=VALUE")
        try:
            out[name.strip()] = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            out[name.strip()] = value
    return out


def plan(
    recipe: dict[str, Any], variables: dict[str, Any] | None = None, source: str = "recipe"
) -> tuple[list[Step], dict]:
    """Check a loaded recipe without running anything; returns its steps and the vars in effect."""
    rvars = recipe.get("vars") or {}
    if not isinstance(rvars, dict):
        raise UsageError(f"{source}: 'vars' must be a mapping of name: value")
    merged = {**rvars, **(variables or {})}
    steps: list[Step] = []
    kinds: dict[str, str] = {}  # id -> command, of the steps seen so far
    for i, raw in enumerate(recipe["steps"], start=1):
        command, options = next(iter(raw.items()))
        options = dict(options or {})
        where = f"{source}: step {i} ({command})"
        twin = resolve_twin(command, where)
        step_id = options.pop("id", None)
        if step_id is not None:
            step_id = str(step_id)
            if step_id in kinds or step_id in merged or step_id == "prev":
                raise UsageError(f"{where}: id {step_id!r} is already used (by a step or a var)")
        _check_refs(options, merged, kinds, i, where, previous=steps[-1].command if steps else None)
        _check_signature(twin, options, where)
        steps.append(Step(i, command, options, step_id, twin))
        if step_id is not None:
            kinds[step_id] = command
    if not steps:
        raise UsageError(f"{source}: the recipe has no steps")
    return steps, merged


def _walk_strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _walk_strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk_strings(v)


def _check_refs(
    options: dict, merged: dict, kinds: dict, number: int, where: str, previous: str | None
) -> None:
    for text in _walk_strings(options):
        for m in _REF.finditer(text):
            name, attr = m.group(1), m.group(2)
            if name in merged and name not in kinds:
                if attr:
                    raise UsageError(f"{where}: {m.group(0)}: var {name!r} has no attributes")
                continue
            if name == "prev":
                if previous is None:
                    raise UsageError(f"{where}: {m.group(0)}: the first step has no previous step")
                command = previous
            elif name in kinds:
                command = kinds[name]
            else:
                raise UsageError(
                    f"{where}: {m.group(0)} is not defined (vars: {', '.join(merged) or 'none'}; "
                    f"earlier step ids: {', '.join(kinds) or 'none'})"
                )
            allowed = VALIDATE_ATTRS if command == "validate" else ARTIFACT_ATTRS
            if attr and attr not in allowed:
                raise UsageError(f"{where}: {m.group(0)}: a {command} step offers {', '.join(allowed)}")


def _check_signature(twin: Callable, options: dict, where: str) -> None:
    try:
        sig = inspect.signature(twin)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(**options)
    except TypeError as e:
        accepted = ", ".join(p for p in sig.parameters if p not in ("progress",))
        raise UsageError(f"{where}: {e} (options: {accepted})") from None


def substitute(value: Any, scope: dict[str, Any], partial: bool = False) -> Any:
    """Replace ``${name}`` / ``${id.attr}`` in strings, recursively; a whole-string reference keeps its
    type. ``partial`` leaves references to names not in ``scope`` as they are (a dry run)."""
    if isinstance(value, str):
        m = _REF.fullmatch(value)
        if m:
            return value if partial and m.group(1) not in scope else _lookup(scope, m.group(1), m.group(2))
        return _REF.sub(
            lambda mm: (
                mm.group(0)
                if partial and mm.group(1) not in scope
                else str(_lookup(scope, mm.group(1), mm.group(2)))
            ),
            value,
        )
    if isinstance(value, dict):
        return {k: substitute(v, scope, partial) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, scope, partial) for v in value]
    return value


def _lookup(scope: dict[str, Any], name: str, attr: str | None) -> Any:
    v = scope[name]
    if isinstance(v, dict) and "__step__" in v:
        key = attr or ("output" if "output" in v else "passed")
        return v.get(key)
    return v


def _outputs(command: str, value: Any) -> dict[str, Any]:
    if command == "validate":
        paths = getattr(value, "report_paths", {})
        return {
            "__step__": True,
            "passed": getattr(value, "passed", None),
            "best": getattr(value, "best", None),
            **{k: paths.get(k) for k in ("json", "junit", "markdown", "html")},
        }
    path = getattr(value, "path", value if isinstance(value, (str, os.PathLike)) else None)
    return {
        "__step__": True,
        "output": None if path is None else str(path),
        "path": None if path is None else str(path),
        "format": getattr(value, "format", None),
        "precision": getattr(value, "precision", None),
    }


def run_recipe(
    path: str | os.PathLike,
    variables: dict[str, Any] | None = None,
    *,
    dry_run: bool = False,
    progress: Callable[[str], None] | None = None,
    on_result: Callable[[StepResult], None] | None = None,
) -> list[StepResult]:
    """Load, check, then run every step of a recipe (or with ``dry_run``, only check and resolve vars)."""
    from ptopt.core.recipe import load_recipe

    say = progress or (lambda msg: None)
    recipe = load_recipe(path)
    steps, merged = plan(recipe, variables, source=str(path))
    scope: dict[str, Any] = dict(merged)
    results: list[StepResult] = []
    for step in steps:
        options = substitute(step.options, scope, partial=dry_run)
        say(f"{step.label}: {step.command}")
        if dry_run:
            results.append(StepResult(step, options, None, {}))
            continue
        if (
            step.command == "validate"
            and "progress" not in options
            and "progress" in inspect.signature(step.twin).parameters
        ):
            options = {**options, "progress": progress}
        value = step.twin(**options)
        res = StepResult(
            step, {k: v for k, v in options.items() if k != "progress"}, value, _outputs(step.command, value)
        )
        results.append(res)
        scope["prev"] = res.outputs
        if step.id:
            scope[step.id] = res.outputs
        if on_result:
            on_result(res)
        if step.command == "validate" and getattr(value, "passed", True) is False:
            from ptopt.validate.api import failure_message

            raise GateFailedError(f"{step.label}: {failure_message(value)}")
    return results
