"""``ptopt demo [--output DIR]``."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import declared, given, output_option
from ptopt.demo import OPTIONS


@click.command("demo")
@output_option(folder=True, default="ptopt-demo", help="Folder for every artifact and report.")
@declared(OPTIONS)
def command(output: str, **params: Any) -> None:
    """Run the whole pipeline on the zoo ResNet-style CNN and bundled digits: quantize (static, QAT,
    dynamic LSTM), prune (structured + distillation, global), export (TorchScript, ONNX, TensorRT
    when available), validate with gates, report, and package the best artifact as a .mar."""
    from ptopt.core.errors import GateFailedError
    from ptopt.demo import demo
    from ptopt.validate.reports import terminal

    result = demo(output, log=lambda m: click.echo(m, err=True), **given(params))
    terminal.print_report(result.validation.data)
    terminal.print_report(result.lstm_validation.data)
    click.echo(f"\nFiles in {result.output}/:")
    for name, path in result.artifacts.items():
        click.echo(f"  {path.name:<22} {name}")
    for extra in ("report.html", "summary.md", "report.json", "junit.xml", "lstm-summary.md"):
        click.echo(f"  {extra:<22} {'HTML report with plots' if extra.endswith('html') else 'report'}")
    if result.mar:
        click.echo(
            f"  {result.mar.name:<22} TorchServe package of the fastest artifact within budget ({result.best}); "
            f"serve it with: ptopt serve {result.mar}"
        )
    click.echo(
        f"\ndemo finished in {result.seconds:.0f} s"
        + (f" (reused {len(result.reused)} cached artifacts)" if result.reused else "")
    )
    if not result.passed:
        raise GateFailedError("a gate failed in the demo (see the tables above)")
