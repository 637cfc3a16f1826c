"""``ptopt prune MODEL --method METHOD --amount A -o OUT`` (methods: the pruning table's rows)."""

from __future__ import annotations

import click

from ptopt.cli.options import (
    echo_table,
    guard_paths,
    input_shape_option,
    maybe_save_recipe,
    model_options,
    output_option,
    save_recipe_option,
)
from ptopt.compress.prune import table


@click.command("prune")
@click.argument("model")
@click.option(
    "--method",
    required=True,
    type=click.Choice(table.methods()),
    help="l1-unstructured: each layer to --amount sparsity; global: one ranking across layers; "
    "structured: remove whole channels (a smaller, faster model).",
)
@click.option(
    "--amount",
    required=True,
    type=float,
    help="Fraction to prune, strictly between 0 and 1 (weights, or channels per layer for structured).",
)
@output_option()
@click.option(
    "--criterion",
    type=click.Choice(["l1", "l2"]),
    default="l1",
    show_default=True,
    help="Channel ranking for structured pruning: L1 or L2 norm of each filter.",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="PATTERN",
    help="Leave layers matching this fnmatch pattern (module name or a parent's) alone; repeatable.",
)
@click.option(
    "--prune-first-last",
    is_flag=True,
    help="Structured: also prune the first layer and the last linear (classifier outputs never are).",
)
@click.option(
    "--fine-tune-data", metavar="DATA", help="Fine-tune after pruning on this DATA (labelled, or --teacher)."
)
@click.option(
    "--eval-data", metavar="DATA", help="Held-out DATA: accuracy before/after; keeps the best epoch."
)
@click.option(
    "--epochs", type=int, default=0, show_default=True, help="Fine-tuning epochs (per round with --steps)."
)
@click.option(
    "--steps",
    type=int,
    default=1,
    show_default=True,
    help="Prune gradually in this many rounds, fine-tuning between them.",
)
@click.option(
    "--teacher",
    metavar="MODEL|self",
    help="Fine-tune by distillation from this MODEL ('self': the unpruned model).",
)
@click.option("--temperature", type=float, default=4.0, show_default=True, help="Distillation temperature.")
@click.option(
    "--alpha",
    type=float,
    default=0.5,
    show_default=True,
    help="Weight of the label loss when distilling; 1-alpha weighs the teacher's soft targets.",
)
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Fine-tuning learning rate.")
@click.option("--batch-size", type=int, default=64, show_default=True, help="Fine-tuning batch size.")
@model_options
@input_shape_option
@save_recipe_option
@guard_paths(
    {
        "model": "MODEL",
        "weights": "--weights",
        "fine_tune_data": "--fine-tune-data",
        "eval_data": "--eval-data",
        "teacher": "--teacher",
    },
    {"output": "-o", "save_recipe": "--save-recipe"},
)
def command(
    model: str,
    method: str,
    amount: float,
    output: str,
    criterion: str,
    exclude: tuple[str, ...],
    prune_first_last: bool,
    fine_tune_data: str | None,
    eval_data: str | None,
    epochs: int,
    steps: int,
    teacher: str | None,
    temperature: float,
    alpha: float,
    lr: float,
    batch_size: int,
    weights: str | None,
    allow_pickle: bool,
    input_shapes: tuple[str, ...],
    save_recipe: str | None,
) -> None:
    """Prune MODEL and write a dense model that loads with plain torch: TorchScript (.pt) or an
    ExportedProgram (.pt2), with a sidecar describing what was pruned.

    \b
    Structured pruning removes whole channels, so the model is really smaller and faster.
    Unstructured (l1-unstructured, global) only zeroes weights: same size on disk, no faster;
    what the zeros save is the gzip size.
    """
    import warnings

    from ptopt.compress.prune import PruneWarning, prune

    options = dict(
        model=model,
        method=method,
        amount=amount,
        output=output,
        fine_tune_data=fine_tune_data,
        eval_data=eval_data,
        epochs=epochs,
        teacher=teacher,
        steps=steps,
        exclude=exclude,
        criterion=criterion,
        prune_first_last=prune_first_last,
        temperature=temperature,
        alpha=alpha,
        lr=lr,
        batch_size=batch_size,
        input_shapes=input_shapes,
        weights=weights,
        allow_pickle=allow_pickle,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PruneWarning)
        art = prune(**options, progress=True)
    for w in caught:
        if issubclass(w.category, PruneWarning):
            click.echo(f"warning: {w.message}", err=True)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    _print_report(art, method)
    maybe_save_recipe(save_recipe, "prune", options)


def _print_report(art, method: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    m, extra = art.metrics, art.extra
    t = Table(title=f"{method} pruning", show_lines=False)
    if method == "structured":
        for col in ("layer", "channels", "pruned with", "kept because"):
            t.add_column(col)
        for r in extra["layers"]:
            t.add_row(
                escape(r["layer"]),
                f"{r['channels_before']} → {r['channels_after']}",
                escape(", ".join(r["pruned_with"])),
                escape(r["kept_reason"] or ""),
            )
    else:
        for col in ("layer", "type", "weights", "sparsity"):
            t.add_column(col, justify="left" if col in ("layer", "type") else "right")
        for r in extra["layers"]:
            t.add_row(escape(r["layer"]), r["type"], f"{r['weights']:,}", f"{r['sparsity']:.3f}")
    echo_table(t)
    click.echo(
        f"parameters: {m['parameters_before']:,} → {m['parameters_after']:,} "
        f"({m['parameter_ratio']:.2f}×; non-zero {m['nonzero_parameters_after']:,})"
    )
    if "sparsity" in m:
        click.echo(f"sparsity:   {m['sparsity']:.4f} of the pruned weights are zero")
    click.echo(
        f"weights:    raw {m['weights_bytes_before']:,} → {m['weights_bytes_after']:,} bytes; "
        f"gzip {m['weights_gzip_bytes_before']:,} → {m['weights_gzip_bytes_after']:,} bytes"
    )
    if "accuracy_before" in m:
        click.echo(
            f"accuracy:   {100 * m['accuracy_before']:.2f}% → {100 * m['accuracy_after']:.2f}% "
            f"(drop {m['accuracy_drop_points']:.2f} points)"
        )
    if m.get("vs_source"):
        from ptopt.compress.fidelity import describe

        click.echo(f"vs unpruned: {describe(m['vs_source'])}")
    if extra.get("note"):
        click.echo(f"note:       {extra['note']}")
    click.echo(
        f"wrote {art.path} ({art.format}, {art.size_bytes:,} bytes, gzip {extra['gzip_bytes']:,} bytes)"
    )
