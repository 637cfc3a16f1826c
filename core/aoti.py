"""AOTInductor packages as files: telling one from an ExportedProgram ``.pt2``, reading its metadata
without loading it, refusing one built by another torch, and loading it.

A ``.pt2`` is either a ``torch.export`` ExportedProgram or an AOTInductor package (compiled native
code, ``data/aotinductor/`` in the archive). A ptopt sidecar says which (``format``:
``exported_program`` / ``aoti_package``); without one the archive's contents decide.

A package runs only on the torch that compiled it (the generated code calls torch's C++ ABI).
ptopt writes the torch version into the package's own metadata (:data:`VERSION_KEY`, see
``ptopt.export.aoti``) and into the sidecar; :func:`check_version` compares it with this torch
before any of the package's code is loaded. Loading a package runs its native code, so model
loaders ask for ``allow_pickle`` (trust in the file) first, as for a pickled module.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError

FORMAT = "aoti_package"
#: the package metadata key holding the torch version that built it
VERSION_KEY = "ptopt_torch_version"


def is_aoti_package(path: str | os.PathLike) -> bool:
    """Whether the zip at ``path`` is an AOTInductor package (holds ``data/aotinductor/``)."""
    try:
        with zipfile.ZipFile(path) as z:
            return any("/data/aotinductor/" in "/" + n for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def package_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The package's metadata (``AOTI_CPU_ISA``, ``AOTI_DEVICE_KEY``, ``ptopt_torch_version``...),
    read from the archive without loading its library; empty when it has none."""
    try:
        with zipfile.ZipFile(path) as z:
            for n in z.namelist():
                if n.endswith("wrapper_metadata.json"):
                    return {str(k): str(v) for k, v in json.loads(z.read(n)).items()}
    except (OSError, zipfile.BadZipFile, ValueError, AttributeError):
        pass
    return {}


def check_version(path: str | os.PathLike, recorded: str | None = None) -> None:
    """Refuse a package built by another torch: ModelLoadError naming both versions.

    ``recorded``: the sidecar's torch version, used when the package's metadata has none."""
    import torch

    built = package_metadata(path).get(VERSION_KEY) or recorded
    if built and built != torch.__version__:
        raise ModelLoadError(
            f"{Path(path).name}: AOTInductor package built by torch {built}, but this is torch "
            f"{torch.__version__}; a package runs only on the torch that compiled it: export it again "
            f"with this torch (ptopt export MODEL --target aoti)"
        )


def load_package(path: str | os.PathLike, recorded_version: str | None = None) -> Any:
    """The package loaded with ``torch._inductor.aoti_load_package`` (callable like its source, on
    the CPU), after :func:`check_version`."""
    import torch

    check_version(path, recorded_version)
    return torch._inductor.aoti_load_package(str(path))
