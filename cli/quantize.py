"""``ptopt quantize MODEL --mode dynamic|static|qat -o OUT``."""

from __future__ import annotations

import json
from typing import Any

import click

from ptopt.cli import autoquant
from ptopt.cli.options import (
    guard_paths,
    input_shape_option,
    maybe_save_recipe,
    model_options,
    output_option,
    save_recipe_option,
)
from ptopt.compress.quantize import table

#: below this share of int8 parameters the CLI warns (static mode refuses, see compress.quantize.flow)
MOSTLY_FLOAT = 0.1


@click.command("quantize")
@click.argument("model")
@click.option(
    "--mode",
    type=click.Choice(table.modes()),
    required=True,
    help="dynamic: Linear/LSTM/GRU/Embedding weights int8, no calibration; static: graph-mode int8 calibrated on "
    "--calib-data; qat: fake-quant fine-tuning on --train-data, then int8; weight-only: a language model's "
    "Linear weights to int8/int4 (--bits), written as a Hugging Face folder.",
)
@output_option(required=False, folder_ok=True)
@click.option("--calib-data", help="DATA to calibrate static int8 on (e.g. builtin:digits32:train).")
@click.option(
    "--train-data", help="DATA to fine-tune on in QAT (labelled; without labels it matches fp32 outputs)."
)
@click.option(
    "--eval-data", help="DATA to compare fp32 and int8 accuracy on after quantizing (stored in the sidecar)."
)
@click.option(
    "--backend", default="x86", show_default=True, help="Quantized kernels: x86, fbgemm or qnnpack."
)
@click.option(
    "--observer", help="Static activation observer: histogram (default; 'entropy'), minmax, percentile."
)
@click.option(
    "--per-tensor", is_flag=True, help="Per-tensor weight scales instead of per-channel (the default)."
)
@click.option("--calibration-batches", type=int, help="Static: calibrate on at most this many batches [32].")
@click.option("--batch-size", type=int, help="Batch size of calibration [32] or QAT training [64].")
@click.option(
    "--exclude",
    multiple=True,
    metavar="MODULE",
    help="Keep this module (by name, e.g. layers.2.conv1) in float and don't trace into it (repeatable).",
)
@click.option(
    "--layers", help="Dynamic: comma-separated layer types to quantize [linear,lstm,gru,embedding]."
)
@click.option("--epochs", type=int, help="QAT: fine-tuning epochs [1].")
@click.option("--lr", type=float, help="QAT: learning rate [5e-5].")
@click.option(
    "--engine",
    type=click.Choice(table.engines()),
    help="fx (default): torch.ao graph mode, int8 TorchScript; pt2e: torchao PT2E compiled by "
    "AOTInductor into a .pt2 package (static/qat, x86); auto: both, keeps the faster within 0.5 points. "
    "--mode weight-only: torchao (default, a Hugging Face folder) or openvino (NNCF weights, OpenVINO IR).",
)
@click.option(
    "--compile/--no-compile",
    "compile_",
    default=None,
    help="pt2e: compile the int8 graph into an AOTInductor package (default), or with --no-compile "
    "write the int8 ExportedProgram .pt2 (run it with torch.compile, or ptopt export --target aoti later).",
)
@click.option("--bits", type=int, help="Weight-only: 8 or 4 [8].")
@click.option(
    "--group-size",
    type=int,
    help="Weight-only: a scale per this many input columns (int4: 32, 64, 128 [128]; "
    "int8: per output channel unless given).",
)
@click.option(
    "--method",
    help="Weight-only: rtn (round to nearest, default), hqq (int4), awq or gptq (int4; both fitted on --calib-data text).",
)
@click.option(
    "--calibration-samples", type=int, help="Weight-only awq/gptq: windows of calibration text [16]."
)
@click.option("--calibration-length", type=int, help="Weight-only awq/gptq: tokens per window [256].")
@click.option(
    "--decode-step",
    type=int,
    metavar="TOKENS",
    help="Weight-only: also write decode_step.pt2, the decode step as a torch.export ExportedProgram "
    "with a static KV cache of TOKENS positions (checked against the model before it is written).",
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--json", "as_json", is_flag=True, help="Print the artifact's sidecar as JSON.")
@autoquant.autoquant_options
@model_options
@input_shape_option
@save_recipe_option
@guard_paths(
    {
        "model": "MODEL",
        "weights": "--weights",
        "calib_data": "--calib-data",
        "train_data": "--train-data",
        "eval_data": "--eval-data",
    },
    {"output": "-o", "save_recipe": "--save-recipe"},
)
def command(
    model: str,
    mode: str,
    output: str,
    calib_data: str | None,
    train_data: str | None,
    eval_data: str | None,
    backend: str,
    observer: str | None,
    per_tensor: bool,
    calibration_batches: int | None,
    batch_size: int | None,
    exclude: tuple[str, ...],
    layers: str | None,
    epochs: int | None,
    lr: float | None,
    engine: str | None,
    compile_: bool | None,
    bits: int | None,
    group_size: int | None,
    method: str | None,
    calibration_samples: int | None,
    calibration_length: int | None,
    decode_step: int | None,
    no_progress: bool,
    as_json: bool,
    weights: str | None,
    allow_pickle: bool,
    input_shapes: tuple[str, ...],
    save_recipe: str | None,
    max_accuracy_drop: float | None,
    min_cosine: float | None,
    analyze: bool,
    tuning_budget: str | None,
    threads: int | None,
) -> None:
    """Quantize MODEL to int8 and write a TorchScript file that loads with plain torch.jit.load.

    \b
    Examples:
      ptopt quantize zoo:resnet --mode static --calib-data builtin:digits32:train -o resnet.int8.pt
      ptopt quantize zoo:lstm --mode dynamic -o lstm.int8.pt
      ptopt quantize zoo:resnet --mode qat --train-data builtin:digits32:train --epochs 1 -o resnet.qat.pt
      ptopt quantize zoo:resnet --mode static --calib-data builtin:digits32:train \\
          --eval-data builtin:digits32:test --max-accuracy-drop 0.1 -o resnet.int8.pt
      ptopt quantize hf:smollm2 --mode weight-only --bits 4 --method gptq \\
          --calib-data builtin:pydoc-text:calib --eval-data builtin:pydoc-text:eval -o smollm2.int4
    """
    from ptopt.compress.quantize import quantize

    options = _options(locals())
    if autoquant.wanted(max_accuracy_drop, min_cosine, analyze):  # accuracy-aware search (cli/autoquant.py)
        goal = dict(max_accuracy_drop=max_accuracy_drop, min_cosine=min_cosine, tuning_budget=tuning_budget)
        found = autoquant.run(
            options, analyze=analyze, threads=threads, as_json=as_json, progress=not no_progress, **goal
        )
        if not analyze:
            maybe_save_recipe(
                save_recipe, "quantize", options | {k: v for k, v in goal.items() if v is not None}
            )
        found.raise_if_missed()
        return
    if output is None:
        raise click.UsageError("Missing option '-o' / '--output'.")
    res = quantize(**options, progress=not no_progress)
    maybe_save_recipe(save_recipe, "quantize", options)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=2, default=str))
    elif "weight_only" in (res.extra or {}):  # a weight-only folder, whichever engine wrote it
        _print_weight_only(res)
    else:
        _print_report(res, mode)


def _options(p: dict[str, Any]) -> dict[str, Any]:
    """The Python twin's keywords from the command's parameters (weight-only ones only when given)."""
    options = dict(
        model=p["model"],
        mode=p["mode"],
        output=p["output"],
        calib_data=p["calib_data"],
        train_data=p["train_data"],
        eval_data=p["eval_data"],
        backend=p["backend"],
        observer=p["observer"],
        per_channel=not p["per_tensor"],
        calibration_batches=p["calibration_batches"],
        batch_size=p["batch_size"],
        exclude=tuple(p["exclude"]),
        layers=tuple(t.strip() for t in p["layers"].split(",") if t.strip()) if p["layers"] else None,
        epochs=p["epochs"],
        lr=p["lr"],
        engine=p["engine"],
        weights=p["weights"],
        allow_pickle=p["allow_pickle"],
        input_shapes=tuple(p["input_shapes"]),
        **(
            {} if p["compile_"] is None else {"compile": p["compile_"]}
        ),  # only when given: recipes stay as they were
    )
    llm = dict(bits=p["bits"], group_size=p["group_size"], method=p["method"])
    llm |= dict(calibration_samples=p["calibration_samples"], calibration_length=p["calibration_length"])
    llm |= dict(decode_step=p["decode_step"])
    options |= {k: v for k, v in llm.items() if v is not None}
    return options


def _print_weight_only(art) -> None:
    """What the weight-only folder is: bytes vs fp32, perplexity, the layers kept float."""
    m, rec = art.metrics, art.extra["weight_only"]
    group = f"group {rec['group_size']}" if rec["group_size"] else "per output channel"
    if rec.get("engine") == "openvino":
        acts = f"NNCF {rec['nncf_mode']}, OpenVINO with {rec['inference_precision']} activations"
    else:
        acts = f"{rec['dtype']} activations" + (
            ", bf16 into the int8 kernel" if rec.get("int8_kernel") else ""
        )
    click.echo(
        f"wrote {art.path}/ (int{rec['bits']} weight-only, {rec['method']}, {group}, {acts}): "
        f"weights {m['weight_bytes']:,} bytes = {m['weight_bytes_ratio']:.2f}x fp32 ({m['fp32_weight_bytes']:,}); "
        f"files {art.size_bytes:,} bytes"
    )
    cal = rec.get("calibration")
    if cal:
        click.echo(
            f"calibration: {cal['windows']} windows x {cal['tokens_per_window']} tokens of {cal['data']}"
        )
    if "perplexity" in m:
        w = m["perplexity_window"]
        click.echo(
            f"perplexity on {m['eval_data']} ({w['tokens']} tokens, context {w['context']}, stride {w['stride']}): "
            f"fp32 {m['fp32_perplexity']:.3f} -> {m['perplexity']:.3f} ({m['perplexity_increase_pct']:+.2f}%)"
        )
    if "compressed_matrices" in rec:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(rec["compressed_matrices"].items()))
        click.echo(f"int{rec['bits']}: weight matrices stored as {kinds or 'none'}")
    else:
        click.echo(f"int{rec['bits']}: {len(rec['quantized_layers'])} Linear layers")
    for emb, out in (rec.get("tied_embedding") or {}).items():
        click.echo(f"  tied: {emb} reads the int8 matrix of {out} (stored once, rows gathered then scaled)")
    for name, why in rec["float_layers"].items():
        click.echo(f"  float: {name}: {why}")
    step = rec.get("decode_step")
    if step:
        c = step["check"]
        click.echo(
            f"decode step: {art.path}/{step['file']} (ExportedProgram, static KV cache of {step['max_cache_len']} "
            f"tokens; {c['tokens']} replayed tokens, worst cosine {c['worst_cosine']:.6f} vs the model)"
        )


def _print_report(art, mode: str) -> None:
    """What the saved int8 artifact is: size vs fp32, calibration / training, accuracy, float layers."""
    m = art.metrics
    kind = {"aoti_package": "AOTInductor package", "exported_program": "ExportedProgram"}.get(
        art.format, "TorchScript"
    )
    click.echo(
        f"wrote {art.path} ({kind} int8, {mode}, backend {art.config['backend']}): "
        f"{art.size_bytes:,} bytes = {m['size_ratio_vs_fp32_torchscript']:.2f}x the fp32 TorchScript "
        f"({m['fp32_torchscript_bytes']:,} bytes)"
    )
    if m.get("larger_than_fp32"):
        floats = art.extra.get("float_layers") or {}
        click.echo(
            f"warning: this int8 file is LARGER than its fp32 source ({m['size_ratio_vs_fp32_torchscript']:.2f}x): "
            f"{len(floats)} layer(s) with weights stayed float (listed below) and int8 packing adds overhead",
            err=True,
        )
    cal = art.extra.get("calibration")
    if cal:
        click.echo(
            f"calibration: {cal['batches']} batches, {cal['samples']} samples of {cal['data']} "
            f"({cal['observer']} observer, {'per-channel' if cal['per_channel'] else 'per-tensor'} weights)"
        )
    tr = art.extra.get("training")
    if tr:
        last = tr["history"][-1] if tr["history"] else {}
        click.echo(
            f"QAT: {tr['epochs']} epoch(s) on {tr['samples']} samples of {tr['data']}, "
            f"final loss {last.get('loss', float('nan')):.4f}"
        )
    if "fp32_accuracy" in m:
        click.echo(
            f"accuracy on {m['eval_data']} ({m['eval_samples']} samples): fp32 {100 * m['fp32_accuracy']:.2f}% "
            f"-> int8 {100 * m['int8_accuracy']:.2f}% (drop {m['accuracy_drop_points']:.2f} points)"
        )
    elif "top1_agreement" in m:
        click.echo(f"top-1 agreement with fp32 on {m['eval_data']}: {100 * m['top1_agreement']:.2f}%")
    if m.get("vs_fp32"):
        from ptopt.compress.fidelity import describe

        click.echo(f"vs fp32: {describe(m['vs_fp32'])}")
    share = art.extra.get("int8_share")
    if share:
        click.echo(
            f"int8: {share['layers']} of {share['of_layers']} layers with weights, "
            f"{100 * share['parameters']:.1f}% of their parameters, "
            f"{100 * share['macs']:.1f}% of their multiply-accumulates"
        )
        if share["parameters"] < MOSTLY_FLOAT:  # said loudly: an "int8" file that is nearly all fp32
            click.echo(
                f"warning: only {100 * share['parameters']:.1f}% of the parameters are int8: the file is about "
                "fp32's size and no faster"
                + (
                    " (dynamic int8 quantizes Linear/LSTM/GRU; for convolutions use --mode static)"
                    if art.config.get("mode") == "dynamic"
                    else ""
                ),
                err=True,
            )
    for pair in (art.extra.get("dynamic") or {}).get("tied_int8_stored_once") or ():
        click.echo(f"tied:  {pair} share one int8 matrix, stored once (as in the fp32 model)")
    choice = art.extra.get("engine_choice")
    if choice:
        timed = f"; p50 ms {choice['p50_ms']}" if choice.get("p50_ms") else ""
        click.echo(f"engine: {choice['chosen']} ({choice['why']}{timed})")
    floats = art.extra.get("float_layers") or {}
    if floats:
        click.echo(f"stayed float ({len(floats)}):")
        for name, why in floats.items():
            click.echo(f"  {name}: {why}")
    else:
        click.echo("every layer with weights is int8")
