"""TensorRT artifacts written by ``torch_tensorrt.save`` (an ExportedProgram with embedded engines,
or a TorchScript module), run on the GPU. Inputs are copied to the device and the output back, and
every timed call synchronizes: what a deployment pays. Needs torch_tensorrt and CUDA; elsewhere a
clean MissingDependencyError (exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.core.errors import ModelLoadError
from ptopt.core.features import require
from ptopt.core.inputspec import call_model
from ptopt.core.modelref import LoadedModel
from ptopt.validate.runners.base import TorchModuleRunner, sidecar_batch_range

FORMATS = ("tensorrt",)
SUFFIXES = (".ep", ".trt")


class TensorRTRunner(TorchModuleRunner):
    @classmethod
    def create(cls, name: str, path: Path, art: Artifact | None) -> TensorRTRunner:
        require("torch_tensorrt", f"validating the TensorRT artifact {name}")
        import torch
        import torch_tensorrt

        try:
            loaded = torch_tensorrt.load(str(path))
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(
                f"{name}: torch_tensorrt cannot load it: {str(e).strip().splitlines()[0][:300]}"
            ) from None
        module = (
            loaded.module()
            if hasattr(loaded, "module") and not isinstance(loaded, torch.nn.Module)
            else loaded
        )
        lm = LoadedModel(
            str(path),
            "tensorrt",
            module,
            path,
            art,
            list(art.inputs) if art else [],
            art.input_style if art else "positional",
        )
        return cls.from_loaded(
            name, lm, f"TensorRT {_trt_version()} (torch_tensorrt)", sidecar_batch_range(lm)
        )

    def _to_device(self, x: Any) -> Any:
        if isinstance(x, dict):
            return {k: v.cuda() for k, v in x.items()}
        if isinstance(x, (tuple, list)):
            return tuple(v.cuda() for v in x)
        return x.cuda()

    def call(self, x: Any) -> Any:
        return self.timed_call(x)()

    def timed_call(self, x: Any) -> Callable[[], Any]:
        import torch
        from torch.utils._pytree import tree_map

        module, to_device = self.module, self._to_device

        def run() -> Any:
            with torch.inference_mode():
                out = call_model(module, to_device(x))
            torch.cuda.synchronize()
            return tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, out)  # back to the host

        return run


def _trt_version() -> str:
    from ptopt.core.system import package_version

    return package_version("tensorrt") or package_version("tensorrt-cu12") or "?"
