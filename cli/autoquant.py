"""What ``ptopt quantize``'s accuracy-aware search prints (used by ``ptopt.cli.quantize``).

Not a command of its own: ``ptopt quantize MODEL --mode dynamic --min-cosine 0.98 --eval-data D -o OUT``;
its options are ``SearchOptions``' fields (``ptopt.compress.quantize.config``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def print_search(res: Any, as_json: bool) -> None:
    """The search's tables (fp32 figures, layer sensitivity, candidates) and what was written."""
    import json

    from ptopt.cli.options import echo_table

    if as_json:
        click.echo(
            json.dumps(
                res.artifact.to_dict() if res.artifact is not None else res.to_dict(), indent=2, default=str
            )
        )
        return
    fp = res.fp32
    acc = f"fp32 accuracy {100 * fp['accuracy']:.2f}% on " if fp.get("accuracy") is not None else "on "
    of = f" of {fp['eval_data']}" if fp.get("eval_data") else ""
    click.echo(
        f"{acc}{fp['eval_samples']} eval samples{of}; sensitivity on {fp['sensitivity_samples']}; "
        f"fp32 {fp['latency_ms']:.2f} ms at batch {fp['latency_batch_size']}"
    )
    if fp.get("labels_note"):
        click.echo(f"note: {fp['labels_note']}")
    echo_table(res.sensitivity_table(), keys=2)
    if res.candidates:
        echo_table(res.candidates_table(), keys=2)
    if res.artifact is not None:
        _print_written(res)


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
