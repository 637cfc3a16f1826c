"""``ptopt package ARTIFACT --format mar|triton -o OUT``."""

from __future__ import annotations

import click

from ptopt.cli.options import (
    guard_paths,
    input_shape_option,
    maybe_save_recipe,
    model_options,
    save_recipe_option,
)


@click.command("package")
@click.argument("artifact")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["mar", "triton"]),
    required=True,
    help="mar: a TorchServe model archive; triton: a Triton Inference Server model repository (a folder).",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(),
    help="OUT.mar for --format mar; the repository folder for --format triton.",
)
@click.option(
    "--batch-size",
    type=int,
    default=1,
    show_default=True,
    help="Server-side request batching: up to this many requests run as one batch.",
)
@click.option(
    "--max-batch-delay",
    "max_batch_delay_ms",
    type=int,
    default=None,
    help="Milliseconds the server waits to fill a batch (default 5).",
)
@click.option(
    "--workers",
    default="1",
    show_default=True,
    help="Worker processes (TorchServe) or model instances (Triton); 'auto': one per physical core, "
    "each with one thread (unless --threads).",
)
@click.option(
    "--threads", type=int, default=None, help="Intra-op threads per worker (default: the runtime's)."
)
@click.option(
    "--model-name", default=None, help="Name served under (default: from the output / artifact name)."
)
@input_shape_option
@model_options
@save_recipe_option
@guard_paths(
    {"artifact": "ARTIFACT", "weights": "--weights"}, {"output": "-o", "save_recipe": "--save-recipe"}
)
def command(
    artifact: str,
    fmt: str,
    output: str,
    batch_size: int,
    max_batch_delay_ms: int | None,
    workers: str,
    threads: int | None,
    model_name: str | None,
    input_shapes: tuple[str, ...],
    weights: str | None,
    allow_pickle: bool,
    save_recipe: str | None,
) -> None:
    """Package ARTIFACT for a model server.

    ARTIFACT is a TorchScript .pt (fp32 or int8), an .onnx file or a .pt2 (AOTInductor package:
    needs --allow-pickle; ExportedProgram: fp32 or PT2E int8), best with its ptopt sidecar, which
    says what inputs the server accepts (else give --input-shape); any other MODEL reference is
    exported to TorchScript first. Triton takes AOTInductor packages (platform torch_aoti) but not
    ExportedPrograms, which are exported to TorchScript for it.

    \b
      ptopt package model.int8.pt --format mar -o model.mar --batch-size 8
      ptopt package model.onnx --format triton -o model_repository
    """
    from ptopt.serve.package import DEFAULT_MAX_BATCH_DELAY_MS, package

    options = dict(
        batch_size=batch_size,
        max_batch_delay_ms=DEFAULT_MAX_BATCH_DELAY_MS if max_batch_delay_ms is None else max_batch_delay_ms,
        workers=int(workers) if workers.strip().isdigit() else workers,
        threads=threads,
        model_name=model_name,
        weights=weights,
        allow_pickle=allow_pickle,
    )
    art = package(artifact, fmt, output, input_shapes=list(input_shapes), **options)
    name = art.extra["model_name"]
    click.echo(
        f"wrote {art.path} ({art.size_bytes:,} bytes): {fmt} of "
        f"{'an' if art.extra['model_format'][0] in 'aeiou' else 'a'} {art.extra['model_format']} "
        f"{art.precision} model, served as {name!r}"
    )
    for s in art.inputs:
        click.echo(f"input:  {s.describe()}")
    click.echo(
        f"batching: up to {art.config['batch_size']} request(s), {art.config['max_batch_delay_ms']} ms delay; "
        f"workers: {art.config['workers']}"
        + (f" ({workers}: physical cores)" if workers == "auto" else "")
        + (f", {art.config['threads']} thread(s) each" if art.config["threads"] else "")
    )
    if fmt == "mar":
        click.echo(f"serve it: ptopt serve {art.path}")
    else:
        click.echo(f"serve it: tritonserver --model-repository {art.path}")
    maybe_save_recipe(
        save_recipe,
        "package",
        dict(artifact=artifact, format=fmt, output=output, input_shapes=list(input_shapes), **options),
    )
