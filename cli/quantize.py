"""``ptopt quantize MODEL --mode dynamic|static|qat|weight-only -o OUT`` (options: the mode configs' fields)."""

from __future__ import annotations

import json
import re
from typing import Any

import click

from ptopt.cli import autoquant
from ptopt.cli.options import (
    data_option,
    declared,
    drop_text,
    given,
    guard_paths,
    input_shape_option,
    json_option,
    maybe_save_recipe,
    model_options,
    output_option,
    progress_option,
    save_recipe_option,
)
from ptopt.compress.quantize.config import FEW_CALIBRATION_SAMPLES, OPTIONS
from ptopt.core.errors import UsageError

#: below this share of int8 parameters the CLI warns (static mode refuses, see compress.quantize.flow)
MOSTLY_FLOAT = 0.1


@click.command("quantize")
@click.argument("model")
@declared(OPTIONS)
@output_option(required=False, folder_ok=True)
@data_option(
    "--calib-data", "DATA to calibrate on (static int8; awq/gptq: text, e.g. builtin:pydoc-text:calib)."
)
@data_option(
    "--train-data", "DATA to fine-tune on in QAT (labelled; without labels it matches fp32 outputs)."
)
@data_option(
    "--eval-data",
    "DATA to compare fp32 and int8 on after quantizing (stored in the sidecar); what accuracy-aware search "
    "measures on.",
)
@progress_option
@json_option
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
    output: str | None,
    no_progress: bool,
    as_json: bool,
    save_recipe: str | None,
    **params: Any,
) -> None:
    """Quantize MODEL: int8 TorchScript (dynamic, static, qat; --engine pt2e: an AOTInductor .pt2),
    or a language model's weights to int8/int4 (weight-only: a Hugging Face folder).

    \b
    Examples:
      ptopt quantize zoo:resnet --mode static --calib-data builtin:digits32:train -o resnet.int8.pt
      ptopt quantize zoo:lstm --mode dynamic -o lstm.int8.pt
      ptopt quantize zoo:resnet --mode qat --train-data builtin:digits32:train --epochs 1 -o resnet.qat.pt
      ptopt quantize zoo:resnet --mode static --calib-data builtin:digits32:train \\
          --eval-data builtin:digits32:test --accuracy-budget 0.1 -o resnet.int8.pt
      ptopt quantize hf:smollm2 --mode weight-only --bits 4 --method gptq \\
          --calib-data builtin:pydoc-text:calib --eval-data builtin:pydoc-text:eval -o smollm2.int4
    """
    from ptopt.compress.quantize import quantize
    from ptopt.core.errors import GateFailedError

    options = {"model": model, "output": output, **given(params)}
    searching = any(options.get(k) is not None for k in ("accuracy_budget", "min_cosine", "analyze"))
    if output is None and not options.get("analyze"):
        raise UsageError(
            "missing -o/--output for the quantized model"
            + (" (or use --analyze to write nothing)" if searching else "")
        )
    if options.get("analyze"):
        options["output"] = None
    try:
        res = quantize(**options, progress=not no_progress)
    except GateFailedError as e:  # the search found no candidate meeting the goal: its tables, then exit 1
        if getattr(e, "result", None) is not None:
            autoquant.print_search(e.result, as_json)
        raise
    if res is None:  # QAT under torchrun, a rank other than 0: rank 0 reports
        return
    if options.get("analyze") and output is not None:
        click.echo(f"--analyze writes nothing: {output} is not written", err=True)
    elif not options.get("analyze"):
        maybe_save_recipe(save_recipe, "quantize", options)
    found = getattr(res, "search", None) if searching else None
    if searching:
        autoquant.print_search(found if found is not None else res, as_json)
    elif as_json:
        click.echo(json.dumps(res.to_dict(), indent=2, default=str))
    elif "weight_only" in (res.extra or {}):  # a weight-only folder, whichever engine wrote it
        _print_weight_only(res)
    else:
        _print_report(res, options["mode"])
    _warn_few_samples(res)


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
        from ptopt.core.lm import scored_tokens

        w = m["perplexity_window"]
        click.echo(
            f"perplexity on {m['eval_data']} ({scored_tokens(w)}, context {w['context']}, stride {w['stride']}): "
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
    _print_float_tensors(rec)
    step = rec.get("decode_step")
    if step:
        c = step["check"]
        click.echo(
            f"decode step: {art.path}/{step['file']} (ExportedProgram, static KV cache of {step['max_cache_len']} "
            f"tokens; {c['tokens']} replayed tokens, worst cosine {c['worst_cosine']:.6f} vs the model)"
        )


def _print_float_tensors(rec: dict[str, Any]) -> None:
    """The weight matrices left float outside Linear layers (fused MoE experts, an untied embedding),
    one line per name pattern (layer numbers as ``*``), and their share of the model's parameters."""
    tensors = rec.get("float_tensors") or {}
    groups: dict[tuple[str, str], list[int]] = {}
    for name, t in tensors.items():
        groups.setdefault((re.sub(r"\.\d+\.", ".*.", name), t["why"]), []).append(t["params"])
    for (pattern, why), sizes in groups.items():
        n = f"{len(sizes)} tensors, " if len(sizes) > 1 else ""
        click.echo(f"  float: {pattern} ({n}{sum(sizes):,} parameters): {why}")
    total, left = rec.get("parameters"), sum(t["params"] for t in tensors.values())
    if left and total:
        click.echo(
            f"  float outside Linear layers: {left:,} of {total:,} parameters ({100 * left / total:.1f}%)"
        )


def _slower_warnings(extra: dict) -> None:
    """One line per reference a PT2E package runs slower than here: its fp32 source, the FX int8 model
    (whose artifact is the way out only where it holds the int8 rule: not when ``--engine auto`` went on to
    PT2E because FX int8 missed it)."""
    pt2e = extra.get("pt2e") or {}
    fx_missed = any(
        e["engine"] == "fx" and not e["holds"] for e in (extra.get("auto_int8") or {}).get("engines", [])
    )
    for key, what, todo in (
        ("speed_vs_fp32", "its fp32 source", "the fp32 model is faster here (ptopt validate compares them)"),
        (
            "speed_vs_fx_int8",
            "torch.ao FX int8 of the same model",
            "FX int8 missed the int8 rule on this model (--engine auto went on to PT2E)"
            if fx_missed
            else "--engine fx writes the faster artifact here",
        ),
    ):
        slower = {b: r for b, r in (pt2e.get(key) or {}).items() if r < 1.0}
        if slower:
            at = ", ".join(f"{r:.2f}x at batch {b}" for b, r in slower.items())
            click.echo(f"warning: this PT2E int8 package runs SLOWER than {what} here ({at}; a short timing): {todo}",
                       err=True)  # fmt: skip


def _larger_warning(m: dict[str, Any], floats: dict[str, Any]) -> str:
    """Why an int8 file is larger than its fp32 source: an AOTInductor package's compiled code, or float
    layers and int8 packing."""
    head = f"warning: this int8 file is LARGER than its fp32 source ({m['size_ratio_vs_fp32_torchscript']:.2f}x): "
    if m.get("compiled_code_bytes"):
        return head + (
            f"it is an AOTInductor package, {m['compiled_code_bytes']:,} bytes of it compiled code (a fixed cost "
            f"of the format: the fp32 package of the model carries it too); its int8 weights take "
            f"{m['weight_bytes']:,} bytes, {m['weight_bytes'] / m['fp32_torchscript_bytes']:.2f}x the fp32 "
            "model as frozen TorchScript"
        )
    return (
        head
        + f"{len(floats)} layer(s) with weights stayed float (listed below) and int8 packing adds overhead"
    )


def _given_file(art, fp32_bytes: int) -> str:
    """The source file's own size, where it is a file of other bytes than the frozen TorchScript the int8
    file is compared with (a pruned .pt: TorchScript, not frozen, 8,754,959 bytes against 7,981,414)."""
    from pathlib import Path

    source = Path((art.parent or {}).get("path") or "")
    if not source.is_file() or source.stat().st_size == fp32_bytes:
        return ""
    return f"; {source.name} itself: {source.stat().st_size:,} bytes"


def _warn_few_samples(res) -> None:
    """On stderr, whatever stdout shows (report, --json, a search's tables): static int8 calibrated on
    fewer than ``FEW_CALIBRATION_SAMPLES`` samples."""
    cal = (getattr(res, "extra", None) or {}).get("calibration") or {}
    samples = cal.get("samples")
    if isinstance(samples, int) and samples < FEW_CALIBRATION_SAMPLES:
        click.echo(
            f"warning: int8 activation ranges fitted on {samples} calibration samples: an input whose "
            "activations go beyond what they showed is clipped, and a check on a few dozen samples may not "
            f"show it; calibrate on {FEW_CALIBRATION_SAMPLES} or more (--calib-data; --calibration-batches "
            "x --batch-size)",
            err=True,
        )


def _qat_line(tr: dict, batch_size: int | None) -> str:
    """How long QAT trained and on what. --max-steps may end it inside an epoch: "1 epoch(s) on 1438
    samples" read as a pass over all of them."""
    last = tr["history"][-1] if tr["history"] else {}
    steps, epochs, data = last.get("steps"), len(tr["history"]), f"{tr['samples']} samples of {tr['data']}"
    loss = f"final loss {last.get('loss', float('nan')):.4f}"
    optimizer_steps = f"{steps} optimizer step{'' if steps == 1 else 's'}"
    if batch_size and steps is not None and steps < epochs * -(-tr["samples"] // batch_size):
        return f"QAT: {optimizer_steps} of {batch_size} samples (--max-steps, within epoch {epochs}) on {data}, {loss}"
    of = f", {optimizer_steps}" if steps is not None else ""
    return f"QAT: {epochs} epoch(s){of} on {data}, {loss}"


def _print_report(art, mode: str) -> None:
    """What the saved int8 artifact is: size vs fp32, calibration / training, accuracy, float layers."""
    m = art.metrics
    kind = {
        "aoti_package": "AOTInductor package",
        "exported_program": "ExportedProgram",
        "openvino": "OpenVINO IR",
    }.get(art.format, "TorchScript")
    click.echo(
        f"wrote {art.path} ({kind} int8, {mode}, backend {art.config['backend']}): "
        f"{art.size_bytes:,} bytes = {m['size_ratio_vs_fp32_torchscript']:.2f}x the fp32 model as frozen "
        f"TorchScript ({m['fp32_torchscript_bytes']:,} bytes{_given_file(art, m['fp32_torchscript_bytes'])})"
    )
    if m.get("larger_than_fp32"):
        click.echo(_larger_warning(m, art.extra.get("float_layers") or {}), err=True)
    _slower_warnings(art.extra)
    cal = art.extra.get("calibration")
    if cal:
        click.echo(
            f"calibration: {cal['batches']} batches, {cal['samples']} samples of {cal['data']} "
            f"({cal['observer']} observer, {'per-channel' if cal['per_channel'] else 'per-tensor'} weights)"
        )
    tr = art.extra.get("training")
    if tr:
        click.echo(_qat_line(tr, art.config["batch_size"]))
    if "fp32_accuracy" in m:
        click.echo(
            f"accuracy on {m['eval_data']} ({m['eval_samples']} samples): fp32 {100 * m['fp32_accuracy']:.2f}% "
            f"-> int8 {100 * m['int8_accuracy']:.2f}% ({drop_text(m['accuracy_drop_points'])})"
        )
    elif "top1_agreement" in m:
        click.echo(f"top-1 agreement with fp32 on {m['eval_data']}: {100 * m['top1_agreement']:.2f}%")
    elif "top1_not_measured" in m:
        click.echo(f"top-1 agreement not measured: {m['top1_not_measured']} (the cosine below is the figure)")
    if m.get("labels_note"):
        click.echo(f"note: {m['labels_note']}")
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
        for line in float_lines(floats):
            click.echo(line)
    else:
        click.echo("every layer with weights is int8")


#: the per-layer part of --engine auto's reason (its rank), dropped where layers share the rest
_RANK = re.compile(r" \([^()]*: #\d+ of \d+ by int8 sensitivity\)")


def float_lines(floats: dict[str, str], width: int = 100) -> list[str]:
    """The layers that stayed float, a line each; layers that share a reason (``--engine auto``'s 51, each
    with its rank) share one line of it, their names wrapped below, in the order given (the most
    int8-sensitive first). Each layer's own reason stays in the sidecar (``extra.float_layers``)."""
    import textwrap

    groups: dict[str, list[str]] = {}
    for name, why in floats.items():
        groups.setdefault(_RANK.sub("", why), []).append(name)
    lines = []
    for why, names in groups.items():
        if len(names) < 3:
            lines += [f"  {n}: {floats[n]}" for n in names]
            continue
        order = ", the most int8-sensitive first" if _RANK.search(floats[names[0]]) else ""
        lines.append(f"  {len(names)} layers{order}: {why}")
        lines += textwrap.wrap(", ".join(names), width, initial_indent="    ", subsequent_indent="    ",
                               break_on_hyphens=False, break_long_words=False)  # fmt: skip
    return lines
