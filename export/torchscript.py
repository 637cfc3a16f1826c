"""TorchScript target: ``torch.jit.trace`` (default) or ``torch.jit.script``, frozen for inference.

Tracing records the ops run on one example (at the opt shape): data-dependent control flow is baked
in, which the tracer warns about. Those warnings go to the sidecar (``extra["trace_warnings"]``) and
the parity check at the min/opt/max shapes decides whether the trace holds. ``--script`` compiles
the Python source instead (control flow kept; not every Python construct is supported).
A TorchScript source (e.g. an int8 artifact from ``ptopt quantize``) is re-saved as it is, frozen.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import UnsupportedModelError
from ptopt.core.inputspec import InputSpec


def export_torchscript(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    path: Path,
    *,
    script: bool = False,
    source_format: str = "eager",
) -> dict:
    import torch

    notes: list[str] = []
    if source_format == "torchscript":
        sm, how = module, "re-saved TorchScript"
    elif script:
        sm, how = _script(module), "torch.jit.script"
    else:
        from ptopt.export.onnx import example_for_export

        sm, notes = _trace(module, example_for_export(specs, style), style)
        how = "torch.jit.trace"
    sm = sm.eval()
    frozen = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sm = torch.jit.freeze(sm)
            frozen = True
        except (RuntimeError, AttributeError) as e:
            # an already frozen archive has no attributes left to fold; keep it as it is
            notes.append(f"not frozen: {str(e).splitlines()[0][:200]}")
        torch.jit.save(sm, str(path))
    return {"files": [path.name], "method": how, "frozen": frozen, "trace_warnings": notes}


def _script(module: Any) -> Any:
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.jit.script(module)
    except Exception as e:  # noqa: BLE001 - the TorchScript compiler raises frontend errors of many kinds
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise UnsupportedModelError(
            f"torch.jit.script cannot compile {type(module).__name__}: {' '.join(lines[:2])[:300]}. "
            f"Export without --script (tracing) instead"
        ) from None


def _trace(module: Any, x: Any, style: str) -> tuple[Any, list[str]]:
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        try:
            with torch.inference_mode(False), torch.no_grad():
                if style == "keyword":
                    sm = torch.jit.trace(
                        module, example_kwarg_inputs=dict(x), check_trace=False, strict=False
                    )
                else:
                    args = x if isinstance(x, tuple) else (x,)
                    sm = torch.jit.trace(module, args, check_trace=False, strict=False)
        except Exception as e:  # noqa: BLE001
            raise UnsupportedModelError(
                f"torch.jit.trace cannot trace {type(module).__name__}: {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}; try --script"
            ) from None
    notes = sorted(
        {
            str(w.message).splitlines()[0][:200]
            for w in caught
            if issubclass(w.category, torch.jit.TracerWarning)
        }
    )
    return sm, notes
