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

from ptopt.core import progress
from ptopt.core.artifact import Artifact
from ptopt.core.atomic import output_lock, remove_stale_temps, staged_dir
from ptopt.core.errors import UsageError
from ptopt.core.outputs import check_outputs

#: ``writer(path)`` writes the artifact's file(s) at ``path`` (inside a staging folder, under the final
#: name) and returns facts to merge into the sidecar: any of ``files``, ``extra``, ``metrics``, ``outputs``.
Writer = Callable[[Path], "dict[str, Any] | None"]

_MERGED = ("extra", "metrics")
#: extra keys the template keeps over a writer's: the layer behind the output as read on the model a
#: stage started from (a quantized graph has lost an ``nn.Identity`` classifier the fp32 model shows)
_TEMPLATE_KEEPS = ("output_layer",)
_REPLACED = ("files", "outputs", "inputs", "input_style", "precision", "format")


class Result:
    """An in-memory stage result: ``.model`` runs here; ``.save(path)`` writes it (see module doc)."""

    def __init__(
        self,
        model: Any,
        template: Artifact,
        writer: Writer,
        *,
        inputs_paths: tuple = (),
        source: Any = None,
        folder: bool = False,
        suffixes: tuple[str, ...] | None = None,
    ):
        self.model = model
        #: the file suffixes ``save`` takes (None: the template format's, from the format table)
        self.suffixes = suffixes
        #: the artifact is a folder of files (``path`` names the folder; its sidecar sits beside it)
        self.folder = folder
        self.template = template
        #: the model this result was made from (a LoadedModel), kept in memory for the stages that need
        #: it: ONNX int8 export of an int8 result quantizes its fp32 source with ORT, without a reload
        self.source = source
        self.artifact: Artifact | None = None
        #: the search that chose this model, when one did (``ptopt.quantize(..., min_cosine=...)``)
        self.search: Any = None
        self._writer = writer
        #: files this result was made from; ``save`` never writes over one of them (or their companions)
        self._inputs_paths = tuple(Path(p) for p in inputs_paths if p is not None)

    def save(self, path: str | os.PathLike) -> Artifact:
        """Write the artifact and its sidecar at ``path``; returns the saved Artifact.

        Refused (UsageError, nothing written) when ``path`` or a companion of it is one of the files
        this result was made from (``ptopt.core.outputs.check_outputs``). Under the output's lock
        (one writer at a time, the last wins whole): left-over temps of a killed writer are removed,
        the files are written in a staging folder and hashed there, renamed into place, and the
        sidecar, which records their sha256, is written last (see ``ptopt.core.artifact``).
        """
        path = Path(path)
        old = check_folder_output(path, self.template.format) if self.folder else None
        if path.is_dir() and not self.folder:
            raise UsageError(f"output {path} is a folder; give a file name")
        check_outputs(self._inputs_paths, [path])  # first: overwriting an input is the graver mistake
        if not self.folder:
            check_suffix(path, self.template.format, self.suffixes)
        created = _missing_folders(path)
        with output_lock(path):
            remove_stale_temps(path)
            with staged_dir(path.parent) as stage, progress.step(_saving(path, self.folder), announce=False):
                art = self._described(path, self._writer(stage / path.name) or {})
                art.measure(stage)  # reads every file: a large LM's gzip size alone takes a minute
            art.write_sidecar()
            for name in set(old.files if old is not None else ()) - set(art.files):
                (path.parent / name).unlink(missing_ok=True)  # the previous artifact's, now unused
        self.artifact = art
        if created is not None:
            progress.note(f"created folder {created}/ for {path.name}")
        return art

    def _described(self, path: Path, facts: dict[str, Any]) -> Artifact:
        """The template at ``path`` with what the writer reported merged in."""
        art = dataclasses.replace(self.template, path=path)
        art.extra, art.metrics = dict(art.extra), dict(art.metrics)  # never the template's own dicts
        for key, value in facts.items():
            if key in _MERGED:
                setattr(art, key, {**getattr(art, key), **value})
            elif key in _REPLACED:
                setattr(art, key, value)
            else:
                raise KeyError(f"a writer returned an unknown sidecar field {key!r}")
        art.extra.update({k: self.template.extra[k] for k in _TEMPLATE_KEEPS if k in self.template.extra})
        return art

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        art = self.__dict__.get("artifact") or self.__dict__.get("template")
        if art is None:
            raise AttributeError(name)
        return getattr(art, name)

    @property
    def label(self) -> str:
        """How reports name an unsaved result: what it is and how it was made (``torchscript int8 static
        fx (in memory)``, ``hf_weight_only int4 weight-only rtn (in memory)``), not its module's class."""
        t, how = self.template, []
        for key in ("mode", "engine", "method"):
            value = (t.config or {}).get(key)
            if isinstance(value, str) and value not in how:
                how.append(value)
        return " ".join([t.format, t.precision, *how, "(in memory)"])

    def __repr__(self) -> str:
        where = f"saved at {self.artifact.path}" if self.artifact else "not saved"
        return f"Result({self.template.format}, {self.template.precision}, {where})"


def check_folder_output(path: Path, fmt: str) -> Artifact | None:
    """A folder artifact may replace only a folder that does not exist, is empty, or holds a previous
    ``fmt`` artifact (whose sidecar is returned: its files that the new one lacks are removed after
    the new files are in place); anything else is refused before any work."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"output {path} is a file; this artifact is a folder: give a folder name")
    if not path.is_dir() or not any(path.iterdir()):
        return None
    old = Artifact.maybe_load(path)
    if old is None or old.format != fmt:
        raise UsageError(
            f"output folder {path} is not empty and holds no earlier ptopt {fmt} artifact: "
            "give a new folder name (nothing is written over other files)"
        )
    return old


def check_suffix(path: Path, fmt: str, suffixes: tuple[str, ...] | None = None) -> None:
    """UsageError when ``path``'s suffix is not one its format is written with (an ONNX file named
    ``.pt`` is read as TorchScript by every tool after), naming the path to use."""
    from ptopt.core.formats import find_format, with_article

    row = find_format(fmt)
    allowed = suffixes if suffixes is not None else (row.suffixes if row is not None else ())
    if allowed and path.suffix.lower() not in allowed:
        label = row.label if row is not None else fmt
        raise UsageError(
            f"output {path}: {with_article(label)} file is named {' or '.join(allowed)}; "
            f"use {path.with_suffix(allowed[0])}"
        )


def _missing_folders(path: Path) -> Path | None:
    """The folder of ``path`` when it does not exist yet (saving creates it, and any missing above it),
    relative to the working folder where it is under it; None when it exists."""
    folder = path.absolute().parent
    if folder.exists():
        return None
    try:
        return folder.relative_to(Path.cwd())
    except ValueError:
        return folder


def _saving(path: Path, folder: bool) -> str:
    """The step a heartbeat names while an artifact is written and read back for its sidecar."""
    return f"saving {path.name}{'/' if folder else ''} (its files, their sha256 and gzip size)"
