"""Options shared by several commands, so every command spells them the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def model_options(f: F) -> F:
    """``--weights`` and ``--allow-pickle``, which qualify the MODEL argument."""
    f = click.option(
        "--allow-pickle",
        is_flag=True,
        help="Allow loading a full pickled nn.Module (runs code from the file; only for trusted files).",
    )(f)
    f = click.option(
        "--weights",
        type=click.Path(dir_okay=False),
        help="State dict (.pt or .safetensors) for a pkg.module:factory MODEL.",
    )(f)
    return f


def input_shape_option(f: F) -> F:
    return click.option(
        "--input-shape",
        "input_shapes",
        multiple=True,
        metavar="[NAME=]SHAPE",
        help="Input shape when there is no data, e.g. 1x1x32x32 or input_ids=1x128 (repeatable).",
    )(f)


def output_option(required: bool = True, folder_ok: bool = False) -> Callable[[F], F]:
    """``-o/--output``; ``folder_ok``: some of the command's artifacts are folders (the stage refuses a
    folder where its artifact is a file)."""
    return click.option(
        "-o",
        "--output",
        type=click.Path(dir_okay=folder_ok),
        required=required,
        help="Where to write the artifact (a .ptopt.json sidecar is written next to it)"
        + ("; a folder for --mode weight-only." if folder_ok else "."),
    )


def echo_table(table: Any) -> None:
    """Print a rich renderable to stdout."""
    from rich.console import Console

    Console(soft_wrap=False, width=max(100, Console().width)).print(table)


def save_recipe_option(f: F) -> F:
    return click.option(
        "--save-recipe",
        type=click.Path(dir_okay=False),
        help="Also write a recipe YAML of this step, replayable with `ptopt run`.",
    )(f)


def maybe_save_recipe(path: str | None, command: str, options: dict[str, Any]) -> None:
    """Write the recipe of one step when ``--save-recipe`` was given."""
    if path:
        from ptopt.core.recipe import recipe_step, save_recipe

        save_recipe(path, [recipe_step(command, options)])
        click.echo(f"recipe: {path}", err=True)


def guard_paths(inputs: dict[str, str], outputs: dict[str, str]) -> Callable[[F], F]:
    """Refuse (exit 2, before anything loads or is written) an output that would overwrite an input
    or another output of the same command, through ``ptopt.core.outputs.check_outputs``.

    ``inputs`` / ``outputs``: ``{parameter name: option label}``; a parameter holding a list (e.g.
    ARTIFACT...) contributes every item. Put it right above ``def command`` (below the options).
    """
    import functools

    def paths(kwargs: dict[str, Any], names: dict[str, str]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for param, label in names.items():
            value = kwargs.get(param)
            for item in value if isinstance(value, (list, tuple)) else [value]:
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
