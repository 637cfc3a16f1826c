"""``torch.export`` ExportedPrograms (``.pt2``), run as ``ExportedProgram.module()`` on the CPU, or
on a GPU after ``torch.export.passes.move_to_device_pass`` (weights, buffers and constants moved).

The accepted batch sizes are read from the program itself: a symbolic batch dimension ranges over
its range constraint, a concrete one is fixed (export without a ``Dim`` bakes the batch in).
"""

from __future__ import annotations

from typing import Any

from ptopt.validate.runners.base import TorchModuleRunner, sidecar_batch_range

FORMATS = ("exported_program",)


class ExportedProgramRunner(TorchModuleRunner):
    program: Any = None

    @classmethod
    def create(cls, name: str, loaded: Any) -> ExportedProgramRunner:
        ep = loaded.info.get("exported_program")
        batch_range = exported_batch_range(ep)
        runner = cls.from_loaded(name, loaded, "torch.export", batch_range or sidecar_batch_range(loaded))
        runner.program = ep
        return runner

    def _move(self, device: str) -> Any:
        from ptopt.core.device import program_on

        if self.program is None:
            return super()._move(device)
        return program_on(self.program, device).module()

    def close(self) -> None:
        super().close()
        self.program = None


def exported_batch_range(ep: Any) -> tuple[int, int] | None:
    """(lo, hi) batch sizes of the first user input, or None when it can't be told."""
    if ep is None:
        return None
    try:
        user_inputs = set(ep.graph_signature.user_inputs)
        for node in ep.graph.nodes:
            if node.op != "placeholder" or node.name not in user_inputs:
                continue
            shape = getattr(node.meta.get("val"), "shape", None)
            if not shape:
                continue
            d0 = shape[0]
            if isinstance(d0, int):
                return (d0, d0)
            for sym, vr in ep.range_constraints.items():
                if str(sym) == str(d0):
                    upper = str(vr.upper)
                    hi = (1 << 31) if upper in ("oo", "int_oo") else int(vr.upper)
                    return (max(1, int(vr.lower)), hi)
            return None
    except Exception:  # noqa: BLE001 - private graph details vary across torch versions: fall back to probing
        return None
    return None
