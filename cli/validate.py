"""``ptopt validate REFERENCE ARTIFACT... --data D [gates] [--json J] [--junit X] [--markdown M] [--report R.html]``."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import (
    data_option,
    declared,
    given,
    guard_paths,
    maybe_save_recipe,
    model_options,
    quiet_option,
    save_recipe_option,
)
from ptopt.validate.options import OPTIONS


@click.command("validate")
@click.argument("reference")
@click.argument("artifacts", nargs=-1, required=True)
@data_option(
    "--data", "DATA reference: the samples every artifact runs on (labels give accuracy).", required=True
)
@model_options
@declared(OPTIONS)
@quiet_option
@save_recipe_option
@guard_paths(
    {"reference": "REFERENCE", "artifacts": "ARTIFACT", "data": "--data", "weights": "--weights"},
    {"save_recipe": "--save-recipe"},
    OPTIONS,
)
def command(
    reference: str,
    artifacts: tuple[str, ...],
    data: str,
    weights: str | None,
    allow_pickle: bool,
    quiet: bool,
    save_recipe: str | None,
    **params: Any,
) -> None:
    """Run REFERENCE and every ARTIFACT on the same --data, each in its own runtime ({runtimes}), and
    compare accuracy, agreement, size, latency per batch size and peak memory. A causal language model
    (a Hugging Face folder, hf:DIR) with text --data (.txt, builtin:pydoc-text:eval, token ids .pt/.npy)
    gets perplexity, prefill and decode tokens/s at batch 1, weight bytes, size on disk and peak memory
    instead. Exit 1 when a gate fails (after writing every report), 2 on bad input, 4 when no gate
    failed but a latency gate was within the timing noise (inconclusive)."""
    from ptopt.validate.api import raise_for_status, validate
    from ptopt.validate.reports import terminal

    def progress(msg: str) -> None:
        if not quiet:
            click.echo(msg, err=True)

    common = dict(weights=weights, allow_pickle=allow_pickle or None)
    options = dict(
        reference=reference, artifacts=list(artifacts), data=data, **given(common), **given(params)
    )
    result = validate(**options, progress=progress)
    maybe_save_recipe(save_recipe, "validate", options)
    terminal.print_report(result.data)
    for e in result.data["artifacts"]:
        if "compile_seconds" in e.get("info", {}):
            click.echo(_compile_line(e))
    for key, path in result.report_paths.items():
        click.echo(f"{key}: {path}", err=True)
    raise_for_status(result)


def _compile_line(entry: dict) -> str:
    """How long the artifact's compile took: torch.compile's here (``--compile``), or an AOTInductor
    package's when it was exported (its sidecar's figure: nothing was compiled by this run)."""
    seconds = entry["info"]["compile_seconds"]
    if str(entry.get("format")) == "aoti_package":
        return f"AOTInductor: {entry['name']} was compiled in {seconds:.1f} s when it was exported"
    return f"torch.compile: {entry['name']} compiled in {seconds:.1f} s"


def _runtimes_named() -> None:
    """The help's runtimes from the format table (a format added there is named here too)."""
    from ptopt.core.formats import runtime_names

    command.help = (command.help or "").replace("{runtimes}", runtime_names())


_runtimes_named()
