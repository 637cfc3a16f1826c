"""Run a .mar with a local TorchServe on 127.0.0.1, wait until it really answers, stop it cleanly.

TorchServe keeps global state in odd places: a pid file in the temp folder (one server per temp
folder), ``logs/`` in the working directory, a config snapshot folder. So every server gets its own
folder that holds all of it: TMPDIR/TEMP point there, the working directory is there, and
LOG_LOCATION/METRICS_LOCATION put the logs there. The server runs in its own process group, so
stopping it can make sure no worker is left behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, PtoptError, UsageError
from ptopt.core.options import option
from ptopt.serve.handler import MAX_REQUEST_BYTES_ENV

#: seconds to wait for the model to be READY and answer a real prediction
DEFAULT_START_TIMEOUT_S = 180.0
LOOPBACK = "127.0.0.1"
#: requests TorchServe holds per model while every worker is busy (its default, 100, answers 503 to
#: the 101st of many concurrent clients). Memory bound: about queue size x largest request.
DEFAULT_QUEUE_SIZE = 1024
#: the largest request body answered (MB); bigger ones get 413 with the limit in a JSON body
DEFAULT_MAX_REQUEST_MB = 16.0
#: a body this much over the limit still reaches the handler, which answers 413 in JSON; beyond it
#: TorchServe's own 413 (no body) answers, and closes the connection if the client asked to
TRANSPORT_SLACK_BYTES = 16 << 20
#: "--workers auto" never starts more worker processes than this (each holds a copy of the model)
MAX_AUTO_WORKERS = 4


class ServerError(PtoptError):
    """TorchServe did not start, or the model never became ready (the message has the log tail)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether a server listens on ``port`` of the loopback. Connections of a server that just stopped
    (TIME_WAIT, up to a minute) do not count: the servers bind with SO_REUSEADDR, and so does this test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def read_mar(mar: str | os.PathLike) -> dict[str, Any]:
    """What a .mar holds: its manifest, and the packaged sidecar of the model (or None)."""
    mar = Path(mar)
    if not mar.is_file():
        raise ModelLoadError(f"{mar}: no such file")
    if not zipfile.is_zipfile(mar):
        raise ModelLoadError(
            f"{mar}: not a .mar (TorchServe model archive); make one with `ptopt package --format mar`"
        )
    with zipfile.ZipFile(mar) as z:
        try:
            manifest = json.loads(z.read("MAR-INF/MANIFEST.json"))
        except KeyError:
            raise ModelLoadError(f"{mar}: no MAR-INF/MANIFEST.json; not a TorchServe model archive") from None
        serialized = manifest.get("model", {}).get("serializedFile")
        sidecar = None
        if serialized and serialized + ".ptopt.json" in z.namelist():
            sidecar = json.loads(z.read(serialized + ".ptopt.json"))
    return {
        "manifest": manifest,
        "sidecar": sidecar,
        "model_name": manifest.get("model", {}).get("modelName"),
    }


def _sample_values(sidecar: dict[str, Any] | None) -> dict[str, tuple[list[int], Any]] | None:
    """{input name: (one sample's shape, fill value)} from the sidecar's specs."""
    if not sidecar or not sidecar.get("inputs"):
        return None
    out = {}
    for spec in sidecar["inputs"]:
        if spec["dtype"].startswith(("float", "bfloat")):
            fill: Any = 0.0
        elif spec["dtype"] == "bool":
            fill = 1
        else:
            fill = int((spec.get("value_range") or [0])[0])
        out[spec["name"]] = (list(spec["opt_shape"][1:]), fill)
    return out


def _wrap(sidecar: dict[str, Any], values: dict[str, Any]) -> Any:
    if len(values) == 1 and sidecar.get("input_style", "positional") == "positional":
        return next(iter(values.values()))
    return values


def sample_request(sidecar: dict[str, Any] | None) -> dict[str, Any] | None:
    """One sample in the handler's JSON request format (zeros, or the lowest token id), from the sidecar."""
    samples = _sample_values(sidecar)
    if samples is None:
        return None
    values = {}
    for name, (shape, fill) in samples.items():
        for d in reversed(shape):
            fill = [fill] * d
        values[name] = fill
    return {"inputs": _wrap(sidecar, values)}


def sample_request_python(sidecar: dict[str, Any] | None) -> str | None:
    """A short Python expression that builds ``sample_request`` (for a curl example of a big input)."""
    samples = _sample_values(sidecar)
    if samples is None:
        return None
    exprs = {}
    for name, (shape, fill) in samples.items():
        e = repr(fill)
        for d in reversed(shape):
            e = f"[{e}]*{d}"
        exprs[name] = e
    inner = _wrap(sidecar, exprs)
    if isinstance(inner, str):
        return "{'inputs': " + inner + "}"
    return "{'inputs': {" + ", ".join(f"{k!r}: {v}" for k, v in inner.items()) + "}}"


def _http(
    method: str,
    url: str,
    body: bytes | None = None,
    timeout: float = 10.0,
    content_type: str = "application/json",
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """How TorchServe serves the archives (``ptopt serve``'s options). None keeps what the archive's
    model-config.yaml says (``ptopt package --workers/--batch-size/--max-batch-delay``); a value
    overrides it."""

    port: int | None = option(None, help="Inference port on 127.0.0.1 (default: a free one).")
    start_timeout_s: float = option(
        DEFAULT_START_TIMEOUT_S, help="Seconds to wait for the model to be ready.", flag="--timeout"
    )
    workers: int | str | None = option(
        None,
        help=f"Worker processes per model ('auto': one per core, at most {MAX_AUTO_WORKERS}). Default: the archive's.",
        metavar="N|auto",
    )
    batch_size: int | None = option(None, help="Requests batched per model call. Default: the archive's.")
    max_batch_delay_ms: int | None = option(
        None, help="Milliseconds to wait to fill a batch. Default: the archive's.", flag="--max-batch-delay"
    )
    queue_size: int = option(
        DEFAULT_QUEUE_SIZE,
        help="Requests held while every worker is busy; beyond them the server answers 503.",
    )
    max_request_mb: float = option(
        DEFAULT_MAX_REQUEST_MB,
        help="Largest request body in MB (10^6 bytes); bigger ones are answered 413 with the limit.",
        flag="--max-request-size",
    )

    def __post_init__(self) -> None:
        workers = self.workers
        if isinstance(workers, str) and workers != "auto":
            if not workers.isdigit():
                raise UsageError(f"--workers {workers}: give a number >= 1 or 'auto'")
            object.__setattr__(self, "workers", int(workers))

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 1_000_000)

    @property
    def overrides_archive(self) -> bool:
        return any(v is not None for v in (self.workers, self.batch_size, self.max_batch_delay_ms))

    def resolved_workers(self) -> int | None:
        if self.workers == "auto":
            return max(1, min(MAX_AUTO_WORKERS, len(os.sched_getaffinity(0))))
        return None if self.workers is None else int(self.workers)

    def check(self, models: dict[str, tuple[Path, dict[str, Any] | None]]) -> None:
        """Refuse values TorchServe would reject or misuse (UsageError, naming the option)."""
        if self.workers is not None and self.workers != "auto":
            if not isinstance(self.workers, int) or self.workers < 1:
                raise UsageError(f"--workers {self.workers}: give a number >= 1 or 'auto'")
        for flag, value, low in (
            ("--batch-size", self.batch_size, 1),
            ("--max-batch-delay", self.max_batch_delay_ms, 0),
            ("--queue-size", self.queue_size, 1),
        ):
            if value is not None and (not isinstance(value, int) or value < low):
                raise UsageError(f"{flag} {value}: must be an integer >= {low}")
        if not self.max_request_mb > 0:
            raise UsageError(f"--max-request-size {self.max_request_mb}: must be > 0 (MB)")
        for name, (_, sidecar) in models.items():
            specs = (sidecar or {}).get("inputs") or []
            max_batch = min((s["max_shape"][0] for s in specs), default=None)
            if self.batch_size and max_batch and self.batch_size > max_batch:
                raise UsageError(
                    f"--batch-size {self.batch_size} is larger than model {name}'s max batch {max_batch}"
                )

    def place_archive(self, src: Path, dst: Path) -> None:
        """Put an archive into the model store: a link, or a copy whose model-config.yaml says
        what was overridden (TorchServe takes per-model settings from the archive only)."""
        if not self.overrides_archive:
            try:
                os.symlink(src, dst)
                return
            except OSError:
                pass
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
            manifest = json.loads(zin.read("MAR-INF/MANIFEST.json"))
            config_name = manifest.setdefault("model", {}).setdefault("configFile", "model-config.yaml")
            names = set(zin.namelist())
            config = _yaml_load(zin.read(config_name)) if config_name in names else {}
            for info in zin.infolist():
                if info.filename in (config_name, "MAR-INF/MANIFEST.json"):
                    continue
                with zin.open(info) as fin, zout.open(info, "w") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
            zout.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest, indent=2))
            zout.writestr(config_name, self._model_config(config))

    def _model_config(self, config: dict[str, Any]) -> str:
        import yaml

        workers = self.resolved_workers()
        if workers is not None:
            config["minWorkers"] = config["maxWorkers"] = workers
            handler = config.setdefault("handler", {}) or {}
            # workers share the cores: torch's default (all cores per worker) oversubscribes them
            handler.setdefault("threads", max(1, len(os.sched_getaffinity(0)) // workers))
            config["handler"] = handler
        if self.batch_size is not None:
            config["batchSize"] = self.batch_size
        if self.max_batch_delay_ms is not None:
            config["maxBatchDelay"] = self.max_batch_delay_ms
        return yaml.safe_dump(config, sort_keys=False)


def _yaml_load(data: bytes) -> dict[str, Any]:
    import yaml

    loaded = yaml.safe_load(data.decode("utf-8")) or {}
    return loaded if isinstance(loaded, dict) else {}


class TorchServeServer:
    """A TorchServe serving one .mar (or several) on loopback. A context manager, or start()/stop().

    ``port`` is the inference port (a free one when None); management and metrics ports are free
    ports on 127.0.0.1 too. With several archives, the first is the default ``model_name``.
    """

    def __init__(
        self,
        mar: str | os.PathLike | Sequence[str | os.PathLike],
        port: int | None = None,
        *,
        workdir: str | os.PathLike | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        settings: ServeSettings | None = None,
    ):
        from ptopt.serve.prepare import named_artifacts

        #: model name -> (archive path, packaged sidecar or None)
        self.models: dict[str, tuple[Path, dict[str, Any] | None]] = {}
        for given, m in named_artifacts(mar):
            path = Path(m).resolve()
            info = read_mar(path)
            name = given or info["model_name"] or path.stem
            if name in self.models:
                raise UsageError(
                    f"two archives serve the same model name {name!r} ({self.models[name][0].name} and "
                    f"{path.name}); name each model: ptopt serve NAME=ARCHIVE ..., e.g. {name}_2={m}"
                )
            self.models[name] = (path, info["sidecar"])
        self.model_name = next(iter(self.models))
        self.mar, self.sidecar = self.models[self.model_name]
        if port is not None:
            if not 1 <= int(port) <= 65535:
                raise UsageError(f"--port {port}: must be between 1 and 65535")
            if port_in_use(int(port)):
                raise UsageError(
                    f"port {port} on {LOOPBACK} is already in use; pick another with --port "
                    "or leave it out to use a free one"
                )
        self.settings = settings or ServeSettings()
        self.settings.check(self.models)
        self.port = int(port) if port is not None else free_port()
        # every port TorchServe opens, gRPC's too (7070/7071 by default), is a free one on loopback
        self.management_port, self.metrics_port, self.grpc_port, self.grpc_management_port = (
            free_port() for _ in range(4)
        )
        self.start_timeout_s = start_timeout_s
        self._own_workdir = workdir is None
        self.workdir = (
            Path(workdir) if workdir else Path(tempfile.gettempdir()) / "ptopt-torchserve-not-started"
        )
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None

    # -- addresses -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def predict_url(self) -> str:
        return self.predict_url_for(self.model_name)

    def predict_url_for(self, model: str) -> str:
        return f"{self.url}/predictions/{model}"

    @property
    def management_url(self) -> str:
        return f"http://{LOOPBACK}:{self.management_port}"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def curl_example(self) -> str:
        """A curl command that sends one sample (zeros); big inputs are built by a python one-liner."""
        req = sample_request(self.sidecar)
        head = f"curl -s -X POST {self.predict_url} -H 'Content-Type: application/json'"
        if req is None:
            return head + " -d '{\"inputs\": ...}'"
        body = json.dumps(req)
        if len(body) <= 200:
            return f"{head} -d '{body}'"
        expr = sample_request_python(self.sidecar)
        return f'{head} -d "$(python3 -c "import json; print(json.dumps({expr}))")"'

    def _env(self) -> dict[str, str]:
        tmp = str(self.workdir / "tmp")
        env = dict(
            os.environ,
            TMPDIR=tmp,
            TEMP=tmp,
            LOG_LOCATION=str(self.log_dir),
            METRICS_LOCATION=str(self.log_dir),
        )
        # the server's own settings come from our config file only
        for k in list(env):
            if k.startswith("TS_") or k == "TS_CONFIG_FILE":
                env.pop(k)
        env[MAX_REQUEST_BYTES_ENV] = str(self.settings.max_request_bytes)  # the handler's 413
        return env

    def _cmd(self, *args: str) -> list[str]:
        # the launcher of the python running ptopt: its workers then run with the same python
        return [sys.executable, "-c", "from ts.model_server import start; start()", *args]

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> TorchServeServer:
        from ptopt.core.features import require

        require("java", "serving with TorchServe")
        require("torchserve", "serving with TorchServe")
        if self._own_workdir:
            self.workdir = Path(tempfile.mkdtemp(prefix="ptopt-torchserve-"))
        store = self.workdir / "model-store"
        for d in (store, self.workdir / "tmp", self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        for name, (path, _) in self.models.items():
            self.settings.place_archive(path, store / f"{name}.mar")
        cfg = self.workdir / "config.properties"
        transport = self.settings.max_request_bytes + TRANSPORT_SLACK_BYTES
        cfg.write_text(
            "\n".join(
                [
                    f"inference_address=http://{LOOPBACK}:{self.port}",
                    f"management_address=http://{LOOPBACK}:{self.management_port}",
                    f"metrics_address=http://{LOOPBACK}:{self.metrics_port}",
                    f"grpc_inference_address={LOOPBACK}",
                    f"grpc_management_address={LOOPBACK}",
                    f"grpc_inference_port={self.grpc_port}",
                    f"grpc_management_port={self.grpc_management_port}",
                    f"model_store={store}",
                    "load_models=" + ",".join(f"{n}={n}.mar" for n in self.models),
                    "disable_token_authorization=true",
                    "enable_envvars_config=false",
                    "install_py_dep_per_model=false",
                    "default_response_timeout=120",
                    f"job_queue_size={self.settings.queue_size}",
                    # the handler gets the raw body: it measures it, then parses it itself
                    "decode_input_request=false",
                    f"max_request_size={transport}",
                    f"max_response_size={transport}",
                ]
            )
            + "\n"
        )
        out = open(self.log_dir / "server.out", "wb")  # noqa: SIM115 - closed in stop()
        self._out = out
        self.proc = subprocess.Popen(
            self._cmd(
                "--start",
                "--foreground",
                "--ncs",
                "--disable-token-auth",
                "--ts-config",
                str(cfg),
                "--model-store",
                str(store),
            ),
            cwd=self.workdir,
            env=self._env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        #: the server's process group (the launcher's pid): every TorchServe process is in it
        self.pgid = self.proc.pid
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> None:
        """Until every model has a READY worker and answers a real prediction with 200."""
        deadline = time.monotonic() + self.start_timeout_s
        for name, (_, sidecar) in self.models.items():
            self._wait_model(name, sidecar, deadline)

    def _wait_model(self, name: str, sidecar: dict[str, Any] | None, deadline: float) -> None:
        sample = sample_request(sidecar)
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(
                    f"TorchServe exited with code {self.proc.returncode} while starting:\n{self.log_tail()}"
                )
            try:
                code, body = _http("GET", f"{self.management_url}/models/{name}", timeout=5)
                if code == 200:
                    workers = json.loads(body)[0].get("workers", [])
                    if any(w.get("status") == "READY" for w in workers):
                        if sample is None:
                            return
                        code, body = _http(
                            "POST", self.predict_url_for(name), json.dumps(sample).encode(), timeout=30
                        )
                        if code == 200:
                            return
                        last = f"sample prediction answered {code}: {body[:300]!r}"
                    else:
                        last = f"workers: {[w.get('status') for w in workers]}"
                else:
                    last = f"management API answered {code}"
            except (OSError, ValueError, IndexError) as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(0.5)
        raise ServerError(
            f"model {name} not ready after {self.start_timeout_s:.0f} s ({last}):\n{self.log_tail()}"
        )

    def describe_model(self, model: str | None = None) -> dict[str, Any]:
        """TorchServe's description of a served model (workers, batch size, delay, queue)."""
        code, body = _http("GET", f"{self.management_url}/models/{model or self.model_name}", timeout=10)
        if code != 200:
            raise ServerError(f"management API answered {code}: {body[:200]!r}")
        return json.loads(body)[0]

    def log_tail(self, lines: int = 30) -> str:
        texts = []
        for name in ("server.out", "model_log.log"):
            p = self.log_dir / name
            if p.is_file():
                texts += p.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(texts[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """``torchserve --stop`` for this server, then kill whatever of its process group is left."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        self._cmd("--stop"),
                        cwd=self.workdir,
                        env=self._env(),
                        timeout=timeout_s,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        stdin=subprocess.DEVNULL,
                    )
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(proc)
        out = getattr(self, "_out", None)
        if out is not None:
            out.close()
            self._out = None
        if self._own_workdir and self.workdir.name != "ptopt-torchserve-not-started":
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> TorchServeServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- requests --------------------------------------------------------------------------
    def predict(
        self,
        inputs: Any = None,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
        model: str | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, Any]:
        """POST one request; returns (status, parsed JSON or raw bytes)."""
        if body is None:
            body = json.dumps({"inputs": inputs}).encode()
        url = self.predict_url_for(model or self.model_name)
        code, raw = _http("POST", url, body, timeout=timeout, content_type=content_type)
        try:
            return code, json.loads(raw)
        except ValueError:
            return code, raw


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group (the launcher, Java, the Python workers), SIGKILL what remains."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        proc.poll()  # reap the launcher: a zombie still counts as a member of its group
        if not group_alive(pgid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()
            if not group_alive(pgid):
                return
            time.sleep(0.1)
