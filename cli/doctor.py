"""``ptopt doctor``."""

from __future__ import annotations

import json

import click

from ptopt.cli.options import echo_table, json_option


@click.command("doctor")
@json_option
def command(as_json: bool) -> None:
    """Show versions, CPU features and every optional runtime ptopt uses (OpenVINO, NNCF, transformers,
    torchao, TorchServe, Java, TensorRT, ...): its version, what ptopt uses it for, and for a missing
    one the line that installs it."""
    from ptopt.core.doctor import doctor

    report = doctor()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    cpu = report["cpu"]
    has = [k for k, v in cpu["isa"].items() if v]
    lacks = [k for k, v in cpu["isa"].items() if not v]  # two lists fit 100 columns ("k yes, ..." did not)
    isa = "; ".join(f"{say} {' '.join(ks)}" for say, ks in (("has", has), ("lacks", lacks)) if ks)
    click.echo(f"cpu:     {cpu['model']} ({cpu['arch']}, {cpu['usable_cores']} usable cores)")
    click.echo(f"isa:     {isa}")
    click.echo(
        f"torch:   {report['torch_threads']} threads; quantized engines: "
        f"{', '.join(report['quantized_engines'])} (default {report['default_quantized_engine']})"
    )
    t = Table(title="Runtimes and backends")
    t.add_column("name", no_wrap=True)
    t.add_column("version", no_wrap=True)
    t.add_column("what ptopt uses it for; the fix where it is missing")
    missing = 0
    for name, f in report["features"].items():
        version = escape(f["version"] or "") if f["available"] else "[red]missing[/]"
        detail = escape(f["detail"])
        if not f["available"] and f["fix"]:
            missing += 1
            detail += f"\n[bold]install:[/] {escape(f['fix'])}"
        t.add_row(name, version, detail)
    echo_table(t)
    if missing:
        click.echo(
            f"{missing} missing: each row says how to install it; the rest of ptopt works without them"
        )
