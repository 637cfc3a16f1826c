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
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, UnsupportedModelError
from ptopt.core.inputspec import InputSpec
from ptopt.export.shapes import tensorrt_inputs, torch_export_dynamic_shapes

PRECISIONS = ("fp32", "fp16", "int8")
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
    import torch

    return {
        "fp32": {torch.float32},
        "fp16": {torch.float16, torch.float32},
        "int8": {torch.int8, torch.float32},
    }[precision]


def _modelopt_quantize(module: Any, calib: Any, style: str) -> Any:
    try:
        import modelopt.torch.quantization as mtq
    except ImportError:
        raise MissingDependencyError(
            "--target tensorrt --precision int8 needs NVIDIA ModelOpt to insert Q/DQ nodes: "
            "pip install nvidia-modelopt"
        ) from None
    from ptopt.core.inputspec import call_model

    def forward_loop(model: Any) -> None:
        for b in calib.batches(32):
            x = b.x
            x = (
                {k: v.cuda() for k, v in x.items()}
                if isinstance(x, dict)
                else (tuple(t.cuda() for t in x) if isinstance(x, tuple) else x.cuda())
            )
            call_model(model, x)

    return mtq.quantize(module, mtq.INT8_DEFAULT_CFG, forward_loop)


def export_tensorrt(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    *,
    precision: str = "fp32",
    calib: Any = None,
) -> dict:
    import torch
    import torch_tensorrt

    from ptopt.export.tracing import example_for_export, export_program

    check_available()
    module = module.cuda().eval()
    if precision == "int8":
        if calib is None:
            raise UnsupportedModelError("--target tensorrt --precision int8 needs --data for calibration")
        module = _modelopt_quantize(module, calib, style)
    with torch.no_grad():
        ep = export_program(module, specs, style, device="cuda")
        trt_inputs = tensorrt_inputs(specs)
        kw = (
            {"kwarg_inputs": dict(zip([s.name for s in specs], trt_inputs, strict=False))}
            if style == "keyword"
            else {"arg_inputs": trt_inputs}
        )
        try:
            trt = torch_tensorrt.dynamo.compile(
                ep, enabled_precisions=enabled_precisions(precision), min_block_size=1, **kw
            )
        except Exception as e:  # noqa: BLE001
            raise UnsupportedModelError(
                f"torch_tensorrt cannot compile the model: {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            ) from None
        # saving with the same Dims keeps the engine's dynamic profile in the reloaded program
        x = example_for_export(specs, style)
        dyn = torch_export_dynamic_shapes(specs, style)
        if style == "keyword":
            torch_tensorrt.save(
                trt,
                str(path),
                output_format="exported_program",
                kwarg_inputs={k: v.cuda() for k, v in x.items()},
                dynamic_shapes=dyn,
            )
        else:
            args = x if isinstance(x, tuple) else (x,)
            torch_tensorrt.save(
                trt,
                str(path),
                output_format="exported_program",
                arg_inputs=[a.cuda() for a in args],
                dynamic_shapes=dyn,
            )
    return {
        "files": [path.name],
        "method": "torch_tensorrt.dynamo.compile",
        "torch_tensorrt": torch_tensorrt.__version__,
        "enabled_precisions": sorted(map(str, enabled_precisions(precision))),
    }
