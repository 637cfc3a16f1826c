"""``ptopt inspect MODEL [--data D]``."""

from __future__ import annotations

import json
import re

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
    _echo_summary(report)
    _echo_tables(report)


def _shape_text(shape: list) -> str:
    """``2x10``; a dimension read from a graph as a range or a symbol: ``[1..64]x10``."""
    return "x".join(str(d) if isinstance(d, int) else f"[{d}]" for d in shape)


def _weights_line(report: dict) -> str | None:
    """``parameters:`` of a torch module (its int8 layers' packed weights counted), ``weights:`` of a
    graph of another runtime (its initializers / constants)."""
    if report.get("parameters") is None:  # a language-model folder another runtime runs
        held = report.get("weight_bytes")
        by = f" as {report['runtime']} holds them" if report.get("runtime") else " in memory"
        return None if held is None else f"weights:    {held:,} bytes{by}"
    total = f"{report['parameters']:,} ({report['parameter_bytes']:,} bytes"
    if "weights" in report:
        kinds = "".join(f"{w['count']:,} {k}, " for k, w in report["weights"].items())
        return f"weights:    {kinds}{report['parameters']:,} values ({report['parameter_bytes']:,} bytes)"
    int8 = report.get("int8_layers") or []
    if int8:
        n = sum(r["params"] for r in int8)
        total += f"; {n:,} of them in the packed weights of {len(int8)} int8 layer{'s' * (len(int8) > 1)}"
    return f"parameters: {total})"


def _echo_summary(report: dict) -> None:
    size = report.get("size_bytes")
    click.echo(f"model:      {report['model']} ({report['format']})")
    if size is not None:
        click.echo(f"size:       {size:,} bytes")
    side = report.get("sidecar")
    if side:  # a stale sidecar (its sha256 no longer matches the file) is ignored: say so
        click.echo(f"sidecar:    {side['state']}" + (f" ({side['reason']})" if side["reason"] else ""))
    if report.get("precision"):
        click.echo(f"precision:  {report['precision']} (from its {report['precision_from']})")
    line = _weights_line(report)
    if line:
        click.echo(line)
    for s in report["inputs"]:
        click.echo(f"input:      {s['describe']}")
    graph = report.get("lm_graph")
    if graph is not None:  # a decoder with its KV cache: the folder's record names its graph
        _echo_lm_graph(graph)
    elif not report["inputs"]:
        guess = " ".join(f"--input-shape {s}" for s in report.get("suggested_input_shapes", []))
        click.echo(
            "input:      unknown (pass --data or --input-shape"
            + (f"; its first layer suggests {guess})" if guess else ")")
        )
    ran = report.get("ran_batch") or {}
    first = next(iter(ran.values()), "")
    batch = f" (from a batch of {first.split('x')[0]})" if first and "data" not in report else ""
    for o in report.get("outputs", []):
        click.echo(f"output:     {o['name']}: {_shape_text(o['shape'])} {o['dtype']}{batch}")
    if "data" in report:
        d = report["data"]
        click.echo(
            f"data:       {d['name']}: {d['samples']} samples, labels: {'yes' if d['labels'] else 'no'}; "
            f"one batch ran: {', '.join(f'{k} {v}' for k, v in ran.items())}"
        )


def _echo_lm_graph(graph: dict) -> None:
    names = lambda key: ", ".join(_cache_names(graph.get(key) or [])) or "?"  # noqa: E731
    inputs = (
        names("inputs") if graph.get("inputs") else "input_ids, attention_mask (the KV cache is its state)"
    )
    click.echo(f"graph:      {inputs} -> {names('outputs') if graph.get('outputs') else 'logits'}")
    batch, positions = graph.get("batch"), graph.get("max_positions")
    if batch or positions:
        span = f"batch {batch[0]}..{batch[1]}" if batch else ""
        click.echo(f"range:      {span}{'; ' if span and positions else ''}"
                   f"{f'up to {positions} positions' if positions else ''}")  # fmt: skip


def _echo_tables(report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    if report.get("int8_layers"):
        t = Table(title="int8 layers (weights packed)", show_lines=False)
        for col in ("layer", "type", "params", "bytes", "weight"):
            t.add_column(col, justify="right" if col in ("params", "bytes") else "left", no_wrap=True)
        for r in report["int8_layers"]:
            t.add_row(escape(r["name"]), r["type"], f"{r['params']:,}", f"{r['bytes']:,}", r["weight"])
        echo_table(t)
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


def _cache_names(names: list[str]) -> list[str]:
    """``past_key_values.0.key, ..., past_key_values.29.value`` as ``past_key_values.0..29.key/value``
    (as export prints it; SmolLM2's 60 names each way made one line of 2,400 characters)."""
    found: dict[str, set[str]] = {}
    for n in names:
        m = re.fullmatch(r"(past_key_values|present)\.(\d+)\.(key|value)", n)
        if m:
            found.setdefault(m[1], set()).add(f"{m[2]}.{m[3]}")
    out: list[str] = []
    for n in names:
        prefix = n.split(".")[0]
        layers = len(found.get(prefix, ())) // 2
        whole = layers > 1 and found[prefix] == {
            f"{i}.{kv}" for i in range(layers) for kv in ("key", "value")
        }
        if not whole or prefix not in found:
            out.append(n)
        elif f"{prefix}.0..{layers - 1}.key/value" not in out:
            out.append(f"{prefix}.0..{layers - 1}.key/value")
    return out
