"""What every runner does: run one batch the way the artifact is deployed, and say so.

A runner owns one loaded artifact. ``predict(x)`` returns the primary output as a CPU float tensor
(for metrics); ``timed_call(x)`` returns a zero-argument function that runs one batch in the
artifact's runtime, including what a deployment pays per call (numpy conversion for ONNX Runtime),
for the latency benchmark.

Devices: ``place(device)`` puts the loaded artifact on ``cpu`` or ``cuda:N`` once (the model moves
once); every batch then moves to that device once (``timed_call`` moves its batch before timing, so
the timed call is the model's work only), its floating-point inputs cast to a half-precision
artifact's dtype (fp16 / bf16, from the sidecar's precision) at the boundary. Outputs are compared
on the host in float32 (``predict``). The latency benchmark times a CUDA runner with CUDA events
(``ptopt.core.timing.timer_for(runner.device)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptopt.core.device import half_dtype, to_device
from ptopt.core.errors import PtoptError, UsageError
from ptopt.core.inputspec import InputSpec, bind_inputs, call_model
from ptopt.core.tensors import primary_output


class ArtifactRunError(PtoptError):
    """An artifact that loaded and took the data, then failed while running it (not a shape problem:
    the same samples fail in smaller batches too). Names the artifact, the runtime and the phase."""


@dataclasses.dataclass
class Runner:
    """Base class: a loaded artifact plus how to feed it."""

    name: str
    ref: str
    format: str
    runtime: str
    input_specs: list[InputSpec]
    input_style: str = "positional"
    path: Path | None = None
    #: all files of the artifact (for size); empty for in-memory / zoo / factory references
    files: list[Path] = dataclasses.field(default_factory=list)
    precision: str = "fp32"
    #: inclusive batch range the artifact accepts (None: any)
    batch_range: tuple[int, int] | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    threads: int | None = None
    #: where the artifact runs (``place``): ``cpu`` or ``cuda:N``
    device: str = "cpu"
    #: the layer behind the primary output as read on the module the file was written from (its
    #: sidecar's ``extra.output_layer``); None: not recorded
    recorded_layer: str | None = None

    @property
    def input_dtype(self) -> Any:
        """The dtype floating-point inputs are cast to (a half-precision artifact's), or None."""
        return half_dtype(self.precision)

    @property
    def timer_device(self) -> str:
        """Where the timed call's work runs, for the latency timer (CUDA events on a GPU): the
        runner's device, unless its runtime's calls are synchronous (ONNX Runtime: the host)."""
        return self.device

    def place(self, device: str) -> None:
        """Put the artifact on ``device`` (called once, before ``prepare``). This runtime runs on the
        CPU only: another device is a UsageError naming it."""
        if device != "cpu":
            raise UsageError(f"{self.name}: {self.runtime} runs on the CPU only, not on {device}")

    def accepts_batch(self, batch: int) -> bool:
        return self.batch_range is None or self.batch_range[0] <= batch <= self.batch_range[1]

    def prepare(self, threads: int) -> None:
        """Set the intra-op thread count (called once before anything runs)."""
        self.threads = threads

    def call(self, x: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict(self, x: Any) -> Any:
        """The primary output of one batch, as a float32 CPU tensor."""
        return primary_output(self.call(x)).detach().to("cpu").float()

    def output_layer(self, x: Any) -> str | None:
        """The first layer with weights behind the primary output (``core.scores``), read on the
        batch ``x``; None where this runtime's graph is not read (the shape alone decides then)."""
        return None

    def score_layer(self, x: Any) -> str | None:
        """``output_layer`` as the sidecar recorded it from the source module, else as this runtime's
        graph reads it. The source says more: ONNX and OpenVINO fold a last BatchNorm into the Conv
        before it, a compiled package has no graph to read, and an ``nn.Identity`` classifier is gone."""
        return self.recorded_layer or self.output_layer(x)

    def named_outputs(self, x: Any) -> list[tuple[str, Any]]:
        """Every output of one batch with its name (what a server answers): the runtime's own names
        where it has them (ONNX, OpenVINO override this), else ``output__i`` in order, or a dict's keys."""
        return name_outputs(self.call(x))

    def timed_call(self, x: Any) -> Callable[[], Any]:
        return lambda: self.call(x)

    def close(self) -> None:
        """Release the loaded model (memory is measured per artifact)."""


@dataclasses.dataclass
class TorchModuleRunner(Runner):
    """A runner whose artifact loads as a callable torch module on the CPU."""

    module: Any = None

    @classmethod
    def from_loaded(cls, name: str, loaded: Any, runtime: str, batch_range: tuple[int, int] | None = None):
        art = loaded.artifact
        files = art.file_paths if art else ([loaded.path] if loaded.path else [])
        return cls(
            name=name,
            ref=loaded.ref,
            format=loaded.format,
            runtime=runtime,
            input_specs=list(loaded.input_specs),
            input_style=loaded.input_style,
            path=loaded.path,
            files=list(files),
            precision=art.precision if art else loaded.info.get("precision", "fp32"),
            batch_range=batch_range,
            module=loaded.module,
            info={k: v for k, v in loaded.info.items() if k != "exported_program"},
        )

    def prepare(self, threads: int) -> None:
        import torch

        super().prepare(threads)
        torch.set_num_threads(threads)

    def place(self, device: str) -> None:
        """The module moved to ``device`` once (parameters, buffers); subclasses whose artifact
        cannot simply ``.to()`` override ``_move``."""
        if device != self.device:
            self.module = self._move(device)
            self.device = device

    def _move(self, device: str) -> Any:
        return self.module.to(device)

    def call(self, x: Any) -> Any:
        import torch

        x = bind_inputs(x, self.input_specs, self.input_style)
        with torch.inference_mode():
            return call_model(self.module, to_device(x, self.device, self.input_dtype))

    def output_layer(self, x: Any) -> str | None:
        from ptopt.core.scores import output_layer

        x = bind_inputs(x, self.input_specs, self.input_style)
        return output_layer(self.module, to_device(x, self.device, self.input_dtype))

    def timed_call(self, x: Any) -> Callable[[], Any]:
        import torch

        module = self.module
        x = to_device(bind_inputs(x, self.input_specs, self.input_style), self.device, self.input_dtype)

        def run() -> Any:
            with torch.inference_mode():
                return call_model(module, x)

        return run

    def close(self) -> None:
        self.module = None


def name_outputs(out: Any, names: list[str] | None = None) -> list[tuple[str, Any]]:
    """``[(name, tensor)]`` of a model's output: a dict by its keys, a HuggingFace-style object by its
    tensor fields, a tuple/list (nested ones flattened) as ``output__i`` (or ``names`` when given)."""
    import torch

    if isinstance(out, dict) or hasattr(out, "to_tuple"):
        items = [(str(k), v) for k, v in dict(out).items() if isinstance(v, torch.Tensor)]
        return items
    flat: list[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, (tuple, list)):
            for item in v:
                walk(item)
        elif isinstance(v, torch.Tensor):
            flat.append(v)

    walk(out)
    names = list(names or [])
    return [(names[i] if i < len(names) else f"output__{i}", t) for i, t in enumerate(flat)]


def sidecar_batch_range(loaded: Any) -> tuple[int, int] | None:
    """A fixed batch size the sidecar declares (a trace or export may bake it in); None when dynamic."""
    art = loaded.artifact
    if art and art.inputs and art.inputs[0].min_shape:
        s = art.inputs[0]
        if s.min_shape[0] == s.max_shape[0]:
            return (s.min_shape[0], s.max_shape[0])
    return None
