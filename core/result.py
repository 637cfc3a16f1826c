"""What every stage function returns: a model that runs in this process, and a way to save it.

``ptopt.quantize``, ``ptopt.prune``, ``ptopt.distill`` and ``ptopt.export`` all return a
:class:`Result`::

    res = ptopt.quantize(model, "static", calib_data=x)
    res.model(x)                  # an nn.Module, ScriptModule or a callable over an ORT session
    res.metrics                   # what the stage measured (accuracy, sizes...), before any save
    art = res.save("m.int8.pt")   # the file(s) and the sidecar, atomically; returns the Artifact
    res.path, res.sha256          # after save: the saved Artifact's fields

``output=`` on a stage function is a shortcut for "and save it there". Before a save, attribute
access falls through to the artifact *template* (format, precision, config, metrics, extra, inputs);
after it, to the saved :class:`~ptopt.core.artifact.Artifact`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact, staged_dir
from ptopt.core.errors import UsageError

#: ``writer(path)`` writes the artifact's file(s) at ``path`` (inside a staging folder, under the final
#: name) and returns facts to merge into the sidecar: any of ``files``, ``extra``, ``metrics``, ``outputs``.
Writer = Callable[[Path], "dict[str, Any] | None"]

_MERGED = ("extra", "metrics")
_REPLACED = ("files", "outputs", "inputs", "input_style", "precision", "format")


class Result:
    """An in-memory stage result: ``.model`` runs here; ``.save(path)`` writes it (see module doc)."""

    def __init__(self, model: Any, template: Artifact, writer: Writer, *, inputs_paths: tuple = ()):
        self.model = model
        self.template = template
        self.artifact: Artifact | None = None
        self._writer = writer
        #: files this result was made from; ``save`` never writes over one of them
        self._inputs_paths = tuple(Path(p) for p in inputs_paths if p is not None)

    def save(self, path: str | os.PathLike) -> Artifact:
        """Write the artifact and its sidecar at ``path`` (atomically); returns the saved Artifact."""
        path = Path(path)
        if path.is_dir():
            raise UsageError(f"output {path} is a folder; give a file name")
        for src in self._inputs_paths:
            if src.exists() and path.exists() and os.path.samefile(src, path):
                raise UsageError(f"output {path} is an input of this command; choose another file name")
        with staged_dir(path.parent) as stage:
            facts = self._writer(stage / path.name) or {}
        art = dataclasses.replace(self.template, path=path)
        for key, value in facts.items():
            if key in _MERGED:
                setattr(art, key, {**getattr(art, key), **value})
            elif key in _REPLACED:
                setattr(art, key, value)
            else:
                raise KeyError(f"a writer returned an unknown sidecar field {key!r}")
        self.artifact = art.finalize()
        return self.artifact

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        art = self.__dict__.get("artifact") or self.__dict__.get("template")
        if art is None:
            raise AttributeError(name)
        return getattr(art, name)

    def __repr__(self) -> str:
        where = f"saved at {self.artifact.path}" if self.artifact else "not saved"
        return f"Result({self.template.format}, {self.template.precision}, {where})"
