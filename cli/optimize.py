"""``ptopt optimize MODEL --calib-data D --eval-data E (--max-accuracy-drop P | --min-cosine C) -o DIR``."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import guard_paths, input_shape_option, model_options
from ptopt.optimize.candidates import runtime_filters


@click.command("optimize")
@click.argument("model")
@click.option("--calib-data", help="DATA reference: calibration samples for the int8 candidates.")
@click.option(
    "--eval-data", help="DATA reference: the samples every candidate is judged on (labels give top-1)."
)
@click.option(
    "--max-accuracy-drop",
    type=float,
    metavar="PTS",
    help="Accuracy budget: points of top-1 below the fp32 model on --eval-data (needs labels).",
)
@click.option(
    "--min-cosine",
    type=float,
    metavar="C",
    help="Accuracy budget: the worst sample's cosine with the fp32 outputs (for unlabelled data).",
)
@click.option(
    "--max-perplexity-increase",
    type=float,
    metavar="PCT",
    help="Budget for a causal language model: % perplexity over fp32 on --eval-data text; searches the "
    "weight-only int8/int4 candidates for the fastest decode.",
)
@click.option(
    "--batch-size",
    "batch_sizes",
    default="1,32",
    show_default=True,
    help="Batch sizes to time; the largest ranks.",
)
@click.option(
    "--runtime",
    type=click.Choice(list(runtime_filters())),
    default="any",
    show_default=True,
    help="Only candidates that run on this runtime (torch includes AOTInductor).",
)
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda.")
@click.option(
    "--time-budget",
    default="9m",
    show_default=True,
    help="Wall time for the whole search, writing -o included (600, 90s, 10m); candidates that do not fit "
    "are skipped.",
)
@click.option("--train-data", help="DATA reference: enables structured pruning with a short fine-tune.")
@click.option(
    "--candidates", help="Only these candidates (comma-separated names; the fp32 reference always runs)."
)
@click.option("--skip", help="Leave these candidates out (comma-separated names), e.g. fp32-aoti,int8-pt2e.")
@click.option("--threads", type=int, help="Intra-op threads for every runtime (default: all usable cores).")
@click.option("--rounds", type=int, help="Interleaved timing rounds (default 15).")
@click.option("--min-seconds", type=float, help="Timed seconds per candidate and batch size (default 3.0).")
@input_shape_option
@model_options
@click.option(
    "-o", "--output", required=True, type=click.Path(), help="A new (or empty) folder for the results."
)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@guard_paths(
    {"model": "MODEL", "calib_data": "--calib-data", "eval_data": "--eval-data", "train_data": "--train-data",
     "weights": "--weights"},
    {"output": "-o"},
)  # fmt: skip
def command(quiet: bool, **params: Any) -> None:
    """Build every candidate artifact of MODEL (fp32 in TorchScript, ExportedProgram, ONNX Runtime,
    AOTInductor; static int8 FX, PT2E and ONNX QDQ; dynamic int8; int8 with float layers; with
    --train-data, structured pruning + fine-tune), reject those outside the accuracy budget, time the
    rest against the fp32 model in shared interleaved rounds, and write DIR/best.<ext> (ready for
    `ptopt package`), DIR/candidates/ and the reports. Exit 0 with a winner, 1 when no candidate meets
    the budget (the best found is still written), 2 on bad input."""
    from ptopt.core.errors import GateFailedError
    from ptopt.optimize.api import optimize, render

    def progress(msg: str) -> None:
        if not quiet:
            click.echo(msg, err=True)

    params["input_shapes"] = list(params["input_shapes"]) or None
    if params["max_perplexity_increase"] is not None:
        return _language_model(params, progress)
    result = optimize(params.pop("model"), **params, progress=progress)
    out = result.directory
    click.echo(render(result.report, out))
    if result.exit_code == 1:
        closest = result.report["best"]
        where = f"the closest ({closest}) is in {out}" if closest else f"nothing to write as best; see {out}"
        raise GateFailedError(f"no candidate meets the accuracy budget within the time budget; {where}")


def _language_model(params: dict[str, Any], progress: Any) -> None:
    """``--max-perplexity-increase``: the language-model search; its table, exit 1 without a winner."""
    from ptopt.core.errors import GateFailedError
    from ptopt.optimize.api import optimize
    from ptopt.optimize.lm import render_lm

    if params["batch_sizes"] != "1,32" or params["runtime"] != "any" or params["device"] != "cpu":
        raise click.UsageError(
            "--batch-size, --runtime and --device do not apply to the language-model search"
        )
    for key in ("batch_sizes", "runtime", "device", "min_seconds"):
        params.pop(key)
    result = optimize(params.pop("model"), **params, progress=progress)
    click.echo(render_lm(result.report))
    if result.winner is None:
        raise GateFailedError("no candidate meets the perplexity budget")
