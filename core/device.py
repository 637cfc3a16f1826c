"""Devices: the one parser of ``--device cpu|cuda|cuda:N`` (validate, export, the trainer), and the
small helpers every stage uses to put a model and its inputs on a device.

``resolve_device(spec)`` turns what a user wrote into a ``torch.device`` or refuses it (UsageError,
exit 2) with what torch sees: CUDA asked for where ``torch.cuda.is_available()`` is False (and
whether this torch was built with CUDA at all, ``torch.version.cuda``), a GPU index that does not
exist, or a device string that is neither. ``cuda`` alone means the current CUDA device (index 0
unless the process chose another), always returned with its index.

Precision is a property of the artifact (``fp32``, ``fp16``, ``bf16``, ``int8``); :data:`HALF_DTYPES`
maps the half precisions to the torch dtype weights and floating-point inputs are cast to.
"""

from __future__ import annotations

from typing import Any

from ptopt.core.errors import UsageError

#: the device kinds ptopt runs models on
DEVICE_TYPES = ("cpu", "cuda")
#: precision name → the torch dtype name of weights and floating-point activations
HALF_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
_HINT = "use cpu, cuda or cuda:N"


def resolve_device(spec: Any = None, *, allow_auto: bool = True) -> Any:
    """``None``/``"cpu"`` → cpu; ``"cuda"``/``"cuda:N"`` → that GPU when it exists; ``"auto"`` (with
    ``allow_auto``) → cuda when available, else cpu. A ``torch.device`` is checked the same way.

    Raises UsageError naming the spec and what torch sees."""
    import torch

    if spec is None:
        return torch.device("cpu")
    text = str(spec).strip().lower()
    if text == "auto" and allow_auto:
        text = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = spec if isinstance(spec, torch.device) else torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"unknown device {spec!r} ({_HINT})") from None
    if device.type not in DEVICE_TYPES:
        raise UsageError(f"unknown device {spec!r}: ptopt runs models on cpu or cuda ({_HINT})")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(f"device {spec!r}: CUDA is not available here: {cuda_status()}; use --device cpu")
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= count:
        raise UsageError(
            f"device {spec!r}: no such GPU: torch sees {count} CUDA device(s) "
            f"({', '.join(f'cuda:{i}' for i in range(count))})"
        )
    return torch.device("cuda", index)


def cuda_status() -> str:
    """What torch sees of CUDA, in one clause: availability, how torch was built, the GPUs."""
    import torch

    built = (
        f"torch {torch.__version__} is built with CUDA {torch.version.cuda}"
        if torch.version.cuda
        else f"torch {torch.__version__} is built without CUDA (a CPU-only build)"
    )
    if not torch.cuda.is_available():
        return f"torch.cuda.is_available() is False ({built})"
    return f"torch sees {torch.cuda.device_count()} CUDA device(s) ({built})"


def is_cuda(device: Any) -> bool:
    return getattr(device, "type", str(device).split(":")[0]) == "cuda"


def half_dtype(precision: str | None) -> Any:
    """The torch dtype of a half precision (``fp16`` → float16, ``bf16`` → bfloat16); None otherwise."""
    import torch

    name = HALF_DTYPES.get(precision or "")
    return getattr(torch, name) if name else None


def half_specs(specs: Any, precision: str | None) -> list[Any]:
    """InputSpecs with their floating-point inputs in ``precision``'s half dtype (what a half-precision
    artifact takes); integer inputs (token ids, masks) and other precisions unchanged."""
    import dataclasses

    name = HALF_DTYPES.get(precision or "")
    return [dataclasses.replace(s, dtype=name) if name and s.is_float else s for s in specs]


def to_device(x: Any, device: Any = None, dtype: Any = None) -> Any:
    """A tensor, tuple/list or dict of tensors on ``device`` (None: where it is), its floating-point
    tensors cast to ``dtype`` (None: as they are). Integer inputs (token ids, masks) keep their dtype."""
    import torch

    if isinstance(x, dict):
        return {k: to_device(v, device, dtype) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(v, device, dtype) for v in x)
    if not isinstance(x, torch.Tensor):
        return x
    if dtype is not None and x.is_floating_point():
        x = x.to(dtype)
    return x if device is None else x.to(device, non_blocking=False)


def to_host(out: Any) -> Any:
    """Model outputs (tensor, or nested tuple/list/dict of tensors) on the CPU; floating-point ones as
    float32, so half-precision outputs compare with fp32 references on the host."""
    import torch

    if isinstance(out, dict):
        return {k: to_host(v) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(to_host(v) for v in out)
    if isinstance(out, torch.Tensor):
        t = out.detach().cpu()
        return t.float() if t.is_floating_point() and t.dtype != torch.float64 else t
    return out


def program_on(ep: Any, device: Any) -> Any:
    """An ExportedProgram with its weights, buffers and constants on ``device``
    (``torch.export.passes.move_to_device_pass``), so ``.module()`` runs there."""
    from torch.export.passes import move_to_device_pass

    return move_to_device_pass(ep, str(device))


class GpuPeakMemory:
    """Peak GPU memory allocated by torch on ``device`` while a block runs
    (``torch.cuda.reset_peak_memory_stats`` then ``torch.cuda.max_memory_allocated``), in MB.
    ``peak_mb`` stays None on a CPU device."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.peak_mb: float | None = None

    def __enter__(self) -> GpuPeakMemory:
        if is_cuda(self.device):
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        if is_cuda(self.device):
            import torch

            torch.cuda.synchronize(self.device)
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
