"""``ptopt run RECIPE.yaml [--var NAME=VALUE]... [--dry-run]``."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import declared, given, quiet_option
from ptopt.pipeline import OPTIONS


@click.command("run")
@click.argument("recipe", type=click.Path(dir_okay=False))
@declared(OPTIONS)
@quiet_option
def command(recipe: str, quiet: bool, **params: Any) -> None:
    """Run the steps of RECIPE (quantize, prune, distill, export, validate, package), each calling
    that command's Python twin with its options. Every step is checked before the first one runs;
    a validate step whose gates fail stops the run with exit 1 after writing its reports."""
    import yaml

    from ptopt.pipeline import RecipeOptions, parse_vars, run_recipe

    opts = OPTIONS.build(RecipeOptions, OPTIONS.check(given(params)))
    dry_run = opts.dry_run

    def progress(msg: str) -> None:
        if not quiet:
            click.echo(msg, err=True)

    def on_event(event) -> None:
        res = event.result
        if event.kind == "skipped":
            click.echo(f"{res.step.label}: skipped ({res.reason})")
        if event.kind != "done":
            return
        if res.step.command == "validate":
            from ptopt.validate.reports import terminal

            terminal.print_report(res.value.data)
        elif res.step.command == "optimize":  # its summary, as `ptopt optimize` prints it
            from ptopt.cli.optimize import print_result

            print_result(res.value, gate=False)
            click.echo(f"{res.step.label}: wrote {res.outputs.get('output')}")
        else:
            out = res.outputs.get("output")
            click.echo(f"{res.step.label}: wrote {out}" if out else f"{res.step.label}: done")

    results = run_recipe(
        recipe, parse_vars(opts.variables), dry_run=dry_run, progress=progress, on_event=on_event
    )
    if dry_run:
        for r in results:
            click.echo(
                yaml.safe_dump(
                    [{r.step.command: ({"id": r.step.id} if r.step.id else {}) | r.options}], sort_keys=False
                ).rstrip()
            )
        click.echo(f"recipe {recipe}: {len(results)} step(s) OK (dry run, nothing ran)")
    else:
        click.echo(f"recipe {recipe}: {len(results)} step(s) done")
