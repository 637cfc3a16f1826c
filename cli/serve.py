"""``ptopt serve MAR [--port P] [--workers N|auto] [--batch-size B] [--max-batch-delay MS]
[--queue-size Q] [--max-request-size MB]``."""

from __future__ import annotations

import click


@click.command("serve")
@click.argument("mar")
@click.option("--port", type=int, default=None, help="Inference port on 127.0.0.1 (default: a free one).")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=180.0,
    show_default=True,
    help="Seconds to wait for the model to be ready.",
)
@click.option(
    "--workers",
    default=None,
    metavar="N|auto",
    help="Worker processes per model ('auto': one per core, at most 4). Default: the archive's.",
)
@click.option(
    "--batch-size", type=int, default=None, help="Requests batched per model call. Default: the archive's."
)
@click.option(
    "--max-batch-delay",
    "max_batch_delay_ms",
    type=int,
    default=None,
    help="Milliseconds to wait to fill a batch. Default: the archive's.",
)
@click.option(
    "--queue-size",
    type=int,
    default=1024,
    show_default=True,
    help="Requests held while every worker is busy; beyond them the server answers 503.",
)
@click.option(
    "--max-request-size",
    "max_request_mb",
    type=float,
    default=16.0,
    show_default=True,
    help="Largest request body in MB (10^6 bytes); bigger ones are answered 413 with the limit.",
)
def command(
    mar: str,
    port: int | None,
    timeout_s: float,
    workers: str | None,
    batch_size: int | None,
    max_batch_delay_ms: int | None,
    queue_size: int,
    max_request_mb: float,
) -> None:
    """Serve MAR (from `ptopt package --format mar`) with a local TorchServe on 127.0.0.1.

    Waits until the model answers a real prediction, prints the URL and a curl example, and runs
    until Ctrl-C (or SIGTERM), then stops TorchServe and every worker it started.
    """
    import signal
    import time

    from ptopt.core.errors import UsageError
    from ptopt.serve.server import ServerError, ServeSettings, TorchServeServer

    if workers is not None and workers != "auto":
        if not workers.isdigit():
            raise UsageError(f"--workers {workers}: give a number >= 1 or 'auto'")
        workers = int(workers)
    settings = ServeSettings(workers, batch_size, max_batch_delay_ms, queue_size, max_request_mb)

    def _terminate(signum, frame):  # noqa: ANN001 - signal handler signature
        raise KeyboardInterrupt

    # checks the archive, the port and the settings before anything starts
    server = TorchServeServer(mar, port, start_timeout_s=timeout_s, settings=settings)
    previous = signal.signal(signal.SIGTERM, _terminate)
    # Ctrl-C stops the server even where SIGINT arrived ignored (a background job of a script)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        click.echo(f"starting TorchServe for {server.mar.name} (model {server.model_name!r}) ...", err=True)
        server.start()
        click.echo(f"serving {server.model_name} at {server.predict_url}")
        click.echo(f"management API: {server.management_url}  (logs: {server.log_dir}, removed on stop)")
        desc = server.describe_model()
        click.echo(
            f"workers: {len(desc.get('workers', []))}, batch size {desc.get('batchSize')} "
            f"(max delay {desc.get('maxBatchDelay')} ms), queue {settings.queue_size}, "
            f"max request {settings.max_request_mb:g} MB"
        )
        click.echo(f"try: {server.curl_example()}")
        click.echo("Ctrl-C to stop.", err=True)
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(0.5)
        raise ServerError(f"TorchServe stopped unexpectedly:\n{server.log_tail()}")
    except KeyboardInterrupt:
        click.echo("stopping TorchServe ...", err=True)
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    click.echo("stopped.", err=True)
