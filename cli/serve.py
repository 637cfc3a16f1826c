"""``ptopt serve ARTIFACT... [--engine torchserve|ray] [--port P]``: TorchServe for .mar archives
(``--workers``, ``--batch-size``, ``--max-batch-delay``, ``--queue-size``), Ray Serve for artifacts
(``--replicas``/``--autoscale``, ``--max-batch-size``, ``--batch-wait-ms``, ``--cpus-per-replica``,
``--address``); ``--max-request-size`` for both."""

from __future__ import annotations

import contextlib
from typing import Any

import click

from ptopt.cli.options import declared, given
from ptopt.serve.engines import OPTIONS


@click.command("serve")
@click.argument("artifacts", nargs=-1, required=True, metavar="[NAME=]ARTIFACT...")
@declared(OPTIONS)
def command(artifacts: tuple[str, ...], engine: str | None, **params: Any) -> None:
    """Serve ARTIFACT(s) on 127.0.0.1 until Ctrl-C (or SIGTERM).

    \b
    TorchServe: ARTIFACT is a .mar (ptopt package --format mar).
    Ray Serve: any artifact (.pt, .pt2, .onnx, .xml, a language-model folder) or a folder of
    `ptopt package --format ray`, on a local Ray instance or a cluster (--address); the Open
    Inference Protocol (KServe v2, what tritonclient speaks) at /v2 and the .mar's JSON route at
    /predictions/NAME.

    NAME=ARTIFACT serves it as model NAME (letters, digits, _ and -); by default a file's name up to
    its first dot, or without its suffix where two of those meet (bert.int8.pt beside bert.onnx:
    bert_int8 and bert); a .mar, the name it was packaged with.

    Waits until every model answers a real request, prints the URLs and an example, and on Ctrl-C
    stops the server and every process it started.
    """
    from ptopt.serve.engines import settings

    engine, chosen = settings(artifacts, engine, given(params))
    if engine == "torchserve":
        with _interruptible():
            _torchserve(artifacts, chosen)
    else:
        with _interruptible():
            _ray(artifacts, *chosen)


def _terminate(signum, frame):  # noqa: ANN001 - signal handler signature
    raise KeyboardInterrupt


def _handlers() -> None:
    """SIGTERM stops like Ctrl-C (a KeyboardInterrupt: every cleanup runs); Ctrl-C stops the server even
    where SIGINT arrived ignored (a background job of a script)."""
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def _interruptible() -> Any:
    """SIGTERM and Ctrl-C as KeyboardInterrupt inside, the previous handlers after: from the command's
    start, so that a SIGTERM while the artifacts are packaged for the server (SmolLM2-135M's AOTInductor
    folder: over two minutes) removes the copy it was making (it killed the process and left 630 MB)."""
    import signal

    previous, previous_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    _handlers()
    try:
        yield
    finally:
        for sig, handler in ((signal.SIGTERM, previous), (signal.SIGINT, previous_int)):
            if handler is not None:  # None: a handler not installed from Python
                signal.signal(sig, handler)


def _until_stopped(server: Any, name: str, stopped: Any, banner: Any) -> None:
    """Start ``server``, print ``banner()``, wait until Ctrl-C / SIGTERM or ``stopped()``; always stop."""
    import time

    from ptopt.core import progress

    # the handlers again on the way out (ray.init replaces SIGTERM's, set again below): the caller's back
    with _interruptible(), contextlib.ExitStack() as quiet:
        try:
            server.start()
            _handlers()  # again: a Ray whose failure handler could not be switched off installed its own
            banner()
            click.echo("Ctrl-C to stop.", err=True)
            # serving is waiting, not long work, and stopping is the end of it: no "still working" lines
            # from here to the end (a failed start's cleanup keeps them)
            quiet.enter_context(progress.paused())
            while True:
                time.sleep(0.5)
                stopped()
        except KeyboardInterrupt:
            click.echo(f"stopping {name} ...", err=True)
        finally:
            server.stop()
        click.echo("stopped.", err=True)


def _torchserve(artifacts: tuple[str, ...], settings: Any) -> None:
    from ptopt.serve.server import ServerError, TorchServeServer

    # checks the archives, the port and the settings before anything starts
    server = TorchServeServer(
        list(artifacts), settings.port, start_timeout_s=settings.start_timeout_s, settings=settings
    )
    click.echo(f"starting TorchServe for {server.mar.name} (model {server.model_name!r}) ...", err=True)

    def banner() -> None:
        click.echo(f"serving {server.model_name} at {server.predict_url}")
        click.echo(f"management API: {server.management_url}  (logs: {server.log_dir}, removed on stop)")
        desc = server.describe_model()
        click.echo(
            f"workers: {len(desc.get('workers', []))}, batch size {desc.get('batchSize')} "
            f"(max delay {desc.get('maxBatchDelay')} ms), queue {settings.queue_size}, "
            f"max request {settings.max_request_mb:g} MB"
        )
        click.echo(f"try: {server.curl_example()}")

    def stopped() -> None:
        if server.proc is None or server.proc.poll() is not None:
            raise ServerError(f"TorchServe stopped unexpectedly:\n{server.log_tail()}")

    _until_stopped(server, "TorchServe", stopped, banner)


def _ray(artifacts: tuple[str, ...], config: dict[str, Any], run: Any) -> None:
    from ptopt.serve.ray_server import RayServeError, RayServer, http

    server = RayServer(
        list(artifacts),
        config=config or None,  # None: the defaults, or a package folder's own settings
        port=run.port,
        address=run.address,
        allow_pickle=run.allow_pickle,
        input_shapes=list(run.input_shapes),
        route_prefix=run.route_prefix,
        start_timeout_s=run.start_timeout_s,
    )  # packages the artifacts: bad input is refused before Ray starts
    where = f"the Ray cluster at {run.address}" if run.address else "a local Ray instance"
    click.echo(f"starting Ray Serve for {', '.join(server.models)} on {where} ...", err=True)
    failures = [0]

    def banner() -> None:
        _ray_banner(server)

    def stopped() -> None:
        code, _ = http("GET", f"{server.url}/v2/health/live", timeout=10)
        failures[0] = 0 if code == 200 else failures[0] + 1
        if failures[0] >= 20:
            raise RayServeError(
                f"Ray Serve stopped answering at {server.url} (ten seconds without an answer)"
            )

    _until_stopped(server, "Ray Serve", stopped, banner)


def _ray_banner(server: Any) -> None:
    from ptopt.serve.server import sample_request_python

    c = server.config
    scaling = f"autoscaling {c.autoscale}" if c.autoscale else f"{c.replicas} replica(s)"
    tensors = any(m.get("kind") != "text" for m in server.manifest["models"])
    batching = (  # a language model generates one prompt at a time: it is never batched
        f"batches up to {c.max_batch_size} rows, {c.batch_wait_ms:g} ms wait"
        if c.max_batch_size > 1 and tensors
        else "no batching"
    )
    for m in server.manifest["models"]:
        text = ", text_input (BYTES) or tensors" if m.get("tokenizer") else ""
        click.echo(f"serving {m['name']} ({m['format']}{text}) at {server.infer_url(m['name'])}")
    click.echo(
        f"Open Inference Protocol (KServe v2) at {server.url}/v2 (tritonclient: "
        f"InferenceServerClient({server.url.split('://', 1)[1]!r})); plain JSON at {server.url}/predictions/NAME"
    )
    click.echo(
        f"{scaling} x {c.cpus_per_replica:g} CPU, {c.replica_threads} thread(s) each; {batching}; "
        f"max request {c.max_request_mb:g} MB"
    )
    if server.address is None:
        click.echo(
            f"ray: local instance at {server.gcs_address} (logs: {server.ray_temp_dir}, removed on stop)"
        )
    else:
        click.echo(f"ray: the cluster at {server.gcs_address} (stop removes this application only)")
    first = server.manifest["models"][0]
    if first.get("tokenizer"):  # an encoder or classifier that takes text (serve.text_inputs)
        body = '{"inputs": ["A first sentence.", "A second one."]}'
        click.echo(f"try: curl -s -X POST {server.url}/predictions/{first['name']} -d '{body}'")
    elif first["kind"] == "tensor":
        expr = sample_request_python({"inputs": first["inputs"], "input_style": first["input_style"]})
        head = f"curl -s -X POST {server.url}/predictions/{first['name']} -H 'Content-Type: application/json'"
        click.echo(f'try: {head} -d "$(python3 -c "import json; print(json.dumps({expr}))")"')
    else:
        body = '{"text_input": "Hello", "parameters": {"max_tokens": 16}}'
        click.echo(f"try: curl -s -X POST {server.url}/v2/models/{first['name']}/generate -d '{body}'")
