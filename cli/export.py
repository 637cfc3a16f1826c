"""``ptopt export MODEL --target torchscript|onnx|tensorrt|exported_program|aoti -o OUT``."""

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
    save_recipe_option,
)
from ptopt.export.config import OPTIONS


@click.command("export")
@click.argument("model")
@declared(OPTIONS)
@data_option("--data", "DATA: input shapes when the model declares none, and int8 calibration.")
@data_option("--validation-data", "DATA --accuracy-control validates on (default: --data).")
@model_options
@input_shape_option
@output_option(
    help="Where to write the artifact (a .ptopt.json sidecar is written next to it); a folder for a "
    "causal language model (hf:DIR).",
    folder_ok=True,
)
@save_recipe_option
@guard_paths(
    {"model": "MODEL", "weights": "--weights", "data": "--data", "validation_data": "--validation-data"},
    {"output": "-o", "save_recipe": "--save-recipe"},
)
def command(
    model: str,
    output: str,
    data: str | None,
    validation_data: str | None,
    weights: str | None,
    allow_pickle: bool,
    input_shapes: tuple[str, ...],
    save_recipe: str | None,
    **params: Any,
) -> None:
    """Export MODEL to TARGET, run the artifact against MODEL at the min/opt/max shapes (parity), and
    write OUT with its .ptopt.json sidecar. A model that declares no inputs takes --data or
    --input-shape (its first dimension the batch, dynamic from 1 to 64, as in quantize; --dynamic-batch
    sets the range), or a --min/--opt/--max-shape range (--opt-shape alone: a static shape).

    \b
    Examples:
      ptopt export zoo:resnet --target onnx --dynamic-batch 1:8:64 -o resnet.onnx
      ptopt export resnet.int8.pt --target onnx -o resnet.int8.onnx
      ptopt export zoo:transformer --target torchscript --min-shape input_ids=1x16 \\
            --min-shape attention_mask=1x16 ... -o transformer.pt
      ptopt export hf:smollm2 --target onnx -o smollm2-onnx/   # a causal LM: a folder, KV cache in/out
    """
    from ptopt.export.api import export

    common = dict(
        data=data, validation_data=validation_data, weights=weights, allow_pickle=allow_pickle or None,
        input_shapes=list(input_shapes) or None,
    )  # fmt: skip
    options = {"model": model, "output": output, **given(common), **given(params)}
    art = export(**options)
    _print_result(art)
    maybe_save_recipe(save_recipe, "export", options)


def _print_result(art) -> None:
    """What was written, its inputs, the parity numbers and the target's own facts."""
    from ptopt.export.parity import all_zero_note

    if "lm" in art.extra:
        _print_lm(art)
        return
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
        f"{p['cosine']:.6f} at min/opt/max on {_parity_inputs(art, p)} ({rule})"
    )
    if all_zero_note(p):
        click.echo(f"note:    {all_zero_note(p)}")
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
        click.echo(_compile_line(art.extra, target))
    fixed = p.get("static_batches") or {}
    if fixed:
        each = ", ".join(f"{b} (cosine {v['cosine']:.6f})" for b, v in fixed.items())
        click.echo(f"fixed:   batch-size models {each}; other batches run the dynamic-batch model")
    if str(art.extra.get("device", "cpu")).startswith("cuda") or art.extra.get("dtype"):
        click.echo(f"device:  {art.extra.get('device', 'cpu')}, {art.extra.get('dtype', 'float32')}")
    if art.extra.get("trtexec_shapes") and _gpu_here():  # TensorRT's trtexec needs an NVIDIA GPU
        click.echo(f"trtexec: trtexec --onnx={art.path} {art.extra['trtexec_shapes']}")


def _print_lm(art) -> None:
    """A causal LM's export folder: its graph's inputs and outputs, the check against transformers."""
    lm, p, g = art.extra["lm"], art.metrics["parity"], art.metrics["greedy"]
    click.echo(f"wrote {art.path}/ ({art.format}, fp32, {art.size_bytes:,} bytes in {len(art.files)} files)")
    lay, (lo, hi) = lm["layout"], lm["batch"]
    if lm.get("stateful"):
        io = "input_ids, attention_mask -> logits; the KV cache is state the OpenVINO CPU plugin keeps (batch 1)"
    else:
        io = (
            f"input_ids, attention_mask, position_ids, past_key_values.0..{lay['layers'] - 1}.key/value -> logits, "
            f"present.0..{lay['layers'] - 1}.key/value ([batch, {lay['kv_heads']}, seq, {lay['head_dim']}]); "
            f"batch {lo}..{hi}"
        )
    click.echo(f"graph:   {io}; up to {lm['max_positions']} positions")
    moe = lm.get("experts")
    if moe:
        k = moe.get("top_k")
        cost = f" ({moe['per_layer'] / k:.1f}x a routed run's expert work)" if k else ""
        click.echo(f"experts: {moe['per_layer']} per layer, top-{k or '?'} routing: the graph runs all of them "
                   f"on every token, weighted by the router{cost}")  # fmt: skip
    tie = f"differ from token {g.get('first_difference')} (a near tie: top-2 gap {g.get('top2_gap', 0):.2g})"
    same = "equal" if g["equal"] else tie
    click.echo(
        f"check:   greedy tokens {same} to transformers' for {g['new_tokens']} new tokens after a "
        f"{g['prompt_tokens']}-token prompt"
    )
    click.echo(
        f"parity:  logits max abs diff {p['max_abs_diff']:.3g}, rel error {p['rel_error']:.3g}, worst cosine "
        f"{p['cosine']:.6f} over {p['positions']} positions (tolerance atol {p['atol']:g}, rtol {p['rtol']:g})"
    )
    b = art.metrics.get("batch")
    if b is not None:
        click.echo(
            f"batch:   a left-padded batch of 2: max abs diff {b['max_abs_diff']:.3g}, cosine {b['cosine']:.6f}"
        )
    if art.extra.get("compile_seconds") is not None:
        click.echo(_compile_line(art.extra, art.extra.get("cpu_isa") or "cpu"))


def _compile_line(extra: dict, target: str) -> str:
    """How an AOTInductor package was built: compiled now, or copied from ptopt's compile cache."""
    head = f"compile: AOTInductor ({extra.get('compiler')}, {target})"
    torch_v = f"torch {extra.get('torch_version')}"
    if extra.get("compile_cache"):
        return (
            f"{head} from ptopt's compile cache: the same program built the same way on "
            f"{extra['compile_cache'].get('built')} in {extra['compile_seconds']:.1f} s, {torch_v} "
            f"(PTOPT_AOTI_CACHE=0 compiles afresh)"
        )
    return f"{head} in {extra['compile_seconds']:.1f} s, {torch_v}"


def _parity_inputs(art, parity: dict) -> str:
    """What the parity check ran on: samples of --data (the calibration data of an int8 export), or
    random inputs of the input shapes."""
    kinds = {m.get("inputs") for m in (parity.get("shapes") or {}).values()}
    data = (art.config or {}).get("calib_data")
    if "data" not in kinds or not data:
        return "random inputs"
    role = "the calibration data" if art.precision == "int8" else "--data"
    return f"samples of {data} ({role}" + (
        ", and random inputs where they do not fit)" if "random" in kinds else ")"
    )


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available()
