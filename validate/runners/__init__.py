"""One runner per artifact format, each running the artifact the way it is deployed.

``open_runner(ref)`` picks the runner from the artifact's sidecar format, else from the file type
(``ptopt.core.modelref.load_model`` tells TorchScript, ExportedProgram, ONNX and pickled modules
apart); MODEL references (``zoo:NAME``, ``pkg.mod:factory``) and ``nn.Module`` objects run eagerly.

| format | runner | runtime |
| --- | --- | --- |
| eager, pickle | ``eager.EagerRunner`` | torch eager |
| torchscript | ``torchscript.TorchScriptRunner`` | torch.jit |
| exported_program | ``exported_program.ExportedProgramRunner`` | torch.export |
| aoti_package | ``aoti.AotiRunner`` | AOTInductor (compiled package) |
| onnx | ``onnxruntime.OnnxRuntimeRunner`` | ONNX Runtime (CPU; CUDA/TensorRT providers when present) |
| tensorrt | ``tensorrt.TensorRTRunner`` | TensorRT through torch_tensorrt (CUDA) |

``validate --compile`` adds ``compiled.CompiledRunner`` rows: an eager / ExportedProgram model behind
``torch.compile`` (a ``compiled.CompiledRef`` wraps the reference it opens).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.core.errors import ModelLoadError, PtoptError
from ptopt.validate.runners.base import ArtifactRunError, Runner, primary_output

__all__ = ["ArtifactRunError", "Runner", "open_runner", "primary_output", "NOT_RUNNABLE"]

#: sidecar formats that are packages or weights, not something a runtime executes
NOT_RUNNABLE = {
    "mar": "a TorchServe .mar package; validate the artifact it packages",
    "triton": "a Triton model repository; validate the artifact it packages",
    "state_dict": "weights only; validate pkg.module:factory --weights FILE instead",
}


def open_runner(
    ref: Any,
    name: str | None = None,
    *,
    weights: Any = None,
    allow_pickle: bool = False,
    providers: Sequence[str] | None = None,
) -> Runner:
    """Load ``ref`` (a path, MODEL reference, nn.Module or LoadedModel) into the runner for its format."""
    from ptopt.core.modelref import LoadedModel, as_loaded
    from ptopt.validate.runners.compiled import CompiledRef

    name = name or display_name(ref)
    if isinstance(ref, CompiledRef):
        return _open_compiled(ref, name, weights=weights, allow_pickle=allow_pickle)
    path = None if isinstance(ref, LoadedModel) or not isinstance(ref, (str, Path)) else Path(str(ref))
    if path is not None and path.exists() and path.is_file():
        try:
            art = Artifact.maybe_load(path)
        except PtoptError as e:
            raise ModelLoadError(f"{name}: {e}") from None
        fmt = art.format if art else None
        if fmt in NOT_RUNNABLE:
            raise ModelLoadError(f"{name}: cannot be run: it is {NOT_RUNNABLE[fmt]}")
        from ptopt.validate.runners import tensorrt

        if fmt in tensorrt.FORMATS or (fmt is None and path.suffix.lower() in tensorrt.SUFFIXES):
            return tensorrt.TensorRTRunner.create(name, path, art)
    try:
        loaded = as_loaded(ref, weights=weights, allow_pickle=allow_pickle)
    except PtoptError as e:
        msg = str(e)
        raise type(e)(msg if name in msg else f"{name}: {msg}") from None
    return runner_for_loaded(name, loaded, providers=providers)


def _open_compiled(ref: Any, name: str, **options: Any) -> Runner:
    from ptopt.validate.runners.compiled import FORMATS, CompiledRunner

    base = open_runner(ref.base, name, **options)
    if base.format not in FORMATS:
        base.close()
        raise ModelLoadError(
            f"{name}: torch.compile takes eager and ExportedProgram models, not {base.format}"
        )
    return CompiledRunner.wrap(base, name)


def runner_for_loaded(name: str, loaded: Any, providers: Sequence[str] | None = None) -> Runner:
    from ptopt.validate.runners import eager, exported_program, onnxruntime, torchscript

    fmt = loaded.format
    if fmt in eager.FORMATS:
        return eager.EagerRunner.create(name, loaded)
    if fmt in torchscript.FORMATS:
        return torchscript.TorchScriptRunner.create(name, loaded)
    if fmt in exported_program.FORMATS:
        return exported_program.ExportedProgramRunner.create(name, loaded)
    if fmt in onnxruntime.FORMATS:
        return onnxruntime.OnnxRuntimeRunner.create(name, loaded, providers=providers)
    from ptopt.validate.runners import aoti

    if fmt in aoti.FORMATS:
        return aoti.AotiRunner.create(name, loaded)
    raise ModelLoadError(f"{name}: no runner for format {fmt!r}")


def display_name(ref: Any) -> str:
    """How an artifact is named in reports: its file name, the reference text, or the module's class."""
    import torch

    if isinstance(ref, torch.nn.Module):
        return type(ref).__name__
    text = str(getattr(ref, "ref", ref))
    p = Path(text)
    return p.name if p.exists() else text
