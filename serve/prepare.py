"""What a server packages: the model file of an artifact (as it is, in a format the server runs, or
exported to TorchScript first), its input specs and sidecar; and the model name it is served under.
Shared by every packaging format (``serve.package``: .mar, Triton; ``serve.ray_package``: Ray Serve)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptopt.core.artifact import SIDECAR_SUFFIX, Artifact, sha256_file, sidecar_path
from ptopt.core.errors import MissingDependencyError, ModelLoadError, UsageError
from ptopt.core.formats import file_suffixes, formats, get_format
from ptopt.core.inputspec import InputSpec

if TYPE_CHECKING:
    from ptopt.core.modelref import LoadedModel

#: ``package --format`` -> the server it packages for (a format row's ``servers`` say which run it as it is)
SERVER = {"mar": "torchserve", "triton": "triton", "ray": "ray"}
PACKAGE_LABELS = {"mar": "a TorchServe .mar", "triton": "a Triton repository", "ray": "a Ray Serve folder"}


@dataclasses.dataclass
class Prepared:
    """The model file to package plus what the handler needs to know about it."""

    path: Path
    format: str
    precision: str
    inputs: list[InputSpec]
    input_style: str
    files: list[Path]
    parent: dict[str, Any] | None
    sidecar: dict[str, Any]


def model_name_for(output: str | os.PathLike) -> str:
    """A TorchServe/Triton model name from the output file name: letters, digits, ``_`` and ``-``."""
    stem = Path(output).name
    for suffix in (".mar", ".ptopt.json"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", stem).strip("_-") or "model"
    return name if name[0].isalpha() else f"m_{name}"


def _checked_model_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
        raise UsageError(f"model name {name!r}: use letters, digits, '_' and '-', starting with a letter")
    return name


def default_name(artifact: Any) -> str:
    """A model name's stem from a MODEL reference: the file name up to its first dot, a factory's name."""
    text = str(artifact)
    if ":" in text and not Path(text).exists():
        text = text.rsplit(":", 1)[1]
    return Path(text).name.split(".")[0] or "model"


def named_artifacts(items: Any) -> list[tuple[str | None, Any]]:
    """``(model name or None, artifact)`` per item of ``ptopt serve``: ``NAME=PATH`` names its model
    (``bert_int8=bert.int8.pt``, as TorchServe's ``--models NAME=FILE``; an existing path is never split);
    a mapping is ``{NAME: PATH}``. A name holds letters, digits, ``_`` and ``-``, starting with a letter:
    what TorchServe (``[A-Za-z0-9][A-Za-z0-9_.-]*``), Ray Serve (no ``#``), Triton (a folder name) and an
    Open Inference Protocol URL (``/v2/models/NAME``) all take."""
    if isinstance(items, Mapping):
        return [(_checked_model_name(str(n)), a) for n, a in items.items()]
    out = []
    for a in [items] if isinstance(items, (str, os.PathLike)) else list(items):
        name, sep, path = str(a).partition("=")
        if sep and path and not Path(str(a)).exists():
            out.append((_checked_model_name(name), path))
        else:
            out.append((None, a))
    return out


def serve_names(items: Any) -> list[tuple[str, Any]]:
    """``(model name, artifact)`` per artifact served together: the name given (``NAME=PATH``), else the
    file name up to its first dot (``bert.int8.pt``: ``bert``), else where two of those meet, the file name
    without its format's suffix (``bert_int8``, beside ``bert.onnx``'s ``bert``). Two that still meet
    are refused, naming the way out."""
    named = named_artifacts(items)
    short = [n or model_name_for(default_name(a)) for n, a in named]
    out = []
    for (given, a), name in zip(named, short, strict=True):
        if not given and short.count(name) > 1:
            name = _checked_model_name(model_name_for(_full_stem(a)))
        out.append((_checked_model_name(name), a))
    seen: dict[str, Any] = {}
    for name, a in out:
        if name in seen:
            raise UsageError(
                f"two artifacts would be served as the same model name {name!r} ({seen[name]} and {a}); name "
                f"each model: ptopt serve NAME=PATH ..., e.g. {name}_1={seen[name]} {name}_2={a}"
            )
        seen[name] = a
    return out


def _full_stem(artifact: Any) -> str:
    """A file name without its format's suffix (``bert.int8.pt``: ``bert.int8``); a factory's name."""
    text = str(artifact)
    if ":" in text and not Path(text).exists():
        return text.rsplit(":", 1)[1] or "model"
    name = Path(text).name
    for suffix in sorted((*file_suffixes(), ".mar"), key=len, reverse=True):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name or "model"


def prepare(
    artifact: Any,
    tmp: Path,
    *,
    input_shapes: Sequence = (),
    weights: Any = None,
    allow_pickle: bool = False,
    package: str = "mar",
) -> Prepared:
    """The servable model file for ``artifact``, with a sidecar dict for it.

    A file in one of the formats the ``package``'s server runs (``servable_formats``) is used as is
    (its sidecar, or ``input_shapes``, or for ONNX the graph's inputs say what it takes); any other
    MODEL is exported to TorchScript into ``tmp`` first.
    """
    from ptopt.core.modelref import as_loaded, resolve_inputs

    if isinstance(artifact, Artifact):
        artifact = artifact.path
    _refuse_missing_file(artifact)
    loaded = as_loaded(artifact, weights=weights, allow_pickle=allow_pickle)
    _refuse_text_model(loaded)
    if input_shapes:
        resolve_inputs(loaded, input_shapes=input_shapes)
    if loaded.format in servable_formats(package) and loaded.path:
        return _prepare_servable(loaded)
    _refuse_unservable(loaded, package)
    return _prepare_by_export(loaded, tmp)


def servable_formats(format: str) -> list[str]:
    """The artifact formats the server of ``--format`` runs as they are (the rest become TorchScript)."""
    return [f.name for f in formats() if SERVER[format] in f.servers]


def _refuse_text_model(loaded: LoadedModel) -> None:
    """A language-model folder generates text: Ray Serve serves it; a .mar or a Triton repository holds
    tensor models (it asked for an image's --input-shape before)."""
    from ptopt.core.formats import find_format

    row = find_format(loaded.format)
    if row is not None and row.generates_text:
        raise UsageError(
            f"{loaded.ref} is a language-model folder ({row.name}): Ray Serve serves it as text "
            "(ptopt serve FOLDER, or ptopt package FOLDER --format ray); .mar and Triton packages hold tensor models"
        )


def _refuse_unservable(loaded: LoadedModel, package: str) -> None:
    """A file of a runtime this server does not run, which no export turns into TorchScript (an
    OpenVINO IR for Triton): the packages that take it, and the model to give instead."""
    from ptopt.core.formats import find_format, with_article

    row = find_format(loaded.format)
    if row is None or row.reexportable:
        return
    takes = [f"--format {p}" for p, server in SERVER.items() if server in row.servers]
    made = ((loaded.artifact.parent if loaded.artifact else None) or {}).get("path")
    instead = f"package the PyTorch model it was made from ({made or 'MODEL'})"
    raise UsageError(
        f"{loaded.ref}: {PACKAGE_LABELS.get(package, 'this package')} does not take {with_article(row.label)}"
        + (f"; package it with {' or '.join(takes)}, or {instead}" if takes else f"; {instead}")
    )


def _refuse_missing_file(artifact: Any) -> None:
    """What looks like a file name and is not there: say so, rather than "cannot import" a factory."""
    if (
        isinstance(artifact, (str, os.PathLike))
        and not str(artifact).startswith(
            "hf:"
        )  # a Hugging Face folder's reference: its loader says what is missing
        and not Path(artifact).exists()
        and (str(artifact).endswith((*file_suffixes(), ".mar")) or os.sep in str(artifact))
    ):
        raise ModelLoadError(f"artifact {artifact}: no such file")


def no_sidecar(path: Path, ref: Any, then: str) -> str:
    """Why ``path`` has no sidecar to read, as ``ptopt inspect`` says it (none next to it; one that
    describes other files, as a renamed copy's does: it names the file it was written for; unreadable),
    then ``then`` (what that leaves unknown)."""
    status = Artifact.sidecar_status(path)
    if status.state == status.MISSING:
        return f"{ref}: no sidecar ({sidecar_path(path).name}) and {then}"
    why = status.reason
    try:
        meta = json.loads(sidecar_path(path).read_text(encoding="utf-8"))
        named = [n for n, d in (meta.get("hashes") or {}).items() if d == meta.get("sha256")]
        if named and named[0] != path.name and meta.get("sha256") == sha256_file(path):
            why += (
                f"; it was written for {named[0]}, which {path.name} is a renamed copy of (a sidecar names the "
                f"files it describes: keep the name {named[0]}, with {named[0]}{SIDECAR_SUFFIX})"
            )
    except (OSError, ValueError, AttributeError):
        pass
    why += f"; {then}"
    return why


def _prepare_servable(loaded: LoadedModel) -> Prepared:
    """A model file served as is, with all its files (ONNX external data too)."""
    if not loaded.input_specs:
        raise ModelLoadError(
            no_sidecar(
                loaded.path,
                loaded.ref,
                "no way to tell its input shape; pass --input-shape, e.g. --input-shape 1x3x224x224 (the first "
                "dimension is the batch)",
            )
        )
    art = loaded.artifact
    side = art.to_dict() if art is not None else {}
    files = art.file_paths if art is not None else [loaded.path]
    files += [f for f in get_format(loaded.format).files(loaded.path) if f not in files]  # ONNX's .data
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ModelLoadError(f"{loaded.ref}: file(s) of the artifact are missing: {', '.join(missing)}")
    side.update(
        format=loaded.format,
        inputs=[s.to_dict() for s in loaded.input_specs],
        input_style=loaded.input_style,
        path=loaded.path.name,
        files=[f.name for f in files],
    )
    side.setdefault("precision", "fp32")
    return Prepared(
        loaded.path,
        loaded.format,
        side["precision"],
        list(loaded.input_specs),
        loaded.input_style,
        files,
        loaded.parent_record(),
        side,
    )


def _prepare_by_export(loaded: LoadedModel, tmp: Path) -> Prepared:
    """Any other MODEL: exported to TorchScript into ``tmp`` by the export stage first (its inputs: those
    it declares or implies, a Hugging Face model's from its config; else the refusal names a shape built
    from its first layer)."""
    from ptopt.core.modelref import require_input_specs

    require_input_specs(loaded, data_hint="--input-shape (the inputs a request sends)")
    try:
        from ptopt.export.api import export
    except ImportError:
        raise MissingDependencyError(
            f"{loaded.ref} is a {loaded.format} model: packaging it needs ptopt.export to make TorchScript first, "
            "which is not available in this install; run `ptopt export MODEL --target torchscript -o model.pt` "
            "and package model.pt"
        ) from None
    out = tmp / "export" / "model.pt"
    out.parent.mkdir(parents=True, exist_ok=True)
    art = export(loaded, "torchscript", out)
    art = Artifact.load(art.path) if not art.inputs else art
    return Prepared(
        art.path,
        art.format,
        art.precision,
        list(art.inputs),
        art.input_style,
        art.file_paths,
        art.parent or loaded.parent_record(),
        art.to_dict(),
    )
