"""``ptopt export MODEL --target torchscript|onnx|tensorrt|exported_program|aoti -o OUT``."""

from __future__ import annotations

import click

from ptopt.cli.options import maybe_save_recipe, model_options, output_option, save_recipe_option


@click.command("export")
@click.argument("model")
@click.option(
    "--target",
    required=True,
    metavar="TARGET",
    help="torchscript | onnx | openvino (.xml IR, OpenVINO's CPU plugin) | tensorrt | exported_program "
    "(.pt2) | aoti (.pt2 AOTInductor package, compiled for this CPU, or the GPU of --device, and this torch).",
)
@click.option(
    "--min-shape",
    "min_shape",
    multiple=True,
    metavar="[NAME=]SHAPE",
    help="Smallest input shape, e.g. 1x1x32x32 or input_ids=1x16 (repeat per input).",
)
@click.option(
    "--opt-shape",
    "opt_shape",
    multiple=True,
    metavar="[NAME=]SHAPE",
    help="Shape to optimize for (TensorRT's opt profile; the trace/export example).",
)
@click.option("--max-shape", "max_shape", multiple=True, metavar="[NAME=]SHAPE", help="Largest input shape.")
@click.option(
    "--dynamic-batch", metavar="MIN:OPT:MAX", help="Dynamic batch dimension for every input, e.g. 1:8:64."
)
@click.option(
    "--precision",
    type=str,
    default=None,
    help="fp32 | fp16 | bf16 | int8 (default: the source's). fp16/bf16: weights and activations in "
    "half precision (torchscript, exported_program, aoti, onnx; fp16 needs --device cuda); onnx: int8 "
    "via ORT static quantization; tensorrt: fp16/bf16/int8 engines.",
)
@click.option(
    "--device",
    default=None,
    help="cpu (default) | cuda | cuda:N: trace / export / compile and check the artifact on that GPU.",
)
@click.option(
    "--cuda-graphs",
    is_flag=True,
    help="aoti on --device cuda: replay the package through CUDA graphs (one capture per input shape).",
)
@click.option(
    "--static-batch",
    "static_batch",
    metavar="B[,B...]",
    help="aoti: also compile a fixed-batch model for each of these batch sizes into the package (run "
    "for a batch of exactly that size; faster: Inductor prepacks conv weights only at a fixed batch).",
)
@click.option("--data", help="DATA: input shapes when the model declares none, and int8 calibration.")
@click.option("--opset", type=int, help="ONNX opset (default: the exporter's).")
@click.option("--optimize", is_flag=True, help="onnx: save ORT's offline graph optimization of the model.")
@click.option("--script", is_flag=True, help="torchscript: torch.jit.script instead of tracing.")
@click.option(
    "--atol", type=float, help="Parity tolerance, absolute (default 1e-4 fp32, 1e-1 int8, 1e-2 fp16)."
)
@click.option("--rtol", type=float, help="Parity tolerance, relative to the largest source output.")
@click.option(
    "--min-cosine",
    type=float,
    metavar="C",
    help="Your budget: the worst sample's cosine with the source the artifact must keep (default 0.99 "
    "int8, 0.999 half, 0.9999 fp32).",
)
@click.option(
    "--int8-method",
    default="auto",
    show_default=True,
    help="int8 ONNX: auto | ort_static (ORT quantizes the fp32 parent with --data) | ort_dynamic "
    "(ORT quantize_dynamic: int8 matrix products, no calibration data) | qdq_export.",
)
@click.option(
    "--accuracy-control",
    is_flag=True,
    help="openvino int8: NNCF's accuracy-aware quantization (nncf.quantize_with_accuracy_control): the ops "
    "that cost the most stay float until --min-cosine C or --max-accuracy-drop PTS holds on the validation data.",
)
@click.option(
    "--max-accuracy-drop",
    type=float,
    metavar="PTS",
    help="--accuracy-control's goal as points of top-1 below the fp32 model (labelled validation data).",
)
@click.option("--validation-data", help="DATA --accuracy-control validates on (default: --data).")
@click.option(
    "--exclude",
    "exclude",
    multiple=True,
    metavar="MODULE",
    help="openvino int8: keep this module (a Linear or Conv of MODEL, e.g. layers.0.ff2) float; repeatable.",
)
@model_options
@output_option()
@save_recipe_option
def command(
    model: str,
    target: str,
    min_shape: tuple[str, ...],
    opt_shape: tuple[str, ...],
    max_shape: tuple[str, ...],
    dynamic_batch: str | None,
    precision: str | None,
    data: str | None,
    opset: int | None,
    optimize: bool,
    script: bool,
    atol: float | None,
    rtol: float | None,
    min_cosine: float | None,
    int8_method: str,
    accuracy_control: bool,
    max_accuracy_drop: float | None,
    validation_data: str | None,
    exclude: tuple[str, ...],
    device: str | None,
    cuda_graphs: bool,
    static_batch: str | None,
    weights: str | None,
    allow_pickle: bool,
    output: str,
    save_recipe: str | None,
) -> None:
    """Export MODEL to TARGET, run the artifact against MODEL at the min/opt/max shapes (parity), and
    write OUT with its .ptopt.json sidecar.

    \b
    Examples:
      ptopt export zoo:resnet --target onnx --dynamic-batch 1:8:64 -o resnet.onnx
      ptopt export resnet.int8.pt --target onnx -o resnet.int8.onnx
      ptopt export zoo:transformer --target torchscript --min-shape input_ids=1x16 \\
            --min-shape attention_mask=1x16 ... -o transformer.pt
    """
    from ptopt.export.api import export

    options = dict(
        target=target,
        min_shape=list(min_shape) or None,
        opt_shape=list(opt_shape) or None,
        max_shape=list(max_shape) or None,
        dynamic_batch=dynamic_batch,
        precision=precision,
        opset=opset,
        optimize=optimize or None,
        script=script or None,
        atol=atol,
        rtol=rtol,
        min_cosine=min_cosine,
        data=data,
        weights=weights,
        allow_pickle=allow_pickle or None,
        int8_method=None if int8_method == "auto" else int8_method,
        device=device,
        cuda_graphs=cuda_graphs or None,
        static_batches=static_batch,
        accuracy_control=accuracy_control or None,
        max_accuracy_drop=max_accuracy_drop,
        validation_data=validation_data,
        float_modules=list(exclude) or None,
    )
    art = export(
        model, target, output, **{k: v for k, v in options.items() if k != "target" and v is not None}
    )
    _print_result(art)
    maybe_save_recipe(save_recipe, "export", {"model": model, "output": output, **options})


def _print_result(art) -> None:
    """What was written, its inputs, the parity numbers and the target's own facts."""
    p = art.metrics["parity"]
    click.echo(
        f"wrote {art.path} ({art.format}, {art.precision}, {art.size_bytes:,} bytes"
        + (f" in {len(art.files)} files" if len(art.files) > 1 else "")
        + ")"
    )
    for s in art.inputs:
        click.echo(f"input:   {s.describe()}")
    rule = (
        f"your budget: worst-sample cosine >= {p['min_cosine']:g}"
        if p.get("atol") is None
        else f"tolerance atol {p['atol']:g}, rtol {p['rtol']:g}"
    )
    click.echo(
        f"parity:  max abs diff {p['max_abs_diff']:.3g}, rel error {p['rel_error']:.3g}, cosine "
        f"{p['cosine']:.6f} at min/opt/max ({rule})"
    )
    if art.extra.get("int8_method"):
        click.echo(f"int8:    {art.extra['int8_method']}")
    control = (art.extra.get("nncf") or {}).get("accuracy_control")
    if control:
        goal = (
            f"worst-sample cosine projected to {control.get('reference_samples', 1000)} samples "
            f">= {control['min_cosine']:g}"
            if "min_cosine" in control
            else f"top-1 drop <= {control['max_accuracy_drop']:g} pts"
        )
        click.echo(
            f"nncf:    accuracy control ({goal} on {control['validation_samples']} validation samples); "
            f"{control['fake_quantize_ops']} FakeQuantize ops left int8"
        )
    for w in art.extra.get("trace_warnings") or []:
        click.echo(f"note:    tracer: {w}")
    if art.extra.get("compile_seconds") is not None:
        target = art.extra.get("cpu_isa") or "cpu"
        if str(art.extra.get("device", "cpu")).startswith("cuda"):
            target = str(art.extra["device"]) + (", CUDA graphs" if art.extra.get("cuda_graphs") else "")
        click.echo(
            f"compile: AOTInductor ({art.extra.get('compiler')}, {target}) in "
            f"{art.extra['compile_seconds']:.1f} s, torch {art.extra.get('torch_version')}"
        )
    fixed = p.get("static_batches") or {}
    if fixed:
        each = ", ".join(f"{b} (cosine {v['cosine']:.6f})" for b, v in fixed.items())
        click.echo(f"fixed:   batch-size models {each}; other batches run the dynamic-batch model")
    if str(art.extra.get("device", "cpu")).startswith("cuda") or art.extra.get("dtype"):
        click.echo(f"device:  {art.extra.get('device', 'cpu')}, {art.extra.get('dtype', 'float32')}")
    if art.extra.get("trtexec_shapes"):
        click.echo(f"trtexec: trtexec --onnx={art.path} {art.extra['trtexec_shapes']}")
