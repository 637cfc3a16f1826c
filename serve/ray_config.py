"""How Ray Serve serves ptopt artifacts: one frozen config, read by ``ptopt serve --engine ray`` and
``ptopt package --format ray`` alike (each field is an option of both, ``ptopt.core.options``), written into
the package's manifest (``ptopt_ray.json``) and its Serve config. Imports no Ray."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ptopt.core.errors import UsageError
from ptopt.core.options import OPT, option

#: batches a model replica holds: one running, one waiting (its lock runs them one at a time)
MODEL_MAX_ONGOING = 2
#: requests one ingress replica reads and checks at once
INGRESS_MAX_ONGOING = 1024


#: seconds ``ptopt serve --engine ray`` waits for Ray, Serve and every model to answer
DEFAULT_START_TIMEOUT_S = 300.0
#: seconds stopping waits for the requests in flight to be answered (new ones are answered 503 meanwhile):
#: under Kubernetes' default 30 s grace period between SIGTERM and SIGKILL, with Ray's own shutdown (~2 s)
DRAIN_TIMEOUT_S = 20.0
#: how often a replica Serve deletes looks whether its requests are done (Serve's default, 2 s, is the
#: least a deletion takes; ptopt drains the ingress first, so there is nothing left to wait for)
GRACEFUL_WAIT_LOOP_S = 0.2


@dataclasses.dataclass(frozen=True)
class RayServeConfig:
    """Replicas, batching, CPUs and limits of a Ray Serve application: options of ``ptopt serve
    --engine ray`` and ``ptopt package --format ray`` (``ptopt.core.options``)."""

    replicas: int = option(1, help="Model replicas per artifact, each loading it once.", metavar="N")
    autoscale: str | None = option(
        None,
        help="Serve's autoscaling instead of a fixed --replicas: between MIN and MAX replicas per artifact.",
        metavar="MIN:MAX",
    )
    target_ongoing_requests: float = option(
        float(MODEL_MAX_ONGOING),
        help="With --autoscale: the batches in flight per replica Serve scales to keep.",
    )
    max_batch_size: int = option(
        1,
        help="Serve's dynamic batching (@serve.batch): up to this many rows per model call (1: off).",
        metavar="B",
    )
    batch_wait_ms: float = option(5.0, help="How long a batch waits to fill (ms).", metavar="T")
    cpus_per_replica: float = option(
        1.0, help="CPUs Ray reserves for each model replica (fractions allowed: 0.5).", metavar="C"
    )
    threads: int | None = option(
        None, help="Intra-op threads per model replica (default: its whole CPUs, at least 1)."
    )
    max_request_mb: float = option(
        16.0,
        help="Largest request body in MB (10^6 bytes); bigger ones are answered 413 with the limit.",
        flag="--max-request-size",
        metavar="MB",
    )
    max_tokens: int = option(256, help="Language models: the most new tokens one request may ask for.")
    ingress_replicas: int = option(1, help="Replicas of the HTTP ingress (no CPU reserved).")
    access_log: bool = option(
        False,
        help="Serve's per-request access log lines (proxy and replicas; off: Serve logs warnings and errors).",
    )

    def __post_init__(self) -> None:
        for name, low in (("replicas", 1), ("max_batch_size", 1), ("max_tokens", 1), ("ingress_replicas", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UsageError(f"{flag(name)} {value}: must be an integer >= {low}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise UsageError(f"--threads {self.threads}: must be an integer >= 1")
        for name in ("cpus_per_replica", "max_request_mb", "target_ongoing_requests"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise UsageError(f"{flag(name)} {value}: must be a number > 0")
        if not isinstance(self.batch_wait_ms, (int, float)) or not 0 <= self.batch_wait_ms <= 60_000:
            raise UsageError(f"--batch-wait-ms {self.batch_wait_ms}: must be between 0 and 60000")
        self.scaling_range()  # refuses a malformed --autoscale

    def scaling_range(self) -> tuple[int, int] | None:
        """``(min, max)`` replicas of ``autoscale``, or None for a fixed count."""
        if self.autoscale is None:
            return None
        lo, sep, hi = str(self.autoscale).partition(":")
        try:
            low, high = int(lo), int(hi)
        except ValueError:
            low = high = -1
        if not sep or low < 0 or high < max(low, 1):
            raise UsageError(
                f"--autoscale {self.autoscale}: give MIN:MAX replicas, 0 <= MIN <= MAX, MAX >= 1"
            )
        return low, high

    @property
    def replica_threads(self) -> int:
        return self.threads or max(1, int(self.cpus_per_replica))

    def max_replicas(self) -> int:
        scale = self.scaling_range()
        return scale[1] if scale else self.replicas

    def manifest(self) -> dict[str, Any]:
        """The manifest's serving settings (``serve.ray_app.build_app`` reads them)."""
        scale = self.scaling_range()
        return {
            "replicas": (
                {
                    "min": scale[0],
                    "max": scale[1],
                    "target_ongoing_requests": float(self.target_ongoing_requests),
                }
                if scale
                else self.replicas
            ),
            "cpus_per_replica": float(self.cpus_per_replica),
            "threads": self.replica_threads,
            "max_batch_size": self.max_batch_size,
            "batch_wait_ms": float(self.batch_wait_ms),
            "max_request_bytes": int(self.max_request_mb * 1_000_000),
            "max_tokens": self.max_tokens,
            "ingress_replicas": self.ingress_replicas,
            "logging_config": logging_config(self.access_log),
            "model_max_ongoing": MODEL_MAX_ONGOING,
            # every replica can hold MODEL_MAX_ONGOING batches: the ingress sends that many at once
            "concurrent_batches": self.max_replicas() * MODEL_MAX_ONGOING,
        }

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> RayServeConfig:
        """The config from keyword options (None: the default); an unknown keyword is refused."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise UsageError(
                f"unknown Ray Serve option(s): {', '.join(unknown)} (known: {', '.join(sorted(names))})"
            )
        return cls(**{k: v for k, v in options.items() if v is not None})


def logging_config(access_log: bool) -> dict[str, Any]:
    """Serve's ``LoggingConfig`` (proxy, controller, replicas). Its defaults write an INFO access line per
    request in the proxy and in every replica a request passes (flushed each time); measured on 2 shared
    cores (benchmarks/probe_serve_cpu.py) that is CPU the replicas would use, so it is off by default."""
    return {"enable_access_log": bool(access_log), "log_level": "INFO" if access_log else "WARNING"}


#: Ray Serve's throughput flags (its performance guide, "Enable throughput-optimized flags"; the defaults
#: Ray means to switch to): the replica's code and a handle's router run on the process's own event loop
#: rather than each on a thread of its own, saving a thread hop (futures across loops) per request in the
#: proxy, the ingress and the model replicas. The replicas' blocking work runs in threads (``ray_app``).
SERVE_FAST_PATH = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
}


def flag(name: str) -> str:
    """The CLI flag of a field of :class:`RayServeConfig` or :class:`RayRun`."""
    for cls in (RayServeConfig, RayRun):
        for f in dataclasses.fields(cls):
            if f.name == name and OPT in f.metadata:
                return f.metadata[OPT].flag or "--" + name.replace("_", "-")
    return "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class RayRun:
    """Where ``ptopt serve --engine ray`` deploys and what it may load (beside :class:`RayServeConfig`).
    ``port`` and ``start_timeout_s`` are ``ptopt serve``'s options of every engine."""

    port: int | None = None
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    address: str | None = option(None, help="Deploy on this running Ray cluster instead of a local one.")
    route_prefix: str = option("/", help="The HTTP path the application answers under.")
    input_shapes: tuple[str, ...] = option(
        (), help="The input shape of a file without a sidecar (e.g. 1x3x224x224).", flag="--input-shape",
        repeat=True,
    )  # fmt: skip
    allow_pickle: bool = option(False, help="Load AOTInductor packages (native code) and pickled modules.")
