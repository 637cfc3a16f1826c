"""``ptopt package ARTIFACT --format mar|triton|ray -o OUT``."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import (
    declared,
    given,
    guard_paths,
    input_shape_option,
    maybe_save_recipe,
    model_options,
    output_option,
    save_recipe_option,
)
from ptopt.serve.package import OPTIONS


@click.command("package")
@click.argument("artifact")
@declared(OPTIONS)
@output_option(help="OUT.mar for --format mar; the folder for --format triton and ray.", folder_ok=True)
@input_shape_option
@model_options
@save_recipe_option
@guard_paths(
    {"artifact": "ARTIFACT", "weights": "--weights"}, {"output": "-o", "save_recipe": "--save-recipe"}
)
def command(
    artifact: str,
    output: str,
    input_shapes: tuple[str, ...],
    weights: str | None,
    allow_pickle: bool,
    save_recipe: str | None,
    **params: Any,
) -> None:
    """Package ARTIFACT for a model server.

    ARTIFACT is a TorchScript .pt (fp32 or int8), an .onnx file or a .pt2 (AOTInductor package:
    needs --allow-pickle; ExportedProgram: fp32 or PT2E int8), best with its ptopt sidecar, which
    says what inputs the server accepts (else give --input-shape); any other MODEL reference is
    exported to TorchScript first. Triton takes AOTInductor packages (platform torch_aoti) but not
    ExportedPrograms, which are exported to TorchScript for it. Ray Serve also takes OpenVINO IR and
    the language-model folders (served as text generation).

    \b
      ptopt package model.int8.pt --format mar -o model.mar --batch-size 8
      ptopt package model.onnx --format triton -o model_repository
      ptopt package model.int8.pt --format ray -o model_ray --replicas 2 --max-batch-size 16
    """
    from ptopt.serve.package import package

    common = dict(input_shapes=list(input_shapes), weights=weights, allow_pickle=allow_pickle or None)
    options = dict(artifact=artifact, output=output, **given(common), **given(params))
    art = package(**options)
    fmt, workers = options["format"], options.get("workers")
    _describe(art, fmt, workers)
    maybe_save_recipe(save_recipe, "package", options)


def _describe(art: Any, fmt: str, workers: Any) -> None:
    from ptopt.core.formats import with_article

    name = art.extra["model_name"]
    click.echo(
        f"wrote {art.path} ({art.size_bytes:,} bytes): {fmt} of "
        f"{with_article(art.extra['model_format'])} "
        f"{art.precision} model, served as {name!r}"
    )
    for s in art.inputs:
        click.echo(f"input:  {s.describe()}")
    if fmt == "ray":
        for what in (art.extra.get("text_input") or {}).values():
            if what:
                click.echo(f"text:   {what}")
        for key in ("pooling", "labels"):
            for what in (art.extra.get(key) or {}).values():
                if what:
                    click.echo(f"output: {what}")
        c = art.config
        scaling = f"autoscaling {c['autoscale']}" if c["autoscale"] else f"{c['replicas']} replica(s)"
        batching = (  # a language model (no tensor inputs) generates one prompt at a time: no batching
            f"batching: up to {c['max_batch_size']} row(s), {c['batch_wait_ms']:g} ms wait"
            if art.inputs
            else "batching: none (a language model generates one prompt at a time)"
        )
        click.echo(f"{batching}; {scaling} x {c['cpus_per_replica']:g} CPU")
        click.echo(f"serve it: serve run {art.path}/serve_config.yaml   (or: ptopt serve {art.path})")
        return
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
