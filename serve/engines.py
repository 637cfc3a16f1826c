"""``ptopt serve``'s options and which engine serves the artifacts: TorchServe for ``.mar`` archives
(``ServeSettings``), Ray Serve for everything else (``RayServeConfig``: replicas, batching, CPUs;
``RayRun``: where it deploys and what it may load). ``--port``, ``--timeout`` and
``--max-request-size`` are options of both; each engine refuses the other's (one line, exit 2).
Imports neither TorchServe nor Ray."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ptopt.core.errors import UsageError
from ptopt.core.options import Options, Selector, fields_of
from ptopt.serve.ray_config import RayRun, RayServeConfig
from ptopt.serve.server import ServeSettings

ENGINES = ("torchserve", "ray")
#: options of every engine (``ServeSettings`` declares them; ``RayRun`` re-defaults the timeout)
SHARED = ("port", "start_timeout_s", "max_request_mb")


def _engines() -> tuple[str, ...]:
    return ENGINES


def _takes(engine: str) -> tuple[str, ...]:
    if engine == "torchserve":
        return tuple(fields_of(ServeSettings))
    return (*SHARED, *fields_of(RayServeConfig), *fields_of(RayRun))


#: the options of ``ptopt serve`` (no Python twin: the servers take their settings, ``settings`` below)
OPTIONS = Options(
    "serve",
    lambda: (ServeSettings, RayServeConfig, RayRun),
    Selector(
        "engine",
        "torchserve: .mar archives; ray: Ray Serve with the Open Inference Protocol (any artifact, LM "
        "folders, a `package --format ray` folder). Default (auto): torchserve for .mar files, else ray.",
        _engines,
        takes=_takes,
        required=False,
        label=lambda cls: "ray" if cls in (RayServeConfig, RayRun) else "torchserve",
    ),
)


def engine_for(artifacts: Sequence[str], engine: str | None) -> str:
    """The engine that serves ``artifacts``: the one named, or (None / ``auto``) TorchServe when every
    artifact is a ``.mar``, else Ray Serve."""
    if engine in (None, "auto"):
        return "torchserve" if all(str(a).endswith(".mar") for a in artifacts) else "ray"
    if engine not in ENGINES:
        raise UsageError(f"unknown --engine {engine!r}: choose one of auto, {', '.join(ENGINES)}")
    return engine


def settings(artifacts: Sequence[str], engine: str | None, options: Mapping[str, Any]) -> tuple[str, Any]:
    """``(engine, its settings)`` from ``ptopt serve``'s options: ``ServeSettings`` for TorchServe;
    for Ray Serve ``(RayServeConfig fields given, RayRun)`` (no field given: the defaults, or a
    package folder's own settings). An option of the other engine is refused."""
    engine = engine_for(artifacts, engine)
    given = OPTIONS.check(options, engine)
    if engine == "torchserve":
        return engine, OPTIONS.build(ServeSettings, given)
    return engine, (OPTIONS.of(RayServeConfig, given), OPTIONS.build(RayRun, given))
