"""The one command table: every ``ptopt`` command, its Python twin, its help line, and whether a recipe
can use it as a step. Three readers, no second copy:

- the CLI group (``ptopt.cli.main``) lists and lazily imports ``cli`` modules, showing ``help``;
- the lazy Python API (``ptopt.quantize(...)``, ``ptopt.validate(...)``) resolves ``api``;
- the pipeline (``ptopt run``, ``ptopt demo``; ``ptopt.pipeline``) calls ``twin`` for each step.

This module imports nothing but the standard library: ``ptopt --help`` reads it without torch.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Command:
    """One command. ``twin`` is ``"module:function"``, the function the command calls (a recipe step
    calls it with the step's options as keyword arguments)."""

    name: str
    help: str
    twin: str | None = None
    #: usable as a step of a recipe (``ptopt run``)
    step: bool = False
    #: what ``ptopt.<name>`` is: ``"module:attr"``, a bare module, ``""`` for the twin, None for nothing
    api: str | None = ""
    #: the click command's module; ``ptopt.cli.<name>`` unless it has none
    cli: str | None = dataclasses.field(default=None)

    def __post_init__(self) -> None:
        if self.cli is None:
            object.__setattr__(self, "cli", f"ptopt.cli.{self.name}")

    @property
    def api_target(self) -> str | None:
        return None if self.api is None else (self.api or self.twin)


_TABLE = (
    Command(
        "quantize",
        "Quantize a model: int8 (dynamic, static with calibration, QAT), or an LLM's weights to int8/int4.",
        "ptopt.compress.quantize:quantize",
        step=True,
    ),
    Command(
        "prune",
        "Prune a model: L1 unstructured, global, or structured channel removal.",
        "ptopt.compress.prune:prune",
        step=True,
    ),
    Command(
        "distill",
        "Train a student from a teacher by knowledge distillation.",
        "ptopt.compress.distill:distill",
        step=True,
    ),
    # ptopt.export / ptopt.validate / ptopt.optimize are the stage packages themselves (callable modules)
    Command(
        "export",
        "Export to TorchScript, ExportedProgram, AOTInductor, ONNX, OpenVINO or TensorRT, checked "
        "against its source.",
        "ptopt.export.api:export",
        step=True,
        api="ptopt.export",
    ),
    Command(
        "validate",
        "Compare artifacts on the same data: accuracy, size, latency; gate CI.",
        "ptopt.validate.api:validate",
        step=True,
        api="ptopt.validate",
    ),
    Command(
        "package",
        "Package an artifact for serving (a Ray Serve folder, a TorchServe .mar, a Triton repository).",
        "ptopt.serve.package:package",
        step=True,
    ),
    Command(
        "optimize",
        "Find the fastest artifact within an accuracy budget: techniques x formats x runtimes.",
        "ptopt.optimize.api:optimize",
        step=True,
        api="ptopt.optimize",
    ),
    Command(
        "serve",
        "Serve artifacts on 127.0.0.1: Ray Serve (Open Inference Protocol) or TorchServe (.mar).",
        api=None,
    ),
    Command(
        "run",
        "Run a pipeline recipe (compress, export, validate with gates) from YAML.",
        "ptopt.pipeline:run_recipe",
        api=None,
    ),
    # `ptopt.demo` is the module ptopt/demo.py; its function is ptopt.demo.demo
    Command(
        "demo", "Run the whole pipeline on the zoo ResNet and bundled digits.", "ptopt.demo:demo", api=None
    ),
    Command(
        "inspect",
        "Show what a model is: inputs, outputs, parameters, size, layers.",
        "ptopt.core.inspect:inspect_model",
    ),
    Command(
        "doctor",
        "Show which runtimes work here (ORT, OpenVINO, NNCF, torchao, transformers, TensorRT, CUDA, TorchServe, "
        "Java, ...) and how to install a missing one.",
        "ptopt.core.doctor:doctor",
    ),
)

#: command name -> Command
COMMANDS: dict[str, Command] = {c.name: c for c in _TABLE}

#: what ``ptopt.<name>`` offers besides the commands' twins
API_EXTRAS: dict[str, str] = {
    "load_model": "ptopt.core.modelref:load_model",
    "load_data": "ptopt.core.data:load_data",
    "Artifact": "ptopt.core.artifact:Artifact",
    "Result": "ptopt.core.result:Result",
    "InputSpec": "ptopt.core.inputspec:InputSpec",
    "PtoptError": "ptopt.core.errors:PtoptError",
    # the serving package (its servers: ptopt.serve.ray_server.RayServer, ptopt.serve.server.TorchServeServer)
    "serve": "ptopt.serve",
}


def lazy_api() -> dict[str, str]:
    """``ptopt.<name>`` -> ``"module:attr"`` (or a bare module), for the lazy ``ptopt`` package."""
    api = {c.name: c.api_target for c in _TABLE if c.api_target}
    return {**api, **API_EXTRAS}


def step_commands() -> dict[str, Command]:
    """The commands a recipe step can name."""
    return {n: c for n, c in COMMANDS.items() if c.step}
