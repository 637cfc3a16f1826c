"""``ptopt serve MAR [--port P] [--workers N|auto] [--batch-size B] [--max-batch-delay MS]
[--queue-size Q] [--max-request-size MB]``."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import declared, given
from ptopt.serve.server import OPTIONS


@click.command("serve")
@click.argument("mar")
@declared(OPTIONS)
def command(mar: str, **params: Any) -> None:
    """Serve MAR (from `ptopt package --format mar`) with a local TorchServe on 127.0.0.1.

    Waits until the model answers a real prediction, prints the URL and a curl example, and runs
    until Ctrl-C (or SIGTERM), then stops TorchServe and every worker it started.
    """
    import signal
    import time

    from ptopt.serve.server import ServerError, ServeSettings, TorchServeServer

    settings = OPTIONS.build(ServeSettings, OPTIONS.check(given(params)))

    def _terminate(signum, frame):  # noqa: ANN001 - signal handler signature
        raise KeyboardInterrupt

    # checks the archive, the port and the settings before anything starts
    server = TorchServeServer(mar, settings.port, start_timeout_s=settings.start_timeout_s, settings=settings)
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
