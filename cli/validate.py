"""``ptopt validate REFERENCE ARTIFACT... --data D [gates] [--json J] [--junit X] [--markdown M] [--report R.html]``."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import guard_paths, maybe_save_recipe, model_options, save_recipe_option


@click.command("validate")
@click.argument("reference")
@click.argument("artifacts", nargs=-1, required=True)
@click.option(
    "--data", required=True, help="DATA reference: the samples every artifact runs on (labels give accuracy)."
)
@model_options
@click.option("--batch-sizes", help="Batch sizes to time, comma-separated (default 1,32).")
@click.option(
    "--threads",
    type=int,
    help="Intra-op threads for every runtime (torch and ONNX Runtime). Default: all usable cores.",
)
@click.option(
    "--metric",
    help="Task metric on the labels: top1 (default), top5, mse, mae, or a function pkg.module:fn(outputs, labels).",
)
@click.option("--max-samples", type=int, help="Use only the first N samples of the data.")
@click.option(
    "--eval-batch-size",
    type=int,
    help="Batch size for the accuracy pass (one pass per artifact; default: the larger of 64 and the "
    "largest --batch-sizes).",
)
@click.option(
    "--min-iters", type=int, help="Timed iterations per artifact and batch size, at least (default 20)."
)
@click.option(
    "--min-seconds", type=float, help="Timed seconds per artifact and batch size, at least (default 3.0)."
)
@click.option(
    "--rounds",
    type=int,
    help="Interleaved timing rounds: each artifact's timing is split into this many slices, taken in "
    "turn with the others', so all see the same machine (default 15; language models: generations "
    "per model, default 5).",
)
@click.option(
    "--stable-pct",
    type=float,
    help="Stop an artifact's rounds at a batch size once its median is stable within this %, after at "
    "least half of them (default 2; 0: always run every round).",
)
@click.option(
    "--device",
    default=None,
    help="cpu | cuda | cuda:N: run every artifact there (models moved once, each batch moved once, "
    "latency from CUDA events, peak GPU memory). Default: each runtime's own (the CPU; TensorRT a GPU).",
)
@click.option(
    "--provider",
    "providers",
    multiple=True,
    help="ONNX Runtime execution provider(s) to use, in order (default: TensorRT, CUDA when present, then CPU).",
)
@click.option(
    "--max-accuracy-drop",
    type=float,
    metavar="PTS",
    help="Fail when an artifact's metric drops more than PTS points below the reference's (with --relative: percent).",
)
@click.option(
    "--relative", is_flag=True, help="--max-accuracy-drop is relative: (base - new) / base, in percent."
)
@click.option(
    "--min-agreement",
    type=float,
    help="Fail below this top-1 agreement with the reference (fraction, 0.99 = 99%).",
)
@click.option(
    "--max-latency-ms",
    multiple=True,
    metavar="[BATCH=]MS",
    help="Fail when p50 latency exceeds MS (at every batch size, or BATCH=MS for one); repeatable.",
)
@click.option(
    "--min-speedup",
    type=float,
    help="Fail when reference p50 / artifact p50 is below this, at any batch size.",
)
@click.option(
    "--max-size-mb", type=float, help="Fail when an artifact's files exceed this many MB (10^6 bytes)."
)
@click.option(
    "--baseline", type=click.Path(dir_okay=False), help="A --json report of an earlier run to compare with."
)
@click.option(
    "--max-regression",
    type=float,
    metavar="PCT",
    help="With --baseline: fail when p50 latency grows, or the metric or speedup drops, by more than PCT percent.",
)
@click.option(
    "--regression-on",
    default="latency,accuracy",
    show_default=True,
    help="What --max-regression compares, comma-separated: latency (p50 ms), accuracy (the metric), "
    "speedup (reference p50 / artifact p50 of the same run: what the artifact gains).",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the JSON report here.")
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False),
    help="Write JUnit XML (a test case per artifact x gate).",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False),
    help="Write Markdown for a pull-request comment.",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="Write a self-contained HTML report with plots.",
)
@click.option(
    "--compile",
    "compile_",
    is_flag=True,
    help="Also run every eager / ExportedProgram model (the reference too) through torch.compile, "
    "as an extra row 'NAME (torch.compile)'; its compile time is reported. Needs a C++ compiler.",
)
@click.option(
    "--context",
    type=int,
    help="Language models: tokens of history per perplexity window (default 512, at most the model's positions).",
)
@click.option(
    "--stride", type=int, help="Language models: tokens the perplexity window moves by (default 256)."
)
@click.option(
    "--prompt-tokens",
    type=int,
    help="Language models: prompt length for the timed generations (default 128).",
)
@click.option(
    "--new-tokens", type=int, help="Language models: tokens generated per timed generation (default 32)."
)
@click.option(
    "--max-perplexity-increase",
    type=float,
    metavar="PCT",
    help="Language models: fail when an artifact's perplexity is more than PCT % above the reference's.",
)
@click.option(
    "--min-tokens-per-s",
    type=float,
    metavar="N",
    help="Language models: fail when an artifact decodes fewer than N tokens/s (batch 1, KV cache).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@save_recipe_option
@guard_paths(
    {
        "reference": "REFERENCE",
        "artifacts": "ARTIFACT",
        "data": "--data",
        "baseline": "--baseline",
        "weights": "--weights",
    },
    {
        "json_path": "--json",
        "junit_path": "--junit",
        "markdown_path": "--markdown",
        "report_path": "--report",
        "save_recipe": "--save-recipe",
    },
)
def command(quiet: bool, save_recipe: str | None, **params: Any) -> None:
    """Run REFERENCE and every ARTIFACT on the same --data, each in its own runtime (eager, TorchScript,
    ExportedProgram, ONNX Runtime, TensorRT), and compare accuracy, agreement, size, latency per batch
    size and peak memory. A causal language model (a Hugging Face folder, hf:DIR) with text --data
    (.txt, builtin:pydoc-text:eval, token ids .pt/.npy) gets perplexity, prefill and decode tokens/s
    at batch 1, weight bytes, size on disk and peak memory instead. Exit 1 when a gate fails (after
    writing every report), 2 on bad input, 4 when no gate failed but a latency gate was within the
    timing noise (inconclusive)."""
    from ptopt.validate.api import raise_for_status, validate
    from ptopt.validate.reports import terminal

    def progress(msg: str) -> None:
        if not quiet:
            click.echo(msg, err=True)

    options = twin_options(params)
    result = validate(**options, progress=progress)
    maybe_save_recipe(save_recipe, "validate", options)
    terminal.print_report(result.data)
    for e in result.data["artifacts"]:
        if "compile_seconds" in e.get("info", {}):
            click.echo(f"torch.compile: {e['name']} compiled in {e['info']['compile_seconds']:.1f} s")
    for key, path in result.report_paths.items():
        click.echo(f"{key}: {path}", err=True)
    raise_for_status(result)


def twin_options(params: dict[str, Any]) -> dict[str, Any]:
    """The command's options as ``ptopt.validate``'s keyword arguments (and a recipe step's options:
    unset flags are None, so a saved recipe leaves them out)."""
    options = dict(params)
    options.update(
        artifacts=list(params["artifacts"]),
        relative=params["relative"] or None,
        allow_pickle=params["allow_pickle"] or None,
        max_latency_ms=list(params["max_latency_ms"]),
        providers=list(params["providers"]) or None,
        regression_on=[s.strip() for s in params["regression_on"].split(",") if s.strip()],
        compile=options.pop("compile_") or None,
    )
    return options
