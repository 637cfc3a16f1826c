"""What flows between the steps of quantization: the prepared model and data, what a technique
makes (the eager int8 module), and what a handler hands the flow (the int8 artifact in memory).
Imports no torch."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Prepared:
    """The eager model, its data (Datasets or None), one example batch it has run, and the data
    arguments as given (``refs``: references are recorded in the sidecar)."""

    loaded: Any
    module: Any
    calib: Any
    train: Any
    evald: Any
    example: Any
    refs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def specs(self) -> list[Any]:
        return list(self.loaded.input_specs)

    @property
    def style(self) -> str:
        return self.loaded.input_style

    def ref_names(self) -> dict[str, str]:
        """The data arguments that are references (paths, DATA strings), as the sidecar records them."""
        return {k: str(v) for k, v in self.refs.items() if isinstance(v, (str, os.PathLike))}


@dataclasses.dataclass
class QuantResult:
    """What a technique function returns: the int8 module (eager-callable), the layers that stayed
    float ``{name: reason}``, and a summary for the sidecar (calibration / training)."""

    module: Any
    float_layers: dict[str, str]
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)


def _no_context() -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@dataclasses.dataclass
class Quantized:
    """What a handler returns: the int8 artifact, in memory, as ``.save`` will write it.

    ``model`` runs in this process (what the file holds, loaded back); ``size`` is its bytes;
    ``write(path)`` writes it (a ``core.result.Result`` writer). ``config``: the config that made it
    (``auto`` hands back the chosen engine's). ``summary``: sidecar ``extra`` entries;
    ``metrics``: the handler's own (the reload check's ``parity``). ``specs``: the artifact's input
    specs when they differ from the model's; ``eval_batch``: the largest batch it runs at once;
    ``context()``: where it runs (the fx engine's kernels, the MHA fast path off).
    """

    model: Any
    format: str
    size: int
    write: Callable[[Path], dict[str, Any]]
    config: Any
    float_layers: dict[str, str]
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    specs: list[Any] | None = None
    eval_batch: int = 256
    context: Callable[[], contextlib.AbstractContextManager] = _no_context
