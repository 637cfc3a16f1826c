"""The click side of the options: the options every command declares from its config dataclasses
(``declared``, from ``ptopt.core.options``), and the few common ones every command spells the same way
(MODEL qualifiers, data, output, recipe, quiet)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def model_options(f: F) -> F:
    """``--weights`` and ``--allow-pickle``, which qualify the MODEL argument."""
    return weights_option("--weights", "State dict (.pt or .safetensors) for a pkg.module:factory MODEL.")(
        allow_pickle_option(f)
    )


def weights_option(flag: str, help: str) -> Callable[[F], F]:
    """A state dict for a ``pkg.module:factory`` MODEL (``--weights``, ``--teacher-weights`` ...)."""
    return click.option(flag, type=click.Path(dir_okay=False), help=help)


def allow_pickle_option(f: F) -> F:
    return click.option(
        "--allow-pickle",
        is_flag=True,
        help="Allow loading a full pickled nn.Module (runs code from the file; only for trusted files).",
    )(f)


def input_shape_option(f: F) -> F:
    return click.option(
        "--input-shape",
        "input_shapes",
        multiple=True,
        metavar="[NAME=]SHAPE",
        help="Input shape when there is no data, e.g. 1x1x32x32 or input_ids=1x128 (repeatable).",
    )(f)


def output_option(
    required: bool = True, folder_ok: bool = False, folder: bool = False, help: str = "", default: Any = None
) -> Callable[[F], F]:
    """``-o/--output``; ``folder_ok``: some of the command's artifacts are folders (the stage refuses a
    folder where its artifact is a file); ``folder``: the output is a folder of results."""
    text = help or (
        "A new (or empty) folder for the results."
        if folder
        else "Where to write the artifact (a .ptopt.json sidecar is written next to it)"
        + ("; a folder for --mode weight-only." if folder_ok else ".")
    )
    path = (
        click.Path(file_okay=False)
        if folder and default is not None
        else click.Path(dir_okay=folder_ok or folder)
    )
    return click.option(
        "-o", "--output", type=path, required=required and default is None, default=default,
        show_default=default is not None, help=text,
    )  # fmt: skip


def data_option(flag: str, help: str, *, required: bool = False, metavar: str = "DATA") -> Callable[[F], F]:
    """A DATA (or MODEL) reference the command reads (``--calib-data``, ``--eval-data``, ``--teacher``)."""
    return click.option(flag, required=required, metavar=metavar, help=help)


def progress_option(f: F) -> F:
    """``--quiet`` / ``-q``, as every command has it, also spelled ``--no-progress`` (its older name)."""
    return click.option(
        "--quiet", "-q", "--no-progress", "no_progress", is_flag=True, help="No progress lines."
    )(f)


def quiet_option(f: F) -> F:
    return click.option("--quiet", "-q", is_flag=True, help="No progress lines.")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(f)


def warning_lines(*categories: type[Warning]) -> Any:
    """A block in which each warning of ``categories`` prints as it comes, as one ``warning: ...``
    line on stderr (every time, whatever the filters); any other warning as the CLI shows it."""
    import contextlib
    import warnings

    @contextlib.contextmanager
    def block() -> Any:
        with warnings.catch_warnings():
            for category in categories:
                warnings.simplefilter("always", category)
            shown = warnings.showwarning

            def show(message, category, *rest) -> None:  # noqa: ANN001 - warnings.showwarning's signature
                if issubclass(category, categories):
                    click.echo(f"warning: {message}", err=True)
                else:
                    shown(message, category, *rest)

            warnings.showwarning = show
            yield

    return block()


def drop_text(points: float) -> str:
    """``drop 0.56 points``, or ``up 3.12 points`` where the compressed model scored higher."""
    return f"up {-points:.2f} points" if points < -0.005 else f"drop {max(points, 0.0):.2f} points"


def echo_table(table: Any, keys: int = 1) -> None:
    """Print a rich table to stdout within the terminal's width (at most 100 columns), wrapped by
    column where it is wider, its first ``keys`` columns (the names) repeated
    (``ptopt.validate.reports.terminal.split``)."""
    from rich.console import Console

    from ptopt.validate.reports.terminal import split, table_width

    width = table_width()
    console = Console(soft_wrap=False, width=width)
    for part in split(table, width, keys):
        console.print(part)


def save_recipe_option(f: F) -> F:
    return click.option(
        "--save-recipe",
        type=click.Path(dir_okay=False),
        help="Also write a recipe YAML of this step, replayable with `ptopt run`.",
    )(f)


def maybe_save_recipe(path: str | None, command: str, options: dict[str, Any]) -> None:
    """Write the recipe of one step when ``--save-recipe`` was given."""
    if path:
        from ptopt.core.options import soft_left_out
        from ptopt.core.recipe import recipe_step, save_recipe

        # an option set in the environment that did not apply is not part of the step
        options = {k: v for k, v in options.items() if k not in soft_left_out()}
        save_recipe(path, [recipe_step(command, options)])
        click.echo(f"recipe: {path}", err=True)


def guard_paths(inputs: dict[str, str], outputs: dict[str, str], spec: Any = None) -> Callable[[F], F]:
    """Refuse (exit 2, before anything loads or is written) an output that would overwrite an input
    or another output of the same command, through ``ptopt.core.outputs.check_outputs``.

    ``inputs`` / ``outputs``: ``{parameter name: option label}``; a parameter holding a list (e.g.
    ARTIFACT...) contributes every item. Put it right above ``def command`` (below the options).
    ``spec``: a command's ``Options``, whose fields declared ``path="in"``/``"out"`` join them.
    """
    import functools

    if spec is not None:
        for name, d in spec.declared().items():
            if d.opt.path and d.opt.cli:
                (inputs if d.opt.path == "in" else outputs)[name] = d.flag

    def paths(kwargs: dict[str, Any], names: dict[str, str]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for param, label in names.items():
            value = kwargs.get(param)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, str) and item.startswith("hf:"):
                    item = item[3:]  # a Hugging Face folder: an output there writes over it
                if item is not None and item != "":
                    out.append((label, item))
        return out

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from ptopt.core.outputs import check_outputs

            check_outputs(paths(kwargs, inputs), paths(kwargs, outputs))
            return f(*args, **kwargs)

        return wrapper

    return deco


def declared(spec: Any, *, skip: tuple[str, ...] = ()) -> Callable[[F], F]:
    """The click options of ``spec`` (a ``ptopt.core.options.Options``): its selector (``--mode``
    ...) and one option per declared field; ``skip``: names the command spells itself. The command
    receives every option under its field's name, None (or ``()``) when not given: pass
    ``given(options)`` to the twin."""

    import functools

    old = _deprecated_flags(spec, skip)

    def deco(f: F) -> F:
        @functools.wraps(f)
        def renamed(*args: Any, **kwargs: Any) -> Any:
            for dest, (flag, name, new_flag, note) in old.items():
                value = kwargs.pop(dest, None)
                if value is None or value == ():
                    continue
                if kwargs.get(name) not in (None, ()):
                    from ptopt.core.errors import UsageError

                    raise UsageError(f"{flag} and {new_flag} are one option: give {new_flag}")
                click.echo(f"note: {flag} is deprecated here: {note}", err=True)
                kwargs[name] = value
            return f(*args, **kwargs)

        g = renamed if old else f
        for decls, kwargs in reversed(list(_click_specs(spec, skip))):
            g = click.option(*decls, **kwargs)(g)
        return g

    return deco


def _deprecated_flags(spec: Any, skip: tuple[str, ...]) -> dict[str, tuple[str, str, str, str]]:
    """``{click dest: (old flag, option name, its flag, note)}`` of the old flags still accepted."""
    out = {}
    for name, d in spec.declared().items():
        for old, note in d.opt.deprecated.items():
            if old.startswith("--") and name not in skip:
                out[f"{name}__{old[2:].replace('-', '_')}"] = (old, name, d.flag, note)
    return out


def given(options: dict[str, Any]) -> dict[str, Any]:
    """The options the user gave (a command's ``**options``: None and ``()`` mean not given)."""
    return {k: v for k, v in options.items() if v is not None and v != ()}


def _click_specs(spec: Any, skip: tuple[str, ...]) -> Any:
    """``(param decls, click.option keywords)`` for the selector and every declared option."""
    sel = spec.selector
    if sel is not None and sel.cli and sel.name not in skip:
        # free text, listed in the metavar: the twin refuses an unknown choice in one line
        yield (
            (sel.cli_flag, sel.name),
            dict(metavar="|".join(sel.choices()), required=sel.required, help=sel.help),
        )
    label = sel.label if sel is not None else None
    for name, d in spec.declared().items():
        if not d.opt.cli or name in skip:
            continue
        yield _click_option(spec, d, label)
    for dest, (flag, name, _, _) in _deprecated_flags(spec, skip).items():
        _, kwargs = _click_option(spec, spec.declared()[name], label)
        yield (flag, dest), kwargs | {"hidden": True, "help": "", "required": False}


def _click_option(spec: Any, d: Any, label: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    o = d.opt
    flags = (d.flag, *([o.short] if o.short else []))
    kw: dict[str, Any] = {"default": None, "help": _help(spec, d, label), "required": o.required}
    if d.kind is bool and o.toggle:
        flags = (f"{d.flag}/--no-{d.flag[2:]}",)
    elif d.kind is bool:
        kw |= {"is_flag": True, "flag_value": not o.negate}
    else:
        kw["type"] = str if o.csv else {int: int, float: float}.get(d.kind, str)
        if o.csv:  # `--isa ""` typed names nothing: a mistake, not the default (a recipe's "" is "not given")
            kw["callback"] = _names_something
        kw["metavar"] = o.metavar or ("FILE" if o.path else None)
        if o.repeat:
            kw |= {"multiple": True, "default": ()}
    return (*flags, d.name), kw


def _names_something(ctx: Any, param: Any, value: Any) -> Any:
    from ptopt.core.errors import UsageError

    if isinstance(value, str) and not any(v.strip() for v in value.split(",")):
        raise UsageError(f"{param.opts[0]} {value!r}: names nothing (give comma-separated values)")
    return value


def _help(spec: Any, d: Any, label: Any) -> str:
    """The field's help, where it applies, its choices and default (from the declaration)."""
    o = d.opt
    parts = []
    sel = spec.selector
    if sel is not None:
        where = [c for c in sel.choices() if spec.applies(d.name, c)]
        if len(where) < len(sel.choices()):
            described = [sel.describe(c) for c in where] if sel.describe else []
            parts.append(" or ".join(described) if described else f"{sel.cli_flag} {', '.join(where)}")
    if o.choices:
        parts.append(" | ".join(o.choices))
    default = "" if (d.kind is bool and not o.toggle) or o.required else d.default_text(label)
    if default:
        parts.append(f"default {default}")
    return o.help + (f" [{'; '.join(parts)}]" if parts else "")
