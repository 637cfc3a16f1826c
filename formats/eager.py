"""Eager PyTorch modules: in-memory ``nn.Module`` objects and MODEL references (``zoo:resnet``,
``pkg.mod:factory [--weights W]``: format ``eager``), and whole pickled ``nn.Module`` files
(``torch.save(model)``: format ``pickle``, loaded only with ``allow_pickle`` because unpickling runs
code from the file). Run in eager mode, as a model is deployed behind a plain Python server."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, UnsafePickleError
from ptopt.formats.base import Format, loaded_model, zip_names
from ptopt.formats.runner import TorchModuleRunner

PICKLE_HINT = (
    "it holds a pickled nn.Module, and unpickling runs arbitrary code from the file. Pass "
    "--allow-pickle (allow_pickle=True) if you trust it, or save it as TorchScript, an ExportedProgram "
    "(.pt2), or a state_dict used with a factory: pkg.module:factory --weights FILE"
)


class Eager(Format):
    """A module in this process (no file): what every other format is checked against."""

    name = "eager"
    label = "eager PyTorch"
    loadable = False
    compilable = True

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        return TorchModuleRunner.from_loaded(name, loaded, "torch eager")


class Pickle(Eager):
    """``torch.save(model)``: a whole pickled module (legacy pickle or a zip holding ``data.pkl``).
    Sniffed last: a zip that is not TorchScript or an ExportedProgram."""

    name = "pickle"
    label = "pickled nn.Module"
    suffixes = (".pt", ".pth")
    loadable = True
    sniff_rank = 90

    def sniff(self, path: Path) -> bool:
        return bool(zip_names(path)) or is_legacy_torch_pickle(path)

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        import torch

        _refuse_plain_tensors(path)
        if not allow_pickle:
            raise UnsafePickleError(f"{path}: refusing to load: {PICKLE_HINT}")
        from ptopt.core.data import search_current_folder
        from ptopt.core.hf import ensure_torchvision_ops

        ensure_torchvision_ops()  # a pickled torchvision model imports torchvision (core.hf's docstring)
        search_current_folder()  # a pickled module names its classes' module (mymodels.Net), as python -c finds it
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except ModuleNotFoundError as e:
            raise ModelLoadError(
                f"{path}: cannot unpickle: the module {e.name!r} that defines its classes is not importable "
                "here (neither installed nor in the current folder): run ptopt in the folder that holds it, or "
                "put that folder on PYTHONPATH"
            ) from None
        except Exception as e:  # noqa: BLE001 - a missing class raises AttributeError...
            raise ModelLoadError(f"{path}: cannot unpickle: {type(e).__name__}: {e}") from None
        if not isinstance(obj, torch.nn.Module):
            raise ModelLoadError(f"{path}: holds a {type(obj).__name__}, not an nn.Module")
        from ptopt.core.input_infer import declared_inputs

        specs, style = declared_inputs(obj)
        return loaded_model(path, self.name, obj.eval(), path, art, specs=specs, style=style)

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        return TorchModuleRunner.from_loaded(name, loaded, "torch eager (pickled module)")


FORMATS = (Eager(), Pickle())


def is_legacy_torch_pickle(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
    except OSError:
        return False
    return head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")


def _refuse_plain_tensors(path: Path) -> None:
    """A file that holds only tensors (a state_dict) or no module is refused with what it is."""
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        return  # holds more than tensors: a pickled module (or something else)
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"{path}: not a PyTorch model file ({str(e).splitlines()[0]})") from None
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelLoadError(
            f"{path} is a state_dict (weights only, no architecture): load it with the model's factory, "
            f"e.g. `pkg.module:factory --weights {path}`"
        )
    raise ModelLoadError(f"{path}: holds a {type(obj).__name__}, not a model")
