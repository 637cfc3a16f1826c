"""``ptopt optimize MODEL --calib-data D --eval-data E (--accuracy-budget P | --min-cosine C) -o DIR``
(options: ``ptopt.optimize.options``)."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import (
    data_option,
    declared,
    given,
    guard_paths,
    input_shape_option,
    maybe_save_recipe,
    model_options,
    output_option,
    quiet_option,
    save_recipe_option,
)
from ptopt.optimize.options import OPTIONS


@click.command("optimize")
@click.argument("model")
@data_option("--calib-data", "DATA reference: calibration samples for the int8 candidates.")
@data_option("--eval-data", "DATA reference: the samples every candidate is judged on (labels give top-1).")
@data_option("--train-data", "DATA reference: enables structured pruning with a short fine-tune.")
@declared(OPTIONS)
@input_shape_option
@model_options
@output_option(folder=True)
@quiet_option
@save_recipe_option
@guard_paths(
    {"model": "MODEL", "calib_data": "--calib-data", "eval_data": "--eval-data", "train_data": "--train-data",
     "weights": "--weights"},
    {"output": "-o", "save_recipe": "--save-recipe"},
)  # fmt: skip
def command(
    model: str,
    calib_data: str | None,
    eval_data: str | None,
    train_data: str | None,
    input_shapes: tuple[str, ...],
    weights: str | None,
    allow_pickle: bool,
    output: str,
    quiet: bool,
    save_recipe: str | None,
    **params: Any,
) -> None:
    """Build every candidate artifact of MODEL (fp32 in TorchScript, ExportedProgram, ONNX Runtime,
    AOTInductor; static int8 FX, PT2E and ONNX QDQ; dynamic int8; int8 with float layers; with
    --train-data, structured pruning + fine-tune), reject those outside the accuracy budget, time the
    rest against the fp32 model in shared interleaved rounds, and write DIR/best.<ext> (ready for
    `ptopt package`), DIR/candidates/ and the reports. A causal language model with
    --max-perplexity-increase: the weight-only search for the fastest decode. Exit 0 with a winner, 1
    when no candidate meets the budget (the best found is still written), 2 on bad input."""
    from ptopt.optimize.api import optimize

    def progress(msg: str) -> None:
        if not quiet:
            click.echo(msg, err=True)

    data = dict(calib_data=calib_data, eval_data=eval_data, train_data=train_data, weights=weights)
    common = dict(input_shapes=list(input_shapes) or None, allow_pickle=allow_pickle or None, **data)
    options = {"model": model, "output": output, **given(common), **given(params)}
    result = optimize(**options, progress=progress)
    # as validate's: written when no candidate met the budget too (exit 1), to rerun with another budget
    maybe_save_recipe(save_recipe, "optimize", options)
    print_result(result)


def print_result(result: Any, gate: bool = True) -> None:
    """The summary ``ptopt optimize`` prints (a ``ptopt run`` optimize step too); with ``gate``,
    GateFailedError (exit 1) when no candidate meets the budget."""
    from ptopt.core.errors import GateFailedError
    from ptopt.optimize.api import OptimizeResult, render
    from ptopt.optimize.lm import render_lm

    if not isinstance(result, OptimizeResult):  # the language-model search
        click.echo(render_lm(result.report))
        if gate and result.winner is None:
            raise GateFailedError("no candidate meets the perplexity budget")
        return
    out = result.directory
    click.echo(render(result.report, out))
    if gate and result.exit_code == 1:
        closest = result.report["best"]
        where = f"the closest ({closest}) is in {out}" if closest else f"nothing to write as best; see {out}"
        raise GateFailedError(f"no candidate meets the accuracy budget within the time budget; {where}")
