"""``ptopt doctor``."""

from __future__ import annotations

import json

import click

from ptopt.cli.options import echo_table, json_option


@click.command("doctor")
@json_option
def command(as_json: bool) -> None:
    """Show versions, CPU features and which backends work here, with the fix for each missing one."""
    from ptopt.core.doctor import doctor

    report = doctor()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    cpu = report["cpu"]
    isa = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["isa"].items())
    click.echo(f"cpu:     {cpu['model']} ({cpu['arch']}, {cpu['usable_cores']} usable cores)")
    click.echo(f"isa:     {isa}")
    click.echo(
        f"torch:   {report['torch_threads']} threads; quantized engines: "
        f"{', '.join(report['quantized_engines'])} (default {report['default_quantized_engine']})"
    )
    t = Table(title="Backends")
    for col in ("backend", "status", "version", "detail / fix"):
        t.add_column(col)
    for name, f in report["features"].items():
        status = "[green]available[/]" if f["available"] else "[red]missing[/]"
        detail = f["detail"] + (f" — fix: {f['fix']}" if not f["available"] and f["fix"] else "")
        t.add_row(name, status, escape(f["version"] or "-"), escape(detail))
    echo_table(t)
