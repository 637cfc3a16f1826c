"""An ONNX file in ONNX Runtime, callable like the PyTorch model it came from.

``OnnxModel(path)(x)`` takes torch tensors the way the source model does (positional, or keyword
by input name) and returns torch tensors: one output → a tensor, several → a tuple. It is what
``ptopt.export(model, "onnx").model`` is, so a notebook compares it with the source directly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, ShapeMismatchError


def providers_for(device: str = "cpu") -> list[Any]:
    """ONNX Runtime providers for ``device``: the CPU provider; on ``cuda:N`` the CUDA provider on
    that GPU first. MissingDependencyError when this onnxruntime build has no CUDA provider."""
    if not str(device).startswith("cuda"):
        return ["CPUExecutionProvider"]
    import onnxruntime as ort

    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise MissingDependencyError(
            f"ONNX on {device} needs onnxruntime's CUDA provider, and this onnxruntime "
            f"{ort.__version__} has only {', '.join(available)}: pip install onnxruntime-gpu"
        )
    index = int(str(device).partition(":")[2] or 0)
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


def to_numpy(t: Any) -> Any:
    """A torch tensor as numpy; bfloat16 (which numpy lacks) as ``ml_dtypes.bfloat16``, the type
    ONNX Runtime takes for ``tensor(bfloat16)``."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def from_numpy_bf16(a: Any) -> Any:
    """An ORT output as an array torch can take (``ml_dtypes.bfloat16`` → float32)."""
    import numpy as np

    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


def onnx_session(
    path: str | os.PathLike,
    threads: int | None = None,
    providers: Sequence[Any] = ("CPUExecutionProvider",),
) -> Any:
    """An ONNX Runtime session over ``path``: ``threads`` intra-op threads (one inter-op), quiet logs."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=list(providers))


class OnnxModel:
    """A callable over an ONNX Runtime session (the file is read once, at construction): the CPU
    provider, or on ``device="cuda[:N]"`` the CUDA provider (MissingDependencyError when this
    onnxruntime build has none)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        style: str = "positional",
        threads: int | None = None,
        device: str = "cpu",
    ):
        import torch

        self.path = Path(path)
        self.style = style
        self.session = onnx_session(
            self.path, threads or torch.get_num_threads(), providers=providers_for(device)
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        feed = self._feed(args, kwargs)
        outs = self.session.run(None, {n: to_numpy(t) for n, t in feed.items()})
        tensors = tuple(torch.from_numpy(from_numpy_bf16(o)) for o in outs)
        return tensors[0] if len(tensors) == 1 else tensors

    def _feed(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Inputs by name (keywords), else in order (positionals)."""
        if kwargs and not args and set(kwargs) == set(self.input_names):
            return {n: kwargs[n] for n in self.input_names}
        given = list(args) + list(kwargs.values())
        if len(given) != len(self.input_names):
            raise ShapeMismatchError(
                f"the ONNX model takes {len(self.input_names)} input(s), got {len(given)}",
                expected=", ".join(self.input_names),
                got=", ".join(list(kwargs) or [f"{len(args)} positional"]),
            )
        return dict(zip(self.input_names, given, strict=False))

    def eval(self) -> OnnxModel:
        """For code that calls ``model.eval()`` on whatever it is given: an ORT session is always in
        inference mode."""
        return self

    def __repr__(self) -> str:
        return f"OnnxModel({self.path.name}, inputs={self.input_names}, outputs={self.output_names})"
