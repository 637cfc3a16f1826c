"""``torch.export`` ExportedPrograms (``.pt2``): captured with the InputSpecs' ``Dim``s, saved with
``torch.export.save``, loaded with plain ``torch.export.load(path).module()``, run on the CPU, or on a
GPU after ``torch.export.passes.move_to_device_pass`` (weights, buffers and constants moved).

A ``.pt2`` is either this or an AOTInductor package (``ptopt.formats.aoti``): the sidecar's
``format`` says which; without one the archive's contents decide (AOTInductor is sniffed first).
The accepted batch sizes are read from the program itself: a symbolic batch dimension ranges over
its range constraint, a concrete one is fixed (export without a ``Dim`` bakes the batch in).
"""

from __future__ import annotations

import importlib
import io
import re
import zipfile
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, UnsupportedModelError
from ptopt.formats.base import Format, loaded_model, zip_names
from ptopt.formats.runner import TorchModuleRunner, sidecar_batch_range


class ExportedProgram(Format):
    name = "exported_program"
    label = "ExportedProgram"
    suffixes = (".pt2",)
    target = "exported_program"
    converts = ("fp16", "bf16")
    servers = ("torchserve", "ray")
    compilable = True
    sniff_rank = 30
    target_order = 40

    def sniff(self, path: Path) -> bool:
        names = zip_names(path)
        return path.suffix.lower() != ".pt" and any(
            n.endswith("/serialized_exported_program.json") or "/models/" in n for n in names
        )

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        import torch

        from ptopt.core.safety import quiet_upstream

        _quantized_ops()
        missing = ensure_container_types(path)
        try:
            with quiet_upstream():  # torch logs a traceback before raising; ours is one line
                ep = torch.export.load(str(path))
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(
                f"{path}: not a loadable ExportedProgram: {str(e).splitlines()[0]}{unregistered_note(missing)}"
            ) from None
        specs, style = specs_from_program(ep)
        info = {"exported_program": ep}
        return loaded_model(path, self.name, ep.module(), path, art, specs=specs, style=style, info=info)

    def write(self, module: Any, path: Path, **kw: Any) -> dict[str, Any]:
        import torch

        from ptopt.formats.capture import export_program, fits_for_export, quiet_export

        if kw.get("source_format") == "torchscript":
            raise UnsupportedModelError(
                "a TorchScript model cannot go through torch.export; export the original nn.Module "
                "(pkg.module:factory --weights W, or zoo:NAME) to --target exported_program"
            )
        specs, example = kw["specs"], kw.get("example")
        x = example if example is not None and fits_for_export(specs, example) else None
        ep = export_program(module, specs, kw["style"], device=kw.get("device", "cpu"), example=x)
        ep.example_inputs = zero_example(ep.example_inputs)
        buf = (
            io.BytesIO()
        )  # torch.export.save insists on a .pt2 name; the caller's (temporary) path may differ
        with quiet_export():
            torch.export.save(ep, buf)
        path.write_bytes(buf.getvalue())
        return {
            "files": [path.name],
            "method": "torch.export.export (strict=False)",
            "example_inputs": EXAMPLE_NOTE,
        }

    def reload(self, path: Path, *, style: str = "positional", device: str = "cpu", **kw: Any) -> Any:
        import torch

        from ptopt.core.device import program_on

        _quantized_ops()
        ensure_container_types(path)
        # through a buffer: torch.export.load warns about a file not named .pt2 (a temporary one)
        ep = torch.export.load(io.BytesIO(path.read_bytes()))
        return program_on(ep, device).module()

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        ep = loaded.info.get("exported_program")
        batch_range = exported_batch_range(ep) or sidecar_batch_range(loaded)
        runner = ExportedProgramRunner.from_loaded(name, loaded, "torch.export", batch_range)
        runner.program = ep
        return runner


FORMAT = ExportedProgram()

#: what the program file keeps of the batch it was captured with (``ExportedProgram.example_inputs``)
EXAMPLE_NOTE = (
    "zeros of the captured inputs' shapes and dtypes at batch 1 (none of the data it was captured with)"
)


def zero_example(example: Any) -> Any:
    """``torch.export.save`` writes a program's ``example_inputs`` into the file: the batch it was
    captured with, which is the user's data (32 calibration images were half of a 38.6 MB file). The
    file keeps zeros of the same structure, dtypes and shapes at batch 1 instead: what tools that read
    ``example_inputs`` (``aoti_compile_and_package``) need, and no data."""
    import torch

    if example is None:
        return None
    args, kwargs = example

    def zero(t: Any) -> Any:
        return torch.zeros_like(t[:1] if t.dim() else t) if isinstance(t, torch.Tensor) else t

    return tuple(zero(a) for a in args), {k: zero(v) for k, v in kwargs.items()}


def _quantized_ops() -> None:
    """The quantize/dequantize ops a PT2E int8 program calls (``quantized_decomposed.*``), defined by
    this module of torch itself (no torchao needed, no deprecation warning on import)."""
    importlib.import_module("torch.ao.quantization.fx._decomposed")


#: a container class a saved pytree spec names (``"type": "transformers.modeling_outputs.X"``, JSON in JSON)
_SPEC_TYPE = re.compile(r'\\*"type\\*": \\*"([A-Za-z_]\w*(?:\.\w+)+)')


def container_types(text: str) -> set[str]:
    """The container classes (dotted names) that the pytree specs in ``text`` name."""
    return set(_SPEC_TYPE.findall(text))


def ensure_container_types(path: Path, texts: list[str] | None = None) -> list[str]:
    """A program whose inputs or outputs are a library's container class (a Hugging Face model returns
    a ``SequenceClassifierOutput``) reads back only once that class is registered with torch's pytree,
    which importing its module does; otherwise ``torch.export.load`` fails with "error when
    deserializing" and no cause. transformers' module of such a class (installed library code) is
    imported here; the classes still unregistered are returned, for the error to name (ptopt imports
    no other module a file names: that would run its code). ``texts``: the specs (default: the
    archive's ``models/*.json``)."""
    from torch.utils import _pytree as pytree

    if texts is None:
        texts = _model_jsons(path)
    known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
    missing = sorted({t for text in texts for t in container_types(text) if t not in known})
    ours = [t for t in missing if t.startswith("transformers.")]
    if ours:
        from ptopt.core.hf import import_transformers

        import_transformers()
        for module in sorted({t.rpartition(".")[0] for t in ours}):
            try:
                importlib.import_module(module)  # defining a ModelOutput class registers it
            except ImportError:
                pass  # left unregistered: named by the caller's error
    return [t for t in missing if t not in known]


def unregistered_note(missing: list[str]) -> str:
    """What a load failure says about the container classes no import registered (``""`` for none)."""
    if not missing:
        return ""
    return (
        f"; its inputs or outputs are {', '.join(missing)}, which torch reads back only once the module "
        "defining it is imported (it registers the class with torch.utils._pytree): import that module and "
        "load the file in Python (ptopt imports no module a file names)"
    )


def _model_jsons(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if "/models/" in n and n.endswith(".json")]
            return [z.read(n).decode("utf-8", "replace") for n in names]
    except (OSError, zipfile.BadZipFile):
        return []


class ExportedProgramRunner(TorchModuleRunner):
    program: Any = None

    def _move(self, device: str) -> Any:
        from ptopt.core.device import program_on

        if self.program is None:
            return super()._move(device)
        return program_on(self.program, device).module()

    def close(self) -> None:
        super().close()
        self.program = None


def specs_from_program(ep: Any) -> tuple[list[Any], str]:
    """Input specs of an ExportedProgram from its example inputs (batch left static)."""
    import torch

    from ptopt.core.inputspec import specs_from_example

    args, kwargs = getattr(ep, "example_inputs", None) or ((), {})
    if kwargs:
        tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        return specs_from_example(tensors, dynamic_batch=False), "keyword"
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if tensors:
        x = tensors[0] if len(tensors) == 1 else tuple(tensors)
        return specs_from_example(x, dynamic_batch=False), "positional"
    return [], "positional"


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
