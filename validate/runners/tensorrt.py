"""TensorRT artifacts written by ``torch_tensorrt.save`` (an ExportedProgram with embedded engines,
or a TorchScript module), run on the GPU. As every CUDA runner (``TorchModuleRunner``): each batch
is moved to the device once, outputs come back to the host for the metrics, and the latency
benchmark times each call with CUDA events (``ptopt.core.timing.CudaEventTimer``). Needs
torch_tensorrt and CUDA; elsewhere a clean MissingDependencyError (exit 2). Never run on hardware
here (TensorRT cannot be installed on any machine this project reaches)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.core.errors import ModelLoadError, UsageError
from ptopt.core.features import require
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
        runner = cls.from_loaded(
            name, lm, f"TensorRT {_trt_version()} (torch_tensorrt)", sidecar_batch_range(lm)
        )
        runner.device = "cuda:0"
        # the engine keeps fp32 inputs whatever kernel precisions it enabled: no cast at the boundary
        runner.info["engine_precision"] = runner.precision
        return runner

    @property
    def input_dtype(self) -> Any:
        return None

    def place(self, device: str) -> None:
        """TensorRT engines run on the GPU they were built for: ``--device cuda[:N]`` only."""
        if not device.startswith("cuda"):
            raise UsageError(f"{self.name}: a TensorRT engine runs on a GPU: pass --device cuda")
        self.device = device


def _trt_version() -> str:
    from ptopt.core.system import package_version

    return package_version("tensorrt") or package_version("tensorrt-cu12") or "?"
