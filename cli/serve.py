"""``ptopt serve MAR [--port P]``."""

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
def command(mar: str, port: int | None, timeout_s: float) -> None:
    """Serve MAR (from `ptopt package --format mar`) with a local TorchServe on 127.0.0.1.

    Waits until the model answers a real prediction, prints the URL and a curl example, and runs
    until Ctrl-C (or SIGTERM), then stops TorchServe and every worker it started.
    """
    import signal
    import time

    from ptopt.serve.server import ServerError, TorchServeServer

    def _terminate(signum, frame):  # noqa: ANN001 - signal handler signature
        raise KeyboardInterrupt

    server = TorchServeServer(mar, port, start_timeout_s=timeout_s)  # checks the archive and the port
    previous = signal.signal(signal.SIGTERM, _terminate)
    # Ctrl-C stops the server even where SIGINT arrived ignored (a background job of a script)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        click.echo(f"starting TorchServe for {server.mar.name} (model {server.model_name!r}) ...", err=True)
        server.start()
        click.echo(f"serving {server.model_name} at {server.predict_url}")
        click.echo(f"management API: {server.management_url}  (logs: {server.log_dir}, removed on stop)")
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
