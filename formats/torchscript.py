"""TorchScript archives (``.pt``): ``torch.jit.trace`` (or ``script``) + ``torch.jit.freeze``, loaded
with plain ``torch.jit.load`` and run by the TorchScript interpreter, as TorchServe or a C++ libtorch
server runs them.

Written by ``torch.jit.trace`` (default; on the example batch, else on the specs' opt shape) or
``torch.jit.script`` (``script=True``), then ``torch.jit.freeze``. A TorchScript source (an int8
archive) is saved again as it is, frozen when it can be. Tracer warnings (control flow baked in) go
to ``extra["trace_warnings"]``; the reload check decides whether the trace holds. Submodules that
store their own state once (``ptopt_self_serializing``: the int8 table of a tied embedding and output
layer) stay out of freezing, which would fold one copy per path into the graph. The profiling
executor optimizes after the first calls, which the latency warm-up absorbs.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError
from ptopt.formats.base import Format, loaded_model, zip_names
from ptopt.formats.runner import TorchModuleRunner, sidecar_batch_range


class TorchScript(Format):
    name = "torchscript"
    label = "TorchScript"
    suffixes = (".pt", ".ts", ".torchscript")
    target = "torchscript"
    converts = ("fp16", "bf16")
    servers = ("torchserve", "triton", "ray")
    triton_platform = "pytorch_libtorch"
    write_options = frozenset({"script", "freeze"})
    sniff_rank = 10
    target_order = 10

    def sniff(self, path: Path) -> bool:
        return is_torchscript(path)

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        import torch

        from ptopt.core.quiet import silenced

        try:
            # an int8 archive makes quantized tensors as it loads: torch's C++ deprecation warning
            with silenced((), native=True):
                module = torch.jit.load(str(path), map_location="cpu")
        except Exception as e:  # noqa: BLE001 - a corrupt archive raises many types
            raise ModelLoadError(f"{path}: corrupt TorchScript archive: {str(e).splitlines()[0]}") from None
        return loaded_model(path, self.name, module.eval(), path, art)

    def write(self, module: Any, path: Path, **kw: Any) -> dict[str, Any]:
        return write_torchscript(module, path, **kw)

    def reload(self, path: Path, *, style: str = "positional", device: str = "cpu", **kw: Any) -> Any:
        import torch

        return torch.jit.load(str(path), map_location=device).eval()

    def export_options(self, source: Any, config: Any, calib: Any, **kw: Any) -> tuple[dict, None]:
        return {"script": config.script}, None

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        return TorchScriptRunner.from_loaded(name, loaded, "torch.jit", sidecar_batch_range(loaded))


class TorchScriptRunner(TorchModuleRunner):
    """A TorchScript archive on a device: loaded again onto it (``map_location``). ``.to(device)`` does not
    move a frozen module's weights: freezing made them constants of the graph (seen on an H200: every fp16
    CUDA archive failed in the interpreter after ``.to``)."""

    def _move(self, device: str) -> Any:
        import torch

        if self.path is None:
            return self.module.to(device)
        return torch.jit.load(str(self.path), map_location=device).eval()


FORMAT = TorchScript()


def is_torchscript(path: Path) -> bool:
    """A zip archive holding TorchScript code (``constants.pkl`` or ``code/``)."""
    return any(n.endswith("/constants.pkl") or "/code/" in n for n in zip_names(path))


def write_torchscript(
    module: Any,
    path: Path,
    *,
    specs: Any,
    style: str,
    example: Any = None,
    source_format: str = "eager",
    script: bool = False,
    freeze: bool = True,
    device: str = "cpu",
    **_: Any,
) -> dict[str, Any]:
    import torch

    from ptopt.core.device import to_device
    from ptopt.formats import capture

    notes: list[str] = []
    if source_format == "torchscript":
        sm, how = module, "re-saved TorchScript"
    elif script:
        sm, how = capture.script(module), "torch.jit.script"
    else:
        x = example if example is not None else capture.example_for_export(specs, style)
        sm, notes = capture.trace(module, to_device(x, device), style, hint="; try --script")
        how = "torch.jit.trace"
    sm = sm.eval()
    frozen = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if freeze:  # freeze=False keeps the submodules and state_dict (e.g. a pruned model's weights)
                sm = torch.jit.freeze(sm, preserved_attrs=self_serializing(sm))
                frozen = True
        except (RuntimeError, AttributeError) as e:
            # an already frozen archive has no attributes left to fold; keep it as it is
            notes.append(f"not frozen: {str(e).splitlines()[0][:200]}")
        torch.jit.save(sm, str(path))
    return {"files": [path.name], "method": how, "frozen": frozen, "trace_warnings": notes}


def self_serializing(module: Any) -> list[str]:
    """Every path to a submodule of a TorchScript ``module`` that stores its own state once and says
    so with a ``ptopt_self_serializing`` method (the int8 table of a tied embedding and output layer,
    ``compress.quantize.tied``). Freezing keeps them as they are: folded, the table would be stored once
    per path. (torch's quantized modules have a ``__setstate__`` too, and must be frozen.)"""
    if not hasattr(getattr(module, "_c", None), "_has_method"):
        return []
    mods = module.named_modules(remove_duplicate=False)
    return [n for n, m in mods if n and m._c._has_method("ptopt_self_serializing")]
