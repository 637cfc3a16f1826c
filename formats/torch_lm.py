"""ExportedProgram and AOTInductor language-model folders (``exported_program_lm``, ``aoti_lm``): what
``ptopt export hf:DIR --target exported_program|aoti`` writes for a causal LM.

``model.pt2`` is the decoder step with its KV cache as explicit inputs and outputs
(``ptopt.formats.lm_graph``: ``(input_ids, attention_mask, position_ids, *past) -> (logits, *present)``,
past and present in layer order, key then value), captured by ``torch.export`` with dynamic batch,
sequence and past dimensions. ``exported_program``: ``torch.export.save`` of that program, loaded with
``torch.export.load("model.pt2").module()``; ``aoti``: the same program compiled by AOTInductor (freezing
on) into native code for this CPU and this torch, loaded with ``torch._inductor.aoti_load_package`` (only
with ``--allow-pickle``: its native code runs when it loads). Packages written before 2026-11-29 hold a
second model, ``decode``, traced with the sequence fixed at one token (Inductor's code had computed a wrong
one-token step on a left-padded batch); their one-token calls still run it. Once the runner handed the
package contiguous inputs, the one program gave the same tokens, logits and padded-batch figures at the
same speed (SmolLM2-135M, AVX-512 and AVX2 code; docs/export.md), so new packages hold the one program:
half the compile, half the folder. The check at export still runs the padded batch's one-token step.
Beside it the source's config and tokenizer files and ``ptopt_lm.json`` (``ptopt.formats.lm_folder``).
Both keep the model's ``sdpa`` attention.

Unlike the static-cache program of ``quantize --mode weight-only --decode-step`` (state inside the program,
one sequence at a time, batch 1), the cache here is the caller's: any batch in the exported range, and a
sequence can be resumed or forked by keeping its ``present`` tensors.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, UnsafePickleError
from ptopt.formats.lm_folder import CachedLM, LMFolder

FILE = "model.pt2"
#: the one-token model of an AOTInductor folder's package written before 2026-11-29 (module docstring)
DECODE = "decode"


class ProgramLM(CachedLM):
    """A folder's ``model.pt2`` run by torch (an ExportedProgram's module or an AOTInductor package);
    ``decode``: the step to run for one-token calls (an AOTInductor package's ``decode`` model)."""

    def __init__(
        self, step: Any, config: Any, record: dict[str, Any], runtime: str, decode: Any = None
    ) -> None:
        super().__init__(config, record)
        self.step, self.runtime, self.decode = step, runtime, decode

    def _run(self, feeds: list[Any]) -> list[Any]:
        import torch

        step = self.decode if self.decode is not None and feeds[0].shape[1] == 1 else self.step
        # AOTInductor's code reads its inputs with the strides they were traced with: a sliced or expanded
        # position_ids of a batch of 2 (stride (total, 1)) gave other logits (max abs diff 2.37)
        feeds = [t.contiguous() for t in feeds]
        with torch.inference_mode():
            return list(step(*feeds))


class ExportedProgramLMFolder(LMFolder):
    name = "exported_program_lm"
    label = "ExportedProgram language-model folder (decoder with KV cache inputs/outputs)"
    runtime_label = "torch.export"
    packages = ("transformers",)
    file = FILE
    lm_target = "exported_program"

    def open(self, path: Path, config: Any, record: dict[str, Any], allow_pickle: bool) -> ProgramLM:
        import torch

        from ptopt.core.safety import quiet_upstream

        try:
            with quiet_upstream():
                program = torch.export.load(io.BytesIO((path / FILE).read_bytes()))
        except Exception as e:  # noqa: BLE001 - a corrupt or foreign archive
            raise ModelLoadError(
                f"{path / FILE}: not a loadable ExportedProgram: {str(e).splitlines()[0]}"
            ) from None
        return ProgramLM(program.module(), config, record, "torch.export")

    def write_graph(self, program: Any, folder: Path, record: dict[str, Any], config: Any) -> None:
        import torch

        from ptopt.formats.capture import quiet_export

        program.example_inputs = None  # the .pt2 ships no sample tensors
        buf = io.BytesIO()  # torch.export.save insists on a .pt2 name; written through a buffer
        with quiet_export():
            torch.export.save(program, buf)
        (folder / FILE).write_bytes(buf.getvalue())
        record["method"] = "torch.export.export (strict=False)"


class AotiLMFolder(LMFolder):
    name = "aoti_lm"
    label = "AOTInductor language-model folder (decoder with KV cache inputs/outputs)"
    runtime_label = "aoti"
    packages = ("transformers",)
    trusted_load = True
    file = FILE
    lm_target = "aoti"

    def open(self, path: Path, config: Any, record: dict[str, Any], allow_pickle: bool) -> ProgramLM:
        from ptopt.formats.aoti import load_aoti
        from ptopt.formats.aoti_files import package_models

        if not allow_pickle:
            raise UnsafePickleError(
                f"{path}: refusing to load: its model.pt2 is an AOTInductor package (compiled native code that "
                "runs when it is loaded). Pass --allow-pickle (allow_pickle=True) only if you trust where it came from"
            )
        try:
            import torch._inductor.package as package

            step = load_aoti(path / FILE, record.get("torch_version"))
            old = DECODE in package_models(path / FILE)  # an older package's one-token model
            decode = package.load_package(str(path / FILE), DECODE) if old else None
        except ModelLoadError:
            raise
        except Exception as e:  # noqa: BLE001 - the package loader raises RuntimeError/OSError/...
            raise ModelLoadError(
                f"{path / FILE}: not a loadable AOTInductor package: {str(e).splitlines()[0]}"
            ) from None
        return ProgramLM(step, config, record, "aoti", decode)

    def write_lm(self, module: Any, folder: Path, record: dict[str, Any]) -> None:
        """The step's program (module docstring) compiled into a package."""

        import torch

        from ptopt.core import progress
        from ptopt.formats.aoti_compile import check_compiler, compile_options, compile_package
        from ptopt.formats.aoti_files import package_metadata
        from ptopt.formats.lm_experts import every_expert
        from ptopt.formats.lm_graph import capture

        compiler, options = check_compiler(), compile_options()
        batch, longest = tuple(record["batch"]), record["max_positions"]
        with progress.step("tracing it with torch.export", announce=False), every_expert(module):
            program = capture(module, batch, longest)
        with progress.step(f"compiling it with AOTInductor ({compiler})", announce=False):
            built = compile_package(program, folder / FILE, options, compiler)
        seconds = built["seconds"]
        if built.get("hit"):
            record["compile_cache"] = {"built": built["built"]}
        record |= {
            "method": "torch.export.export (strict=False) + torch._inductor.aoti_compile_and_package",
            "compile_options": options, "compiler": compiler, "compile_threads": torch.get_num_threads(),
            "compile_seconds": round(seconds, 2), "torch_version": torch.__version__,
            "cpu_isa": package_metadata(folder / FILE).get("AOTI_CPU_ISA", ""),
        }  # fmt: skip


FORMATS = [ExportedProgramLMFolder(), AotiLMFolder()]
