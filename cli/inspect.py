"""``ptopt inspect MODEL [--data D]``."""

from __future__ import annotations

import json

import click

from ptopt.cli.options import data_option, echo_table, input_shape_option, json_option, model_options


@click.command("inspect")
@click.argument("model")
@data_option("--data", "DATA reference: run one batch through the model and report shapes.")
@model_options
@input_shape_option
@json_option
def command(
    model: str,
    data: str | None,
    weights: str | None,
    allow_pickle: bool,
    input_shapes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Show what MODEL is: inputs, outputs, parameter count, size, and the layers that
    quantization and pruning can act on."""
    from ptopt.core.inspect import inspect_model

    report = inspect_model(
        model, data=data, weights=weights, allow_pickle=allow_pickle, input_shapes=input_shapes
    )
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    from rich.markup import escape
    from rich.table import Table

    size = report.get("size_bytes")
    click.echo(f"model:      {report['model']} ({report['format']})")
    if size is not None:
        click.echo(f"size:       {size:,} bytes")
    side = report.get("sidecar")
    if side:  # a stale sidecar (its sha256 no longer matches the file) is ignored: say so
        click.echo(f"sidecar:    {side['state']}" + (f" ({side['reason']})" if side["reason"] else ""))
    if report.get("parameters") is not None:
        click.echo(f"parameters: {report['parameters']:,} ({report['parameter_bytes']:,} bytes)")
    for s in report["inputs"]:
        click.echo(f"input:      {s['describe']}")
    if not report["inputs"]:
        guess = " ".join(f"--input-shape {s}" for s in report.get("suggested_input_shapes", []))
        click.echo(
            "input:      unknown (pass --data or --input-shape"
            + (f"; its first layer suggests {guess})" if guess else ")")
        )
    ran = next(iter(report.get("ran_batch", {}).values()), "")
    batch = f" (from a batch of {ran.split('x')[0]})" if ran and "data" not in report else ""
    for o in report.get("outputs", []):
        click.echo(f"output:     {o['name']}: {'x'.join(map(str, o['shape']))} {o['dtype']}{batch}")
    if "data" in report:
        d = report["data"]
        click.echo(
            f"data:       {d['name']}: {d['samples']} samples, labels: {'yes' if d['labels'] else 'no'}; "
            f"one batch ran: {', '.join(f'{k} {v}' for k, v in report['ran_batch'].items())}"
        )
    if report["layers"]:
        t = Table(title="Layers ptopt can act on", show_lines=False)
        for col in ("layer", "type", "params", "techniques", "notes"):
            # a layer's name and type never wrap (the notes do)
            t.add_column(
                col, justify="right" if col == "params" else "left", no_wrap=col in ("layer", "type")
            )
        for r in report["layers"]:
            t.add_row(
                escape(r["name"]),
                r["type"],
                f"{r['params']:,}",
                escape(", ".join(r["techniques"])),
                escape("; ".join(r["notes"])),
            )
        echo_table(t)
