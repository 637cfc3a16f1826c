"""Serve artifacts with Ray Serve on 127.0.0.1 (a local Ray instance started here) or on a running Ray
cluster (``address``), speaking the Open Inference Protocol; stop cleanly.

The artifacts are packaged first, exactly as ``ptopt package --format ray`` packages them (a
private folder), so bad input is refused before Ray starts, and the application deployed is the one
a cluster runs from the package folder (``serve.ray_app``).

A local instance lives in a private folder (Ray's sessions, logs and sockets; removed on stop) with
what it does not need turned off: no dashboard, no usage statistics, no metrics export, its own auth
token (Ray writes none into ``~/.ray``). ``stop`` drains first (every ingress replica answers new
requests the protocol's JSON 503 and finishes those in flight; ``ray_app.drain_key``), then kills the
HTTP proxy, shuts Ray down and kills whatever process of that Ray session is left (the node's
processes and every worker they started), so nothing outlives the server. Joining a cluster, ``stop``
drains, deletes only this application and disconnects: the cluster, and Serve on it, keep running.
"""

from __future__ import annotations

import contextlib
import http.client as http_client
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, PtoptError, UsageError
from ptopt.serve.ray_config import (
    DEFAULT_START_TIMEOUT_S,
    DRAIN_TIMEOUT_S,
    SERVE_FAST_PATH,
    RayServeConfig,
    logging_config,
)

LOOPBACK = "127.0.0.1"
#: seconds a local instance's processes get between SIGTERM and SIGKILL once Ray's own shutdown ran
KILL_GRACE_S = 10.0
#: the names (``/proc/PID/comm``) of a local instance's own core processes
_CORE_PROCESSES = ("gcs_server", "raylet")
_GCS_LOST = (
    "ptopt serve: the local Ray instance is going down with this process (the signal reached its whole "
    "process group): no drain, the requests in flight are cut; stopping the rest"
)
#: the same when a second Ctrl-C / SIGTERM cut Ray's shutdown short: the GCS and the raylet take SIGTERM as
#: the start of their own graceful shutdown (over 2 s here: the stop took 11.7 s, not 2.3 s); the user asked
#: for it to end now
HURRIED_GRACE_S = 2.0
#: how Ray names the process of Serve's HTTP proxy (its actor's class)
PROXY_PROCESS = "ray::ProxyActor"
#: Ray's settings for a local instance that serves and does nothing else
_QUIET_RAY = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage report to Anyscale
    "RAY_DEDUP_LOGS": "0",
    "RAY_SERVE_LOG_TO_STDERR": "0",
    **SERVE_FAST_PATH,  # inherited by the node's processes: the proxy, the controller, the replicas
}


def _local_token() -> None:
    """Token authentication for a local instance, with a token of this process (Ray's default would
    write one into ``~/.ray/auth_token``), unless the user set Ray's auth variables. Kept for the
    process's life: Ray reads it once."""
    if not any(k in os.environ for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))


def _import_ray() -> None:
    """Ray, Serve and the application module, imported once without the deprecation warnings of their
    dependencies (pydantic's ``Field`` extras in Serve's schema): they are Ray's to fix, not a user's."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import ray  # noqa: F401
        import ray.serve.schema  # noqa: F401

        import ptopt.serve.ray_app  # noqa: F401


class RayServeError(PtoptError):
    """Ray or Serve did not start, or the application never became ready."""


class RayServer:
    """Ray Serve serving ``artifacts`` (files, LM folders, or one ``ptopt package --format ray``
    folder). A context manager, or ``start()``/``stop()``.

    ``config``: a :class:`RayServeConfig` or a dict of its fields. ``port``: Serve's HTTP port on
    127.0.0.1 (a free one when None; joining a cluster where Serve runs already, its port).
    ``address``: a running cluster (``ray://`` or ``host:port``) instead of a local instance.
    """

    #: set by ``stop`` to end a drain it stopped waiting for (its thread's loop)
    _drain_cancel: threading.Event | None = None

    def __init__(
        self,
        artifacts: Any,
        *,
        config: RayServeConfig | dict[str, Any] | None = None,
        port: int | None = None,
        address: str | None = None,
        allow_pickle: bool = False,
        input_shapes: Any = (),
        route_prefix: str = "/",
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ):
        from ptopt.core.features import require
        from ptopt.serve.server import free_port, port_in_use

        require("ray", "serving with Ray Serve (--engine ray)")
        given = config
        self.config = (
            config if isinstance(config, RayServeConfig) else RayServeConfig.from_options(dict(config or {}))
        )
        if not route_prefix.startswith("/"):
            raise UsageError(f"--route-prefix {route_prefix!r}: must start with '/'")
        if port is not None:
            if not 1 <= int(port) <= 65535:
                raise UsageError(f"--port {port}: must be between 1 and 65535")
            if address is None and port_in_use(int(port)):
                raise UsageError(
                    f"port {port} on {LOOPBACK} is already in use; pick another with --port "
                    "or leave it out to use a free one"
                )
        self.address, self.route_prefix = address, route_prefix.rstrip("/") or "/"
        self.port = int(port) if port is not None else free_port()
        self.start_timeout_s = start_timeout_s
        self.workdir = Path(tempfile.mkdtemp(prefix="ptopt-ray-"))
        #: serving a folder of ``ptopt package --format ray`` (deployed through its Serve config)
        self.packaged = False
        #: the Ray cluster's GCS address (``host:port``), once started or joined
        self.gcs_address: str | None = None
        try:
            self.folder, self.manifest = self._package(artifacts, allow_pickle, input_shapes)
            self._settings(given)
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self._started_ray = False
        self._owns_app = False  # set once this server deploys its application (stop deletes only that)
        self._serving = False  # set once it answered its first requests (stop drains only then)
        self._session: list[int] = []
        self._saved_env: dict[str, str | None] = {}

    def _settings(self, given: Any) -> None:
        """A package folder's own settings (none may be given); the CPUs they need, checked here."""
        self.app_name = self.manifest["app_name"]
        if self.packaged:
            if given is not None:
                raise UsageError(
                    f"{self.folder}: a Ray Serve package carries its own settings (replicas, batching, CPUs, "
                    "limits); serve it as it is, or package it again with other ones"
                )
            self.config = RayServeConfig.from_options(self.manifest.get("config") or {})
        if self.address is None:
            self._check_cpus(float(len(os.sched_getaffinity(0))), "this machine")

    # -- what is served ------------------------------------------------------------------------
    def _package(self, artifacts: Any, allow_pickle: bool, input_shapes: Any) -> tuple[Path, dict[str, Any]]:
        """The package folder to deploy: the one given, or one made here from the artifacts."""
        from ptopt.serve.prepare import named_artifacts, serve_names
        from ptopt.serve.ray_package import prepare_model, read_manifest, write_package

        items = named_artifacts(artifacts)
        if not items:
            raise UsageError("nothing to serve: give at least one artifact")
        packaged = [
            (n, Path(a)) for n, a in items if Path(a).is_dir() and (Path(a) / "ptopt_ray.json").is_file()
        ]
        if packaged:
            if len(items) > 1 or packaged[0][0]:
                raise UsageError(
                    f"{packaged[0][1]}: a Ray Serve package is served alone, under the names it was packaged "
                    "with, not beside other artifacts or renamed"
                )
            self.packaged = True
            folder = packaged[0][1].resolve()
            return folder, _trusted_manifest(folder, read_manifest(folder), allow_pickle)
        from ptopt.core import progress

        # a heartbeat names it: SmolLM2-135M's AOTInductor folder took 139 s of "ptopt serve: still working"
        with progress.step(f"packaging {len(items)} artifact(s) for Ray Serve", announce=False):
            models = [
                prepare_model(a, self.workdir, name, input_shapes=input_shapes, allow_pickle=allow_pickle)
                for name, a in serve_names(artifacts)
            ]
            folder = self.workdir / "package"
            app = "ptopt" if len(models) > 1 else models[0].name
            write_package(models, folder, app, self.config, port=self.port)
        return folder, read_manifest(folder)

    # -- addresses -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        prefix = "" if self.route_prefix == "/" else self.route_prefix
        return f"http://{LOOPBACK}:{self.port}{prefix}"

    @property
    def models(self) -> list[str]:
        return [m["name"] for m in self.manifest["models"]]

    def infer_url(self, model: str | None = None) -> str:
        return f"{self.url}/v2/models/{model or self.models[0]}/infer"

    @property
    def ray_temp_dir(self) -> Path:
        return self.workdir / "r"

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> RayServer:
        try:
            self._start_ray()
            self._deploy()
            self.wait_ready()
            self._serving = True  # from here, stop drains the requests in flight first
        except BaseException:
            self.stop()
            raise
        return self

    def _start_ray(self) -> None:
        self._set_env()  # before Ray reads its configuration (at import)
        _import_ray()
        _keep_python_signal_handlers()
        import ray

        if ray.is_initialized():
            raise UsageError("Ray is already initialized in this process; RayServer starts or joins its own")
        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # Serve's INFO lines on the console
        quiet = dict(log_to_driver=False, configure_logging=False, namespace="ptopt")
        if self.address is not None:
            # artifacts packaged here reach the cluster's nodes as the job's working_dir (uploaded by this
            # driver; Serve's deployments inherit it); a package folder names its own in its config
            job_env = None if self.packaged else {"working_dir": str(self.folder)}
            try:
                ray.init(address=self.address, runtime_env=job_env, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise RayServeError(f"cannot join the Ray cluster at {self.address}: {e}") from None
            self.gcs_address = ray.get_runtime_context().gcs_address
            self._check_cpus(float(ray.cluster_resources().get("CPU", 0)), f"the cluster at {self.address}")
            return
        self.ray_temp_dir.mkdir()
        self._started_ray = True
        options = dict(
            num_cpus=max(1, len(os.sched_getaffinity(0))),
            include_dashboard=False,
            _node_ip_address=LOOPBACK,  # a private instance: its node is this machine's loopback
            _temp_dir=str(self.ray_temp_dir),
            _system_config={"enable_metrics_collection": False},
            **quiet,
        )
        for attempt in (1, 2):
            try:
                ray.init(**options)
                break
            except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception when its node is slow to start
                # Ray gives its raylet 30 s to register (fixed in Ray): on a machine that busy, once more
                ray.shutdown()
                end_processes(session_processes(str(self.ray_temp_dir)))
                if attempt == 2:
                    raise RayServeError(f"the local Ray instance did not start (twice): {e}") from None
        self._session = session_processes(str(self.ray_temp_dir))
        self.gcs_address = ray.get_runtime_context().gcs_address

    def _check_cpus(self, have: float, where: str) -> None:
        c = self.config
        need = c.max_replicas() * c.cpus_per_replica * len(self.manifest["models"])
        if need > have + 1e-9:
            raise UsageError(
                f"{c.max_replicas()} replica(s) x {c.cpus_per_replica:g} CPU x {len(self.manifest['models'])} "
                f"model(s) need {need:g} CPUs and {where} has {have:g}: lower --replicas or --cpus-per-replica "
                "(fractions are allowed, e.g. 0.5)"
            )

    def _set_env(self) -> None:
        """Ray's environment for this process and what it starts (restored on stop, but the token)."""
        for k, v in _QUIET_RAY.items():
            self._saved_env.setdefault(k, os.environ.get(k))
            os.environ[k] = v
        if self.address is None:
            _local_token()
        if "ray" in sys.modules:  # Ray imported before: its cached configuration must see the auth settings
            with contextlib.suppress(ImportError, AttributeError):
                from ray._raylet import Config

                Config.initialize("")

    def _deploy(self) -> None:
        from ray import serve

        from ptopt.serve.ray_app import build_app

        running = self._serve_running()
        if running is not None:
            self.port, routes = running
            if self.app_name in routes:
                raise UsageError(
                    f"the cluster's Serve already runs an application named {self.app_name!r}; serve the "
                    "artifact under another file name, or `serve shutdown`/delete that application first"
                )
            taken = [n for n, prefix in routes.items() if prefix == self.route_prefix]
            if taken:
                raise UsageError(
                    f"the cluster's Serve already routes {self.route_prefix} to application {taken[0]!r}: "
                    "give another --route-prefix"
                )
        logs = logging_config(self.config.access_log)
        serve.start(
            http_options={"host": LOOPBACK, "port": self.port}, proxy_location="HeadOnly", logging_config=logs
        )
        self._owns_app = True  # past the refusals: the application named app_name is ours from here
        _clear_drain(self.app_name)  # a word to drain left on a cluster by a server that died stopping
        if self.packaged:
            self._deploy_config()
            return
        # on a cluster, every replica runs in the uploaded working_dir (ray.init above)
        app = build_app(self.manifest, "." if self.address is not None else str(self.folder))
        try:
            serve.run(
                app, name=self.app_name, route_prefix=self.route_prefix, blocking=False, logging_config=logs
            )
        except RuntimeError as e:  # a deployment failed to start: its replicas' error is in its status
            raise RayServeError(f"the application failed to start: {e}{self._why()}") from None

    def _why(self) -> str:
        """The deployments' own messages (a replica's traceback, the last lines of it)."""
        from ray import serve

        app = serve.status().applications.get(self.app_name)
        found = [
            f"{n}: {d.message.strip()}" for n, d in (app.deployments if app else {}).items() if d.message
        ]
        return ("\n" + "\n".join(found))[-3000:] if found else ""

    def _deploy_config(self) -> None:
        """A package folder: its ``serve_config.yaml`` through Serve's declarative API, as ``serve
        deploy`` sends it (the other applications deployed that way stay), under ``route_prefix``;
        waits until it runs."""
        import yaml
        from ray import serve
        from ray.serve.context import _get_global_client
        from ray.serve.schema import ServeDeploySchema

        from ptopt.serve.ray_package import CONFIG_FILE

        app = yaml.safe_load((self.folder / CONFIG_FILE).read_text(encoding="utf-8"))["applications"][0]
        app["route_prefix"] = self.route_prefix
        if self.address is None:  # a local instance: this folder, wherever it was moved or copied to
            app.setdefault("runtime_env", {})["working_dir"] = f"local://{self.folder}"
        client = _get_global_client()
        apps = client.get_serve_details().get("applications") or {}
        kept = [
            a["deployed_app_config"]
            for n, a in apps.items()
            if a.get("deployed_app_config") and n != self.app_name
        ]
        client.deploy_apps(ServeDeploySchema.model_validate({"applications": [*kept, app]}))
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            status = serve.status().applications.get(self.app_name)
            if status is not None and status.status == "RUNNING":
                return
            if status is not None and status.status == "DEPLOY_FAILED":
                raise RayServeError(f"the application failed to start: {status.message.strip()}{self._why()}")
            time.sleep(0.5)
        raise RayServeError(f"the application is not running after {self.start_timeout_s:.0f} s")

    def _serve_running(self) -> tuple[int, dict[str, str | None]] | None:
        """The HTTP port of a Serve already running on the cluster and its applications' route
        prefixes (None: Serve is not running there)."""
        if self.address is None:
            return None
        from ray.serve.context import _get_global_client

        client = _get_global_client(raise_if_no_controller_running=False)
        if client is None:
            return None
        details = client.get_serve_details()
        apps = details.get("applications") or {}
        port = (details.get("http_options") or {}).get("port") or self.port
        return int(port), {name: app.get("route_prefix") for name, app in apps.items()}

    def wait_ready(self) -> None:
        """Until ``/v2/health/ready`` answers 200 and every tensor model answered a real request."""
        from ptopt.serve.server import sample_request

        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            code, body = http("GET", f"{self.url}/v2/health/ready", timeout=10)
            if code == 200:
                for m in self.manifest["models"]:
                    sample = (
                        sample_request({"inputs": m["inputs"], "input_style": m["input_style"]})
                        if m["kind"] == "tensor"
                        else None
                    )
                    if sample is not None:
                        code, body = http(
                            "POST",
                            f"{self.url}/predictions/{m['name']}",
                            json.dumps(sample).encode(),
                            timeout=60,
                        )
                        if code != 200:
                            raise RayServeError(
                                f"model {m['name']}: a sample request answered {code}: {body[:300]!r}"
                            )
                return
            last = f"{code}: {body[:200]!r}"
            time.sleep(0.5)
        raise RayServeError(f"the application is not ready after {self.start_timeout_s:.0f} s ({last})")

    def stop(self) -> None:
        """Delete the application; a local instance: shut Serve and Ray down, kill what is left. A Ctrl-C or
        SIGTERM while it stops hurries it (cuts the drain, or Ray's own shutdown, short), never ends it
        before the local instance's processes are killed (``_end_session``: signals held)."""
        hurried = False
        try:
            self._stop_ray()
        except KeyboardInterrupt:  # Ray's shutdown cut short: what it left, _end_session kills
            hurried = True
        finally:
            with _signals_held():
                self._end_session(HURRIED_GRACE_S if hurried else KILL_GRACE_S)

    def _stop_ray(self) -> None:
        import ray

        if self._started_ray:  # also when Ctrl-C came inside ray.init: its node's processes are up
            self._session = sorted(set(self._session) | set(session_processes(str(self.ray_temp_dir))))
        if ray.is_initialized():
            if self._owns_app:  # never a cluster's application this server refused to replace
                if self._serving:  # a failed start has no client to drain (and no ingress to answer)
                    self._drain_while_gcs_lives()
                self._serving = False
                if self.address is not None:  # a cluster keeps running: only this application goes
                    self._delete_app()
                # a local instance goes down whole (below): deleting the application first only
                # answered Serve's plain-text 404 to the requests of that second or two
                self._owns_app = False
            self._session = sorted(set(self._session) | set(session_processes(str(self.ray_temp_dir))))
            if self._started_ray:
                _kill_proxy(self._session)
            ray.shutdown()

    def _drain_while_gcs_lives(self) -> None:
        """:meth:`drain`, in a thread the stop waits for. A second Ctrl-C / SIGTERM during the wait (up to
        DRAIN_TIMEOUT_S) cuts it short, never the rest of the stop (it left the local Ray instance running);
        so does a local instance's GCS dying meanwhile (:meth:`_gcs_lost`): the drain's next call to it
        would wait 60 s, and Ray end this process."""
        done, self._drain_cancel = threading.Event(), threading.Event()

        def run() -> None:
            try:
                self.drain()
            except BaseException:  # noqa: BLE001 - stopping anyway, whatever ended the drain
                pass
            finally:
                done.set()

        threading.Thread(target=run, name="ptopt-drain", daemon=True).start()
        try:
            while not done.wait(0.1):
                if self._gcs_lost():
                    print(_GCS_LOST, file=sys.stderr)
                    break
        except KeyboardInterrupt:
            pass
        self._drain_cancel.set()

    def _gcs_lost(self) -> bool:
        """A local instance whose GCS or raylet process is gone: a signal to the whole process group
        (``timeout``, systemd's control-group kill, ``kill -- -PGID``) reached them with this process (the
        raylet exits at once; the GCS lingers, answering nothing). Every call to the GCS (the drain's) would
        wait 60 s before Ray ended this process (exit 1, the instance's folder left behind)."""
        core = [
            p for p in self._session if _comm(p) in _CORE_PROCESSES
        ]  # a zombie keeps its name, not its cmdline
        return bool(self._started_ray and core and not all(alive(p) for p in core))

    def _delete_app(self) -> None:
        """A cluster's Serve: delete this application, then its drain keys. A failure is one line on stderr
        (what stays on the cluster), never the end of the stop, and never silent."""
        from ray import serve

        steps = (
            (
                serve.delete,
                "delete the application",
                "it may still run there (`serve status`) and its drain key",
            ),
            (_clear_drain, "clear the drain key of", "the key"),
        )
        for step, what, left in steps:
            try:
                step(self.app_name)
            except Exception as e:  # noqa: BLE001 - stopping anyway
                why = f"{type(e).__name__}: {e}".splitlines()[0][:200]
                print(
                    f"ptopt serve: could not {what} {self.app_name!r} on the cluster ({why}); {left} stays "
                    "(harmless: a replica ignores a drain token that stays the same)",
                    file=sys.stderr,
                )
                return

    def _end_session(self, grace_s: float = KILL_GRACE_S) -> None:
        """Kill what is left of a local instance's processes (SIGTERM, ``grace_s``, SIGKILL); restore the
        environment; remove the folder."""
        if self._started_ray:
            end_processes(self._session, grace_s)
            self._started_ray = False
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}
        shutil.rmtree(self.workdir, ignore_errors=True)

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Tell every ingress replica to answer new requests 503 (JSON, "shutting down") and wait until
        each has answered those it had in flight (at most ``timeout_s``; ``ray_app.drain_key``): what
        ``stop`` does first. True once all did; False when the time ran out. There is no way back:
        ``stop`` is what follows."""
        if not self._serving:
            raise UsageError("RayServer.drain: this server is not serving (start it first)")
        from ray.experimental import internal_kv as kv

        from ptopt.serve.ray_app import DRAIN_NAMESPACE, DRAIN_REFRESH_S, DRAIN_STALE_S, drain_key

        # a fresh token, rewritten every DRAIN_REFRESH_S: a replica ignores the token it found when it started
        # only while it stays the same (one left by a server that died stopping); a replica Serve starts
        # during this drain (replacing one that died) sees it change, and drains too
        token = f"{time.time():.6f}/{os.getpid()}/{os.urandom(4).hex()}"
        want = int(self.manifest.get("ingress_replicas", 1))
        prefix = drain_key(self.app_name, "")
        deadline = time.monotonic() + timeout_s
        seen: dict[bytes, tuple[bytes | None, float]] = {}  # each replica's key: its value, since when
        said = 0.0, 0  # when the token was last written, how many times
        while time.monotonic() < deadline and not (self._drain_cancel and self._drain_cancel.is_set()):
            now = time.monotonic()
            if now - said[0] >= DRAIN_REFRESH_S:
                said = now, said[1] + 1
                kv._internal_kv_put(drain_key(self.app_name), f"{token}/{said[1]}".encode(), True,
                                    namespace=DRAIN_NAMESPACE)  # fmt: skip
            keys = kv._internal_kv_list(prefix, namespace=DRAIN_NAMESPACE)
            for k in keys:
                value = kv._internal_kv_get(k, namespace=DRAIN_NAMESPACE)
                if k not in seen or seen[k][0] != value:
                    seen[k] = (value, now)
            # a live replica rewrites its key at every poll; one unchanged for DRAIN_STALE_S is a dead (or
            # replaced) replica's, left behind: its count never reaches 0, and is not waited for
            live = [seen[k][0] for k in keys if now - seen[k][1] < DRAIN_STALE_S]
            if len(keys) >= want and all(_in_flight(v) == 0 for v in live):
                return True
            time.sleep(0.05)
        return False

    def __enter__(self) -> RayServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- requests --------------------------------------------------------------------------------
    def predict(self, inputs: Any, *, model: str | None = None, timeout: float = 60.0) -> tuple[int, Any]:
        """POST ``{"inputs": ...}`` to the plain JSON route; (status, parsed JSON). A language model's
        text: :meth:`generate`."""
        return self._post(f"/predictions/{model or self.models[0]}", {"inputs": inputs}, timeout)

    def generate(
        self, text: str, *, model: str | None = None, timeout: float = 120.0, **parameters: Any
    ) -> tuple[int, Any]:
        """POST ``{"text_input": text, "parameters": {...}}`` to a language model's generate route
        (``max_tokens``, ``temperature``, ``seed``); (status, parsed JSON: ``text_output``, or ``error``)."""
        payload: dict[str, Any] = {"text_input": text}
        if parameters:
            payload["parameters"] = parameters
        return self._post(f"/v2/models/{model or self.models[0]}/generate", payload, timeout)

    def _post(self, path: str, payload: Any, timeout: float) -> tuple[int, Any]:
        code, raw = http("POST", self.url + path, json.dumps(payload).encode(), timeout=timeout)
        try:
            return code, json.loads(raw)
        except ValueError:
            return code, raw


def _in_flight(value: bytes | None) -> int:
    """The requests in flight an ingress replica reported (``"COUNT BEAT"``); -1 when unreadable."""
    try:
        return int((value or b"").split()[0])
    except (ValueError, IndexError):
        return -1


def _clear_drain(app: str) -> None:
    """Remove the drain keys of application ``app`` from the cluster's key-value store."""
    from ray.experimental import internal_kv as kv

    from ptopt.serve.ray_app import DRAIN_NAMESPACE, drain_key

    kv._internal_kv_del(drain_key(app, ""), del_by_prefix=True, namespace=DRAIN_NAMESPACE)
    kv._internal_kv_del(drain_key(app), namespace=DRAIN_NAMESPACE)


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """(status, body) of one request; a connection error is status 0 with its reason."""
    req = urllib.request.Request(
        url, data=body, method=method, headers=headers or {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        try:
            return e.code, e.read()
        except (OSError, http_client.HTTPException) as why:  # the connection closed inside the answer
            return e.code, f"{type(why).__name__}: {why}".encode()
    except (OSError, http_client.HTTPException) as e:  # URLError is an OSError; a cut answer is neither
        return 0, str(e).encode()


# -- the processes of a local Ray session ------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(entry))
    return out


def session_processes(temp_dir: str) -> list[int]:
    """Every live process of the Ray session whose files are under ``temp_dir``: the node's processes
    (their command lines name it: GCS, raylet, agents, log monitor) and all their descendants (the
    workers: Serve's controller, proxy and replicas)."""
    children = _children()
    roots = [pid for pids in children.values() for pid in pids if temp_dir in _cmdline(pid)]
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(found)


def _comm(pid: int) -> str:
    """The process's name (``/proc/PID/comm``: a zombie's too), or ""."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_proxy(pids: list[int]) -> None:
    """SIGKILL the HTTP proxy among ``pids`` (a local instance's, drained): new connections are refused
    from then on, rather than held by a proxy whose replicas go down around it while Ray shuts down
    (1-2 s) and then cut. Measured under 8 clients: 8 cut connections per stop before, 1-3 after."""
    for p in pids:
        if _cmdline(p).startswith(PROXY_PROCESS):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)


def _keep_python_signal_handlers() -> None:
    """No C++ failure handler in this driver: ``ray.init`` installs one for SIGTERM (it aborts the process)
    and ``ray.shutdown`` sets SIGTERM back to the default action, under Python's handlers, so a second
    SIGTERM while stopping (``timeout`` and a supervisor both sending one) killed the process mid-teardown
    (exit 143) or left it waiting 60 s for the GCS it had killed. Ray's own switch for it
    (``RAY_DISABLE_FAILURE_SIGNAL_HANDLER``), read when its core worker starts, is set for this process only:
    the node's processes, started from the environment, keep their crash reports."""
    with contextlib.suppress(ImportError):  # a Ray without the switch: its handler, as before
        from ray._private import ray_constants

        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


@contextlib.contextmanager
def _signals_held() -> Any:
    """SIGINT and SIGTERM ignored inside: the teardown that kills a local instance's processes is never cut
    by one (it left them running, orphaned); stopping is what it asked for. Python runs signal handlers in
    the main thread only, so only there; a handler installed outside Python (None) is left as it is.
    Handlers, not the signal mask: a blocked signal goes to another thread (Ray's) and interrupts anyway."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved = {s: h for s, h in saved.items() if h is not None}
    for s in saved:
        signal.signal(s, lambda signum, frame: None)
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def end_processes(pids: list[int], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM, then SIGKILL, the processes of ``pids`` still alive; waits until they are gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for p in pids if alive(p)]
        if not left:
            return
        for p in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(alive(p) for p in left):
            for p in left:  # reap those that are our own children (the GCS, the raylet)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p, os.WNOHANG)
            time.sleep(0.1)


def _trusted_manifest(folder: Path, manifest: dict[str, Any], allow_pickle: bool) -> dict[str, Any]:
    """A package folder a user was handed loads only what its own files are, and no pickle unless this
    command says ``--allow-pickle`` (the manifest's word is not enough): each model's path stays inside
    the folder; a malformed manifest is one line (exit 2)."""
    models = manifest.get("models")
    if not isinstance(models, list) or not models:
        raise ModelLoadError(f"{folder}: its manifest lists no models")
    for entry in models:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or "name" not in entry:
            raise ModelLoadError(f"{folder}: a model of its manifest has no name or path: {entry!r}"[:300])
        if not (folder / entry["path"]).resolve().is_relative_to(folder):
            raise ModelLoadError(
                f"{folder}: model {entry['name']!r} points outside the package ({entry['path']})"
            )
        _check_tokenizer(folder, entry)
        if entry.get("allow_pickle") and not allow_pickle:
            raise UsageError(
                f"{folder}: model {entry['name']!r} was packaged with --allow-pickle (loading it runs pickled "
                "code); serve it with --allow-pickle only if you trust where the folder came from"
            )
    _check_app_file(folder)
    return manifest


def _check_tokenizer(folder: Path, entry: dict[str, Any]) -> None:
    """What a model's manifest entry adds to it: a pooling the server runs (``serve.pooling``), labels as
    names (``serve.labels``), a packaged tokenizer (``serve.text_inputs``) in a folder inside the package."""
    from ptopt.core.hf import has_tokenizer
    from ptopt.serve.pooling import MODES

    pooling, labels = entry.get("pooling"), entry.get("labels")
    if pooling is not None and (
        not isinstance(pooling, dict) or not set(pooling.get("modes") or ["?"]) <= set(MODES)
    ):
        raise ModelLoadError(
            f"{folder}: model {entry['name']!r}'s pooling is not one the server runs: {pooling!r}"[:300]
        )
    if labels is not None and (not isinstance(labels, list) or not all(isinstance(v, str) for v in labels)):
        raise ModelLoadError(f"{folder}: model {entry['name']!r}'s labels are not a list of names"[:300])
    where = entry.get("tokenizer")
    if where is None:
        return
    if not isinstance(where, str) or not (folder / where).resolve().is_relative_to(folder):
        raise ModelLoadError(
            f"{folder}: model {entry['name']!r}'s tokenizer points outside the package ({where})"
        )
    if not has_tokenizer(folder / where):
        raise ModelLoadError(
            f"{folder}: model {entry['name']!r}'s tokenizer ({where}) holds no tokenizer; package the artifact again"
        )


def _check_app_file(folder: Path) -> None:
    """Serving a package folder imports its application file: only the one ``ptopt package`` writes
    (any ptopt version), under the import path it writes; anything else is refused (one line)."""
    import re

    import yaml

    from ptopt.serve.ray_package import _APP_SOURCE, APP_FILE, CONFIG_FILE

    try:
        app = yaml.safe_load((folder / CONFIG_FILE).read_text(encoding="utf-8"))["applications"][0]
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError) as e:
        raise ModelLoadError(f"{folder}: no readable {CONFIG_FILE} ({e})"[:300]) from None

    expected_path = APP_FILE[: -len(".py")] + ":app"
    try:
        text = (folder / APP_FILE).read_text(encoding="utf-8")
    except OSError as e:
        raise ModelLoadError(f"{folder}: no {APP_FILE} ({e.strerror})") from None
    found = re.search(r"the version that wrote this folder: (.*?)\)\.", text)
    if (
        not isinstance(app, dict)
        or app.get("import_path") != expected_path
        or found is None
        or text != _APP_SOURCE.format(version=found.group(1))
    ):
        raise UsageError(
            f"{folder}: its {APP_FILE} or import path is not what ptopt package writes, and serving runs it; "
            "package the artifact again (or run it with Ray's own `serve run` if you trust the folder)"
        )
