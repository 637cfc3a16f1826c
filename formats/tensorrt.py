"""TensorRT target: torch_tensorrt's dynamo path with the specs' min/opt/max profile.

    ep  = torch.export.export(model, ..., dynamic_shapes=<Dims from the specs>)
    trt = torch_tensorrt.dynamo.compile(ep, arg_inputs=[Input(min_shape, opt_shape, max_shape)],
                                        enabled_precisions={...})
    torch_tensorrt.save(trt, OUT, arg_inputs=[...], dynamic_shapes=<the same Dims>)  # ExportedProgram

The saved file loads with ``torch.export.load(OUT).module()`` once ``torch_tensorrt`` is imported.
``--precision int8`` needs the model quantized with NVIDIA ModelOpt first (TensorRT's dynamo path
takes int8 from explicit Q/DQ nodes); calibration uses ``data``.

Written against the documented torch_tensorrt API (2.x); it cannot run where TensorRT, torch_tensorrt
or CUDA is missing: ``check_available`` then raises MissingDependencyError before anything is written.
**It has never run on hardware here**: TensorRT cannot be installed on any machine this project
reaches. What runs before ``torch_tensorrt.dynamo.compile`` (the ExportedProgram it gets, the Input
profiles, the precision sets, the save arguments) is tested on the CPU with a stand-in
``torch_tensorrt`` module (tests/export/test_tensorrt_fake.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, ModelLoadError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec
from ptopt.formats.base import Format, loaded_model
from ptopt.formats.runner import TorchModuleRunner, sidecar_batch_range
from ptopt.formats.shapes import tensorrt_inputs, torch_export_dynamic_shapes

INSTALL_HINT = "pip install 'ptopt[tensorrt]' on a machine with an NVIDIA GPU and CUDA"


def check_available() -> None:
    """Raise MissingDependencyError naming what is missing (torch_tensorrt, TensorRT or CUDA)."""
    from ptopt.core.features import check_tensorrt

    f = check_tensorrt()
    if not f.available:
        raise MissingDependencyError(
            f"--target tensorrt needs torch_tensorrt, TensorRT and CUDA: {f.detail}. To fix: {INSTALL_HINT}"
        )


def enabled_precisions(precision: str) -> set:
    """The kernel precisions TensorRT may choose from for ``--precision`` (fp32 always among them:
    layers without a faster kernel, and the engine's inputs and outputs, stay fp32)."""
    import torch

    return {
        "fp32": {torch.float32},
        "fp16": {torch.float16, torch.float32},
        "bf16": {torch.bfloat16, torch.float32},
        "int8": {torch.int8, torch.float32},
    }[precision]


def _modelopt_quantize(module: Any, calib: Any, style: str, device: str = "cuda") -> Any:
    try:
        import modelopt.torch.quantization as mtq
    except ImportError:
        raise MissingDependencyError(
            "--target tensorrt --precision int8 needs NVIDIA ModelOpt to insert Q/DQ nodes: "
            "pip install nvidia-modelopt"
        ) from None
    from ptopt.core.device import to_device
    from ptopt.core.inputspec import call_model

    def forward_loop(model: Any) -> None:
        for b in calib.batches(32):
            call_model(model, to_device(b.x, device))

    return mtq.quantize(module, mtq.INT8_DEFAULT_CFG, forward_loop)


class TensorRT(Format):
    name = "tensorrt"
    label = "TensorRT"
    suffixes = (".ep", ".trt")
    target = "tensorrt"
    runtime = "tensorrt"
    converts = ("fp16", "bf16", "int8")
    devices = ("cuda",)
    half_weights = False
    reexportable = False
    write_options = frozenset({"calib"})
    packages = ("torch-tensorrt", "tensorrt")
    isa_libraries = ("gpu",)
    sniff_rank = 2
    target_order = 30

    def sniff(self, path: Path) -> bool:
        return path.suffix.lower() in self.suffixes

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        from ptopt.core.features import require

        require("torch_tensorrt", f"loading the TensorRT artifact {path.name}")
        import torch
        import torch_tensorrt

        try:
            loaded = torch_tensorrt.load(str(path))
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(
                f"{path.name}: torch_tensorrt cannot load it: {str(e).strip().splitlines()[0][:300]}"
            ) from None
        is_program = hasattr(loaded, "module") and not isinstance(loaded, torch.nn.Module)
        return loaded_model(path, self.name, loaded.module() if is_program else loaded, path, art)

    def write(self, module: Any, path: Path, **kw: Any) -> dict[str, Any]:
        return export_tensorrt(module, path, **kw)

    def reload(self, path: Path, *, style: str = "positional", device: str = "cpu", **kw: Any) -> Any:
        import torch
        import torch_tensorrt  # noqa: F401 - registers the TensorRT runtime ops the program calls

        return torch.export.load(str(path)).module()

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        runner = TensorRTRunner.from_loaded(
            name, loaded, f"TensorRT {_trt_version()} (torch_tensorrt)", sidecar_batch_range(loaded)
        )
        runner.device = "cuda:0"
        # the engine keeps fp32 inputs whatever kernel precisions it enabled: no cast at the boundary
        runner.info["engine_precision"] = runner.precision
        return runner

    def check_config(self, config: Any) -> None:
        if config.device is not None and not config.on_cuda:
            raise UsageError(f"--device {config.device} is not available for --target tensorrt")

    def check_available(self, config: Any) -> None:
        check_available()

    def export_options(self, source: Any, config: Any, calib: Any, **kw: Any) -> tuple[dict, None]:
        return {"calib": calib}, None


FORMAT = TensorRT()


class TensorRTRunner(TorchModuleRunner):
    """A ``torch_tensorrt.save`` artifact (an ExportedProgram with embedded engines, or a TorchScript
    module) run on the GPU: each batch moved to the device once, outputs back on the host, timed with
    CUDA events. Never run on hardware here."""

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


def export_tensorrt(
    module: Any,
    path: Path,
    *,
    specs: Sequence[InputSpec],
    style: str,
    precision: str = "fp32",
    calib: Any = None,
    device: str = "cuda",
    **_: Any,
) -> dict:
    """Compile ``module`` into a TensorRT engine embedded in an ExportedProgram at ``path``:
    ``torch.export`` on ``device`` with the specs' Dims, ``torch_tensorrt.dynamo.compile`` with one
    ``Input(min_shape, opt_shape, max_shape)`` per spec and :func:`enabled_precisions`, then
    ``torch_tensorrt.save`` with the same Dims (the engine's dynamic profile survives the reload)."""
    import torch
    import torch_tensorrt

    from ptopt.formats.capture import export_program

    check_available()
    module = module.to(device).eval()
    if precision == "int8":
        if calib is None:
            raise UnsupportedModelError("--target tensorrt --precision int8 needs --data for calibration")
        module = _modelopt_quantize(module, calib, style, device)
    with torch.no_grad():
        ep = export_program(module, specs, style, device=device)
        try:
            trt = torch_tensorrt.dynamo.compile(ep, **compile_kwargs(specs, style, precision))
        except Exception as e:  # noqa: BLE001
            raise UnsupportedModelError(
                f"torch_tensorrt cannot compile the model: {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            ) from None
        torch_tensorrt.save(trt, str(path), **save_kwargs(specs, style, device))
    return {
        "files": [path.name],
        "method": "torch_tensorrt.dynamo.compile",
        "torch_tensorrt": getattr(torch_tensorrt, "__version__", "?"),
        "enabled_precisions": sorted(map(str, enabled_precisions(precision))),
    }


def compile_kwargs(specs: Sequence[InputSpec], style: str, precision: str) -> dict[str, Any]:
    """``torch_tensorrt.dynamo.compile``'s keyword arguments: the Input profiles (``arg_inputs``, or
    ``kwarg_inputs`` by name for a keyword model), the enabled precisions, ``min_block_size=1``."""
    trt_inputs = tensorrt_inputs(specs)
    if style == "keyword":
        where: dict[str, Any] = {"kwarg_inputs": dict(zip([s.name for s in specs], trt_inputs, strict=True))}
    else:
        where = {"arg_inputs": trt_inputs}
    return {"enabled_precisions": enabled_precisions(precision), "min_block_size": 1, **where}


def save_kwargs(specs: Sequence[InputSpec], style: str, device: str) -> dict[str, Any]:
    """``torch_tensorrt.save``'s keyword arguments: an ExportedProgram, example inputs on ``device``
    at the export shape, and the same Dims as the export (else the reload fixes the batch)."""
    from ptopt.core.device import to_device
    from ptopt.formats.capture import example_for_export

    x = to_device(example_for_export(specs, style), device)
    dyn = torch_export_dynamic_shapes(specs, style)
    if style == "keyword":
        inputs: dict[str, Any] = {"kwarg_inputs": dict(x)}
    else:
        inputs = {"arg_inputs": list(x) if isinstance(x, tuple) else [x]}
    return {"output_format": "exported_program", **inputs, "dynamic_shapes": dyn}
