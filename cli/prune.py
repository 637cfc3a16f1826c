"""``ptopt prune MODEL --method METHOD --amount A -o OUT`` (methods: the pruning table's rows)."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import (
    data_option,
    declared,
    drop_text,
    echo_table,
    given,
    guard_paths,
    input_shape_option,
    maybe_save_recipe,
    model_options,
    output_option,
    save_recipe_option,
)
from ptopt.compress.prune.api import OPTIONS


@click.command("prune")
@click.argument("model")
@declared(OPTIONS)
@output_option(
    folder_ok=True,
    help="Where to write the artifact (a .ptopt.json sidecar beside it): .pt TorchScript, .pt2 an "
    "ExportedProgram; a folder for a Hugging Face model (an earlier ptopt folder is written over).",
)
@data_option(
    "--fine-tune-data", "Fine-tune after pruning on this DATA (labelled, or --teacher).", metavar="DATA"
)
@data_option(
    "--eval-data",
    "Held-out DATA: the cosine to the unpruned model; with labels also accuracy before/after, and the "
    "best epoch is kept; a causal language model's text (.txt, token ids): perplexity before/after.",
)
@model_options
@input_shape_option
@save_recipe_option
@guard_paths(
    {
        "model": "MODEL",
        "weights": "--weights",
        "fine_tune_data": "--fine-tune-data",
        "eval_data": "--eval-data",
    },
    {"output": "-o", "save_recipe": "--save-recipe"},
    OPTIONS,
)
def command(
    model: str,
    output: str,
    fine_tune_data: str | None,
    eval_data: str | None,
    weights: str | None,
    allow_pickle: bool,
    input_shapes: tuple[str, ...],
    save_recipe: str | None,
    **params: Any,
) -> None:
    """Prune MODEL and write a dense model that loads with plain torch: TorchScript (.pt) or an
    ExportedProgram (.pt2), with a sidecar describing what was pruned.

    \b
    Structured pruning removes whole channels, so the model is really smaller and faster.
    Unstructured (l1-unstructured, global) only zeroes weights: same size on disk, no faster;
    what the zeros save is the gzip size.
    """
    from ptopt.cli.options import warning_lines
    from ptopt.compress.prune import PruneWarning, prune
    from ptopt.compress.teacher_check import UntrainedTeacherWarning

    common = dict(fine_tune_data=fine_tune_data, eval_data=eval_data, weights=weights)
    common |= dict(allow_pickle=allow_pickle or None, input_shapes=input_shapes)
    options = {"model": model, "output": output, **given(common), **given(params)}
    # each pruning warning as it comes (an --exclude that matches nothing, a factory teacher that looks
    # untrained: before the work, not after it); any other warning as the CLI shows it
    with warning_lines(PruneWarning, UntrainedTeacherWarning):
        art = prune(**options, progress=True)
    _print_report(art, options["method"])
    maybe_save_recipe(save_recipe, "prune", options)


def _print_report(art, method: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    m, extra = art.metrics, art.extra
    t = Table(title=f"{method} pruning", show_lines=False)
    if method == "structured":
        for col in ("layer", "channels", "pruned with", "kept because"):
            t.add_column(col, no_wrap=col in ("layer", "channels"))
        for r in extra["layers"]:
            t.add_row(
                escape(r["layer"]),
                f"{r['channels_before']} → {r['channels_after']}",
                escape(", ".join(r["pruned_with"])),
                escape(r["kept_reason"] or ""),
            )
    else:
        for col in ("layer", "type", "weights", "sparsity"):
            t.add_column(col, justify="left" if col in ("layer", "type") else "right", no_wrap=True)
        for r in extra["layers"]:
            t.add_row(escape(r["layer"]), r["type"], f"{r['weights']:,}", f"{r['sparsity']:.3f}")
    echo_table(t)
    click.echo(
        f"parameters: {m['parameters_before']:,} → {m['parameters_after']:,} "
        f"({m['parameter_ratio']:.2f}×; non-zero {m['nonzero_parameters_after']:,})"
    )
    if "sparsity" in m:
        click.echo(f"sparsity:   {m['sparsity']:.4f} of the pruned weights are zero")
    experts = m.get("unpruned_experts")
    if experts:
        from ptopt.core.lm import pattern_summary

        share = 100 * experts["parameters"] / max(m["parameters_before"], 1)
        click.echo(
            f"not pruned: {len(experts['tensors'])} fused expert tensors ({pattern_summary(experts['tensors'])}; "
            f"{experts['parameters']:,} parameters, {share:.1f}% of the model): pruning takes Linear and Conv "
            "layers, not a mixture of experts' 3-D Parameters"
        )
    click.echo(
        f"weights:    raw {m['weights_bytes_before']:,} → {m['weights_bytes_after']:,} bytes; "
        f"gzip {m['weights_gzip_bytes_before']:,} → {m['weights_gzip_bytes_after']:,} bytes"
    )
    if "accuracy_before" in m:
        on = f" on {m['accuracy_data']} ({m['accuracy_samples']} samples)" if "accuracy_data" in m else ""
        click.echo(
            f"accuracy:   {100 * m['accuracy_before']:.2f}% → {100 * m['accuracy_after']:.2f}% "
            f"({drop_text(m['accuracy_drop_points'])}){on}"
        )
    if m.get("labels_note"):
        click.echo(f"note:       {m['labels_note']}")
    if "perplexity_before" in m:
        from ptopt.core.lm import scored_tokens

        w = m["perplexity_window"]
        click.echo(
            f"perplexity: {m['perplexity_before']:.3f} → {m['perplexity_after']:.3f} "
            f"({m['perplexity_increase_pct']:+.2f}%) on {scored_tokens(w)} of {m['eval_data']} "
            f"(context {w['context']}, stride {w['stride']})"
        )
    if m.get("vs_source"):
        from ptopt.compress.fidelity import describe

        click.echo(f"vs unpruned: {describe(m['vs_source'])}")
    elif any("output is narrower" in n for n in extra.get("notes") or []):
        click.echo("vs unpruned: not compared: the output is narrower (--no-prune-hidden keeps its width)")
    if extra.get("checked_vs_masked") is False:
        click.echo(
            "note:       the pruned model is not checked against the unpruned one with the removed channels "
            "zeroed: a norm over pruned channels that is no plain LayerNorm / RMSNorm (a channels-first LayerNorm, "
            "a GroupNorm) makes the two differ by design; 'vs unpruned' is what pruning cost"
        )
    if extra.get("note"):
        click.echo(f"note:       {extra['note']}")
    click.echo(
        f"wrote {art.path} ({art.format}, {art.size_bytes:,} bytes, gzip {extra['gzip_bytes']:,} bytes)"
    )
