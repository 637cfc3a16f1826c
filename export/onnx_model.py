"""An ONNX file in ONNX Runtime, callable like the PyTorch model it came from.

``OnnxModel(path)(x)`` takes torch tensors the way the source model does (positional, or keyword
by input name) and returns torch tensors: one output → a tensor, several → a tuple. It is what
``ptopt.export(model, "onnx").model`` is, so a notebook compares it with the source directly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ptopt.core.errors import ShapeMismatchError


class OnnxModel:
    """A callable over an ONNX Runtime CPU session (the file is read once, at construction)."""

    def __init__(self, path: str | os.PathLike, *, style: str = "positional", threads: int | None = None):
        import torch

        from ptopt.export.parity import onnx_session

        self.path = Path(path)
        self.style = style
        self.session = onnx_session(self.path, threads or torch.get_num_threads())
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        feed = self._feed(args, kwargs)
        outs = self.session.run(None, {n: t.detach().cpu().numpy() for n, t in feed.items()})
        tensors = tuple(torch.from_numpy(o) for o in outs)
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
