"""The pipeline: steps, each calling one command's Python twin by name. ``ptopt run recipe.yaml`` runs a
recipe file with it; ``ptopt demo`` runs a built-in recipe (``ptopt.demo.demo_recipe``) with it.

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

Each step is ``{command: {option: value}}``; the commands are those of the command table
(``ptopt.commands``) marked as steps, the options the twin's keyword arguments
(``ptopt.quantize(model=..., mode=..., output=...)``) or the flags' names (``batch_size`` for
optimize's ``--batch-size``: ``Declared.key``; ``input_shape``: ``TWIN_KEYWORDS``), as
``--save-recipe`` writes them. Three keys are the step's own, not options:

- ``id`` names a step so later steps can refer to what it produced: ``${ID}`` or ``${ID.output}`` is
  the artifact path it wrote, ``${prev}`` the previous step's; a validate step offers ``${ID.passed}``,
  ``${ID.best}`` (the best artifact's name; its path where a step reads a file: ``artifact:``),
  ``${ID.best_path}`` (the best artifact as it was given) and its report paths.
- ``title``: what progress lines call the step (``${...}`` allowed).
- ``when``: ``${...}``; the step runs only when it is true (non-empty); otherwise it is skipped and
  its ``${ID...}`` are empty. A built-in recipe may give a function of the scope that returns why
  the step is skipped, or None to run it.

A value that is exactly ``${...}`` keeps its type (a list var stays a list). Relative paths are
relative to the working directory.

Before any step runs, every step is checked: known command, its twin importable, its options
accepted by the twin's signature, each value of its option's type and choices (vars substituted),
every ``${...}`` defined by a var or an earlier step; then (``check_files``) every file a step reads
that no earlier step writes exists, and no output is one its stage refuses up front. A validate
step whose gates fail stops the pipeline with exit 1 (its reports are written first), unless the
run is asked to go on (the demo reports every gate at the end); so does an optimize step in which no
candidate meets the accuracy budget (its folder is written first). An optimize step's ``${ID}`` /
``${ID.output}`` is its best artifact (``DIR/best.<ext>``)::

    - optimize: {id: opt, model: "${model}", calib_data: builtin:digits32:train,
                 eval_data: builtin:digits32:test, accuracy_budget: 1.0, output: "${out}/opt"}
    - package:  {artifact: "${opt}", format: mar, output: "${out}/model.mar"}
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from ptopt.commands import COMMANDS, step_commands
from ptopt.core.errors import GateFailedError, UsageError
from ptopt.core.formats import with_article
from ptopt.core.options import Options, option
from ptopt.core.recipe import TWIN_KEYWORDS

#: what ``${ID.attr}`` can name, per kind of step result
ARTIFACT_ATTRS = ("output", "path", "format", "precision")
VALIDATE_ATTRS = ("passed", "best", "best_path", "json", "junit", "markdown", "html")
#: keys of a step that belong to the step, not to the twin's options
STEP_KEYS = ("id", "title", "when")
#: the twins' arguments that name something read before the step runs (a MODEL, DATA or artifact);
#: with the options declared ``path="in"`` (``--baseline``)
INPUT_KEYS = frozenset(
    ("model", "reference", "artifacts", "artifact", "teacher", "student", "weights", "teacher_weights",
     "student_weights", "data", "calib_data", "train_data", "eval_data", "fine_tune_data", "validation_data")
)  # fmt: skip

_REF = re.compile(r"\$\{([A-Za-z_][\w-]*)(?:\.([A-Za-z_]\w*))?\}")

#: ``when`` of a built-in recipe: scope -> why the step is skipped, or None to run it
Condition = Callable[[dict[str, Any]], "str | None"]


@dataclasses.dataclass
class Step:
    number: int  # 1-based
    command: str
    options: dict[str, Any]
    id: str | None
    twin: Callable[..., Any]
    title: str | None = None
    when: str | Condition | None = None

    @property
    def label(self) -> str:
        return f"step {self.number} ({self.command}{', id ' + self.id if self.id else ''})"


@dataclasses.dataclass
class StepResult:
    step: Step
    options: dict[str, Any]  # after substitution
    value: Any  # what the twin returned (the loaded Artifact when reused, None when skipped)
    outputs: dict[str, Any]
    title: str | None = None
    seconds: float = 0.0
    #: "ran", "reused" (its output was already there) or "skipped" (its ``when`` was false)
    status: str = "ran"
    #: why a skipped step was skipped
    reason: str | None = None


@dataclasses.dataclass
class Event:
    """What the pipeline tells ``on_event``: ``start`` (a step begins), ``done`` (with its result),
    ``reused`` and ``skipped`` (with their result; ``result.reason`` says why)."""

    kind: str
    step: Step
    title: str | None = None
    result: StepResult | None = None


def resolve_twin(command: str, where: str) -> Callable[..., Any]:
    steps = step_commands()
    if command not in steps:
        raise UsageError(f"{where}: unknown command {command!r} (known: {', '.join(steps)})")
    target = COMMANDS[command].twin or ""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(
            f"{where}: the {command!r} step's Python twin {target} is not available in this "
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
        where = f"{source}: step {i} ({command})"
        options = _twin_keywords(dict(options or {}), where)
        twin = resolve_twin(command, where)
        own = {k: options.pop(k) for k in STEP_KEYS if k in options}
        step_id = None if own.get("id") is None else str(own["id"])
        if step_id is not None and (step_id in kinds or step_id in merged or step_id == "prev"):
            raise UsageError(f"{where}: id {step_id!r} is already used (by a step or a var)")
        when = own.get("when")
        if when is not None and not callable(when) and not _REF.fullmatch(str(when)):
            raise UsageError(f"{where}: when: {when!r}: write one ${{NAME}} or ${{ID.attr}}")
        checked = [options, own.get("title"), None if callable(when) else when]
        _check_refs(checked, merged, kinds, where, previous=steps[-1].command if steps else None)
        options = _best_as_path(twin, options)  # after the check: a refusal quotes what the recipe says
        _check_signature(twin, substitute(options, merged, partial=True), where)
        _check_config(options.get("config"), where)
        steps.append(Step(i, command, options, step_id, twin, own.get("title"), when))
        if step_id is not None:
            kinds[step_id] = command
    if not steps:
        raise UsageError(f"{source}: the recipe has no steps")
    return steps, merged


def _walk_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _walk_strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk_strings(v)


def _check_refs(options: Any, merged: dict, kinds: dict, where: str, previous: str | None) -> None:
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
                offers = f"{with_article(command)} step offers {', '.join(allowed)}"
                raise UsageError(f"{where}: {m.group(0)}: {offers}")


#: the modules whose configs a recipe step's ``config:`` mapping may name
CONFIG_MODULES = (
    "ptopt.compress.quantize.config",
    "ptopt.compress.quantize.autoquant_result",
    "ptopt.compress.prune.config",
    "ptopt.compress.distill_loss",
    "ptopt.compress.trainer",
    "ptopt.export.config",
)


def _check_config(config: Any, where: str) -> None:
    """A step's ``config:`` mapping (``{type: prune-structured, amount: 0.5}``, as ``Config.to_dict``
    and sidecars write it) is checked now unless it holds ${...} references (checked when run)."""
    if isinstance(config, dict) and not any(_REF.search(t) for t in _walk_strings(config)):
        _as_config(config, where)


def _as_config(config: Any, where: str) -> Any:
    """A ``config:`` mapping as the Config its ``type`` names (the config registry); else as given."""
    if not isinstance(config, dict):
        return config
    from ptopt.core.config import config_from_dict

    for module in CONFIG_MODULES:  # each registers its configs on import (no torch)
        importlib.import_module(module)
    try:
        return config_from_dict(config)
    except UsageError as e:
        raise UsageError(f"{where}: config: {e}") from None


def _check_signature(twin: Callable, options: dict, where: str) -> None:
    """Every key an option of the twin (its keyword, or the flag's name: ``batch_size`` for
    ``--batch-size``), the required ones given, and each value the type and choice its option takes
    (vars substituted; a value naming an earlier step is judged when the step runs)."""
    try:
        sig = inspect.signature(twin)
    except (TypeError, ValueError):
        return
    spec = getattr(twin, "__ptopt_options__", None)
    names: dict[str, str] = {}  # key given -> the twin's keyword
    for key in options:
        name = key if key in sig.parameters else spec.keyword(key) if spec is not None else None
        if name is None:
            raise UsageError(f"{where}: unknown key {key!r} (it takes: {', '.join(_accepted(sig, spec))})")
        other = next((k for k, n in names.items() if n == name), None)
        if other is not None:
            raise UsageError(f"{where}: {other} and {key} are one option: give one")
        names[key] = name
    try:
        sig.bind(**{names[k]: v for k, v in options.items()})
    except TypeError as e:
        raise UsageError(f"{where}: {e} (it takes: {', '.join(_accepted(sig, spec))})") from None
    if spec is not None:  # the options the twin resolves: typed, known, applying to the mode/target given
        declared = spec.declared()
        mine = {k: v for k, v in options.items() if names[k] in declared and not _refers(v)}
        choice = options.get(spec.selector.name) if spec.selector is not None else None
        choice = None if _refers(choice) else choice
        try:
            spec.check_choices(mine, choice)
            spec.check(mine, choice)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None


def _accepted(sig: inspect.Signature, spec: Any) -> list[str]:
    """The keys a step of this twin takes, as the refusal of an unknown one lists them."""
    declared = spec.declared() if spec is not None else {}
    twin_keys = {v: k for k, v in TWIN_KEYWORDS.items()}
    own = [f"{twin_keys[p]} ({p})" if p in twin_keys else p for p in sig.parameters if p not in declared]
    return [k for k in own if k != "progress"] + (spec.accepted() if spec is not None else [])


def _twin_keywords(options: dict[str, Any], where: str) -> dict[str, Any]:
    """A step's keys that are a flag's name for a twin's own argument (``input_shape`` for
    ``--input-shape``) as the twin's keyword (``input_shapes``)."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # keyword -> the key that gave it
    for key, value in options.items():
        name = TWIN_KEYWORDS.get(key, key)
        if name in out:
            raise UsageError(f"{where}: {' and '.join(sorted((given[name], key)))} are one option: give one")
        out[name], given[name] = value, key
    return out


_BEST = re.compile(r"\$\{([A-Za-z_][\w-]*)\.best\}")


def _best_as_path(twin: Callable, options: dict[str, Any]) -> dict[str, Any]:
    """``${ID.best}`` where a step reads a file (``artifact:``, ``model:``) is the best artifact's path,
    ``${ID.best_path}``; elsewhere (a title) it stays the best artifact's name."""
    spec = getattr(twin, "__ptopt_options__", None)
    return {k: substitute_best(v) if _input_key(spec, k) else v for k, v in options.items()}


def substitute_best(value: Any) -> Any:
    if isinstance(value, str):
        return _BEST.sub(r"${\1.best_path}", value)
    if isinstance(value, list):
        return [substitute_best(v) for v in value]
    return value


def _input_key(spec: Any, key: str) -> bool:
    """Whether a step's ``key`` names something the step reads (a file where it is a path)."""
    name = spec.keyword(key) if spec is not None else None
    if name is None:
        return key in INPUT_KEYS
    return name in INPUT_KEYS or spec.declared()[name].opt.path == "in"


def _paths(value: Any) -> list[str]:
    """The file paths in a step's value: strings that are not a reference (``zoo:NAME``,
    ``builtin:digits``, ``pkg.module:function``, ``self``) nor ``${...}``."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [
        str(v)
        for v in items
        if isinstance(v, (str, os.PathLike))
        and not _refers(str(v))
        and ":" not in str(v)
        and ("/" in str(v) or os.sep in str(v) or Path(v).suffix)
    ]


def check_files(steps: list[Step], scope: dict[str, Any], source: str = "recipe") -> None:
    """Before the first step runs: each file a step reads exists unless an earlier step writes it,
    and no step's output is one its stage would refuse (a Ray Serve package or optimize folder that
    exists and is not empty). A step with ``when`` may not run: its files are not required."""
    written: list[Path] = []
    for step in steps:
        options = substitute(step.options, scope, partial=True)
        spec = getattr(step.twin, "__ptopt_options__", None)
        where = f"{source}: {step.label}"
        if step.when is None:
            for key, value in options.items():
                for path in _paths(value) if _input_key(spec, key) else ():
                    if not Path(path).exists() and not _written(Path(path), written):
                        raise UsageError(
                            f"{where}: {key}: {path}: no such file (and no earlier step writes it)"
                        )
            check = _OUTPUT_CHECKS.get(step.command)
            out = options.get("output")
            if check is not None and isinstance(out, str) and not _refers(out):
                try:
                    check(Path(out), options)
                except UsageError as e:
                    raise UsageError(f"{where}: {e}") from None
        for key, value in options.items():
            name = spec.keyword(key) if spec is not None else None
            if key == "output" or (name is not None and spec.declared()[name].opt.path == "out"):
                written += [Path(p) for p in _paths(value)]


def _written(path: Path, written: list[Path]) -> bool:
    real = path.resolve()
    return any(real == w.resolve() or w.resolve() in real.parents for w in written)


def _optimize_output(out: Path, options: dict[str, Any]) -> None:
    from ptopt.optimize.api import check_output_dir

    check_output_dir(out, ())


def _package_output(out: Path, options: dict[str, Any]) -> None:
    if options.get("format") == "ray":
        from ptopt.serve.ray_package import check_new_folder

        check_new_folder(out)


#: the outputs a stage refuses whatever the run: checked before the first step (``check_files``)
_OUTPUT_CHECKS: dict[str, Callable[[Path, dict[str, Any]], None]] = {
    "optimize": _optimize_output,
    "package": _package_output,
}


def _refers(value: Any) -> bool:
    """A value the plan cannot judge yet: it names a var or an earlier step's result (``${...}``)."""
    return any("${" in text for text in _walk_strings(value))


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
    """What ``${ID.attr}`` offers after a step: a validate step's verdict and reports, else the path,
    format and precision of the artifact it wrote (a ``Result`` reads through to its saved Artifact)."""
    if command == "validate":
        paths = getattr(value, "report_paths", None) or {}
        best = getattr(value, "best", None)
        best_path = None
        if best is not None:
            best_path = next((e.get("ref") for e in value.entries if e.get("name") == best), None)
        return {
            "__step__": True,
            "passed": getattr(value, "passed", None),
            "best": best,
            "best_path": best_path,
            **{k: paths.get(k) for k in ("json", "junit", "markdown", "html")},
        }
    art = getattr(value, "artifact", None) or value
    path = getattr(art, "path", art if isinstance(art, (str, os.PathLike)) else None)
    return {
        "__step__": True,
        "output": None if path is None else str(path),
        "path": None if path is None else str(path),
        "format": getattr(art, "format", None),
        "precision": getattr(art, "precision", None),
    }


def _skipped_outputs(command: str) -> dict[str, Any]:
    attrs = VALIDATE_ATTRS if command == "validate" else ARTIFACT_ATTRS
    return {"__step__": True, **dict.fromkeys(attrs)}


def _skip_reason(step: Step, scope: dict[str, Any]) -> str | None:
    if step.when is None:
        return None
    if callable(step.when):
        return step.when(scope)
    value = substitute(step.when, scope)
    return None if value else f"when: {step.when} is {value!r}"


def _reused(step: Step, options: dict[str, Any], title: str | None) -> StepResult | None:
    """The step's output already written (file and sidecar): its Artifact, without running the step."""
    from ptopt.core.artifact import Artifact, sidecar_path

    out = options.get("output")
    if step.command == "validate" or not out or not Path(out).exists() or not sidecar_path(out).is_file():
        return None
    art = Artifact.load(out)
    return StepResult(step, options, art, _outputs(step.command, art), title, status="reused")


def _reusable(step: Step, reuse: bool | Collection[str]) -> bool:
    return reuse is True or (not isinstance(reuse, bool) and step.id in reuse)


def run_steps(
    steps: list[Step],
    scope: dict[str, Any],
    *,
    reuse: bool | Collection[str] = False,
    stop_on_gate_failure: bool = True,
    progress: Callable[[str], None] | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> list[StepResult]:
    """Run checked steps in order (see the module docstring); ``scope`` holds the vars and gains each
    step's outputs. ``reuse`` (True, or the ids of the steps it applies to) skips a step whose
    ``output`` already exists with its sidecar, and takes that artifact as what the step produced.
    ``progress`` gets a line per step and is passed on to validate steps."""
    say = progress or (lambda msg: None)
    emit = on_event or (lambda event: None)
    results: list[StepResult] = []
    for step in steps:
        options = substitute(step.options, scope)
        why = _skip_reason(step, scope)
        title = substitute(step.title, scope) if step.title and why is None else step.title
        if why is not None:
            res = StepResult(step, options, None, _skipped_outputs(step.command), title, 0.0, "skipped", why)
            emit(Event("skipped", step, title, res))
        elif (res := _reused(step, options, title) if _reusable(step, reuse) else None) is not None:
            emit(Event("reused", step, title, res))
        else:
            say(f"{step.label}: {step.command}")
            emit(Event("start", step, title))
            res = _run_one(step, options, title, progress)
            emit(Event("done", step, title, res))
        results.append(res)
        if res.status != "skipped":
            scope["prev"] = res.outputs
        if step.id:
            scope[step.id] = res.outputs
        if stop_on_gate_failure and step.command == "validate" and res.outputs.get("passed") is False:
            from ptopt.validate.api import failure_message

            raise GateFailedError(f"{step.label}: {failure_message(res.value)}")
        if stop_on_gate_failure and step.command == "optimize" and getattr(res.value, "exit_code", 0) == 1:
            raise GateFailedError(
                f"{step.label}: no candidate meets the accuracy budget (the closest, "
                f"{res.value.report['best']}, is written in {res.value.directory})"
            )
    return results


def _run_one(step: Step, options: dict[str, Any], title: str | None, progress: Any) -> StepResult:
    call = dict(options)
    if "config" in call:
        call["config"] = _as_config(call["config"], step.label)
    if progress is not None and "progress" not in call and step.command == "validate":
        call["progress"] = progress
    t0 = time.perf_counter()
    value = step.twin(**call)
    return StepResult(step, options, value, _outputs(step.command, value), title, time.perf_counter() - t0)


@dataclasses.dataclass(frozen=True)
class RecipeOptions:
    """How ``ptopt run`` runs a recipe file."""

    variables: tuple[str, ...] = option(
        (), help="Set or override a recipe var (repeatable).", flag="--var", metavar="NAME=VALUE", repeat=True
    )
    dry_run: bool = option(False, help="Check every step and print the plan; run nothing.")


#: the options of ``ptopt run``
OPTIONS = Options("run", lambda: (RecipeOptions,))


def run_recipe(
    recipe: str | os.PathLike | dict[str, Any],
    variables: dict[str, Any] | None = None,
    *,
    dry_run: bool = False,
    source: str | None = None,
    **run_options: Any,
) -> list[StepResult]:
    """Load (a path) or take (a dict: a built-in recipe), check, then run every step of a recipe; with
    ``dry_run`` only check it and resolve what the vars give. ``run_options``: see ``run_steps``."""
    from ptopt.core.options import named_by_flags

    with named_by_flags(False):  # a refusal names the recipe's key, not a flag
        return _run_recipe(recipe, variables, dry_run, source, run_options)


def _run_recipe(
    recipe: Any,
    variables: dict[str, Any] | None,
    dry_run: bool,
    source: str | None,
    run_options: dict[str, Any],
) -> list[StepResult]:
    from ptopt.core.recipe import check_recipe, load_recipe

    if isinstance(recipe, dict):
        source = source or "recipe"
        data = check_recipe(recipe, source)
    else:
        source, data = source or str(recipe), load_recipe(recipe)
    steps, merged = plan(data, variables, source=source)
    check_files(steps, merged, source)
    if dry_run:
        say = run_options.get("progress") or (lambda msg: None)
        results = []
        for step in steps:
            say(f"{step.label}: {step.command}")
            results.append(StepResult(step, substitute(step.options, merged, partial=True), None, {}))
        return results
    return run_steps(steps, dict(merged), **run_options)
