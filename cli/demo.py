"""``ptopt demo [--output DIR]``."""

from __future__ import annotations

import click


@click.command("demo")
@click.option(
    "-o",
    "--output",
    default="ptopt-demo",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Folder for every artifact and report.",
)
@click.option(
    "--fresh", is_flag=True, help="Rebuild every artifact instead of reusing those already in --output."
)
@click.option("--threads", type=int, help="Intra-op threads for every runtime (default: all usable cores).")
@click.option(
    "--min-seconds",
    type=float,
    help="The validations' timed seconds per artifact and batch size, at least (validate's option; the demo's default 0.5).",
)
@click.option(
    "--min-iters",
    type=int,
    help="The validations' timed iterations per artifact and batch size, at least (validate's option; default 20).",
)
@click.option(
    "--rounds",
    type=int,
    help="The validations' interleaved timing rounds (validate's option; default 15).",
)
def command(
    output: str,
    fresh: bool,
    threads: int | None,
    min_seconds: float | None,
    min_iters: int | None,
    rounds: int | None,
) -> None:
    """Run the whole pipeline on the zoo ResNet-style CNN and bundled digits: quantize (static, QAT,
    dynamic LSTM), prune (structured + distillation, global), export (TorchScript, ONNX, TensorRT
    when available), validate with gates, report, and package the best artifact as a .mar."""
    from ptopt.core.errors import GateFailedError
    from ptopt.demo import demo
    from ptopt.validate.reports import terminal

    given = (("min_seconds", min_seconds), ("min_iters", min_iters), ("rounds", rounds))
    timing = {k: v for k, v in given if v is not None}
    result = demo(output, fresh=fresh, threads=threads, log=lambda m: click.echo(m, err=True), **timing)
    terminal.print_report(result.validation.data)
    terminal.print_report(result.lstm_validation.data)
    click.echo(f"\nFiles in {result.output}/:")
    for name, path in result.artifacts.items():
        click.echo(f"  {path.name:<22} {name}")
    for extra in ("report.html", "summary.md", "report.json", "junit.xml", "lstm-summary.md"):
        click.echo(f"  {extra:<22} {'HTML report with plots' if extra.endswith('html') else 'report'}")
    if result.mar:
        click.echo(
            f"  {result.mar.name:<22} TorchServe package of the best artifact ({result.best}); "
            f"serve it with: ptopt serve {result.mar}"
        )
    click.echo(
        f"\ndemo finished in {result.seconds:.0f} s"
        + (f" (reused {len(result.reused)} cached artifacts)" if result.reused else "")
    )
    if not result.passed:
        raise GateFailedError("a gate failed in the demo (see the tables above)")
