"""The accuracy-aware options of ``ptopt quantize`` and their output (used by ``ptopt.cli.quantize``).

Not a command of its own: ``ptopt quantize MODEL --mode dynamic --min-cosine 0.98 --eval-data D -o OUT``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def autoquant_options(f: F) -> F:
    """``--max-accuracy-drop``, ``--min-cosine``, ``--analyze``, ``--tuning-budget``, ``--threads``."""
    f = click.option(
        "--threads", type=int, help="Accuracy-aware: torch threads while timing candidates [current setting]."
    )(f)
    f = click.option(
        "--tuning-budget",
        metavar="N|TIME",
        help="Accuracy-aware: how long to search: N candidates (e.g. 30) or a time (90s, 5m) [24].",
    )(f)
    f = click.option(
        "--analyze", is_flag=True, help="Print the ranked layer sensitivity on --eval-data and write nothing."
    )(f)
    f = click.option(
        "--min-cosine",
        type=float,
        metavar="C",
        help="Accuracy-aware: keep the per-sample cosine of int8 to fp32 outputs >= C on --eval-data "
        "(no labels needed); the fastest candidate that holds is written.",
    )(f)
    f = click.option(
        "--max-accuracy-drop",
        type=float,
        metavar="PTS",
        help="Accuracy-aware: keep the top-1 accuracy drop on labelled --eval-data <= PTS points; "
        "the fastest candidate that holds is written (exit 1 with the best one if none does).",
    )(f)
    return f


def wanted(max_accuracy_drop: float | None, min_cosine: float | None, analyze: bool) -> bool:
    return max_accuracy_drop is not None or min_cosine is not None or analyze


def run(
    options: dict[str, Any],
    *,
    max_accuracy_drop: float | None,
    min_cosine: float | None,
    analyze: bool,
    tuning_budget: str | None,
    threads: int | None,
    as_json: bool,
    progress: bool,
) -> Any:
    """Run the search with the options of ``ptopt quantize`` and print its tables; returns the result
    (the caller ends with ``result.raise_if_missed()``: exit 1 when no candidate met the goal)."""
    import json

    from ptopt.cli.options import echo_table
    from ptopt.compress.quantize.autoquant import autoquantize

    opts = {k: v for k, v in options.items() if k not in ("epochs", "lr", "train_data")}
    for k in ("epochs", "lr", "train_data"):
        if options.get(k) is not None:
            from ptopt.core.errors import UsageError

            raise UsageError(
                f"--{k.replace('_', '-')} does not apply to accuracy-aware quantization "
                "(static or dynamic search)"
            )
    if not analyze and opts.get("output") is None:
        from ptopt.core.errors import UsageError

        raise UsageError("missing -o/--output for the quantized model (or use --analyze to write nothing)")
    if analyze and opts.get("output") is not None:
        click.echo(f"--analyze writes nothing: {opts['output']} is not written", err=True)
    res = autoquantize(
        **opts,
        max_accuracy_drop=max_accuracy_drop,
        min_cosine=min_cosine,
        tuning_budget=tuning_budget,
        analyze=analyze,
        threads=threads,
        progress=progress,
    )
    if as_json:
        click.echo(
            json.dumps(
                res.artifact.to_dict() if res.artifact is not None else res.to_dict(), indent=2, default=str
            )
        )
    else:
        fp = res.fp32
        acc = f"fp32 accuracy {100 * fp['accuracy']:.2f}% on " if fp.get("accuracy") is not None else "on "
        click.echo(
            f"{acc}{fp['eval_samples']} eval samples; sensitivity on {fp['sensitivity_samples']}; "
            f"fp32 {fp['latency_ms']:.2f} ms at batch {fp['latency_batch_size']}"
        )
        echo_table(res.sensitivity_table())
        if res.candidates:
            echo_table(res.candidates_table())
        if res.artifact is not None:
            _print_written(res)
    return res


def _print_written(res) -> None:
    """What was written, the held-out figures beside the search's, and why it was chosen."""
    art = res.artifact
    best = res.best
    kind = {"aoti_package": "AOTInductor package", "exported_program": "ExportedProgram"}
    choice = art.extra.get("engine_choice")
    if choice:
        click.echo(
            f"engine: {choice['chosen']} ({choice['why']}; search p50 ms {choice['search_latency_ms']})"
        )
    click.echo(
        f"wrote {art.path} ({kind.get(art.format, 'TorchScript')} int8, {res.mode}, {best.scheme}, "
        f"{len(best.float_layers)} of {len(res.sensitivity)} tuned layers float): "
        f"{art.size_bytes:,} bytes; search {len(res.candidates)} candidates in {res.seconds:.1f}s"
    )
    split = art.extra.get("autoquant", {}).get("split") or {}
    if res.unseen is not None:
        click.echo(
            f"held out: min cosine {res.unseen.min_cosine:.4f} on {split['heldout_samples']} samples the "
            f"search never saw (search: {best.measurement.min_cosine:.4f} on its "
            f"{split['search_samples']}; seeded split of the eval data)"
        )
    elif split.get("note"):
        click.echo(f"held out: none ({split['note']})")
    if res.met:
        click.echo(res.reason)  # otherwise it is the error message (stderr, exit 1)
