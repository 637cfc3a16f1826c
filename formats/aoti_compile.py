"""AOTInductor packages (``.pt2``): the model compiled ahead of time into native code for this CPU.

Written by :func:`write_aoti` (``write_model(module, "aoti_package", path)``):
``torch.export.export`` with the InputSpecs' ``Dim``s (the same [min, max] as every other format),
then ``torch._inductor.aoti_compile_and_package`` with freezing on (weights folded into the
compiled code as constants, which is what lets Inductor pick its fused/oneDNN kernels, and for a
PT2E int8 graph its int8 kernels). Loaded with plain torch, no ptopt::

    model = torch._inductor.aoti_load_package("model.pt2")
    y = model(x)

A package is tied to the torch that built it (the generated code calls torch's C++ ABI), so the
torch version goes into the package's own metadata (``ptopt_torch_version``, readable without
loading the library) and into the sidecar; :func:`load_aoti` refuses a package from another torch,
naming both versions, before any of its native code is loaded. The CPU ISA it was compiled for
(AVX2, AVX512...), the compiler, the compile options, threads and seconds are recorded as well.

On CUDA (``device="cuda:N"``, ``ptopt export --target aoti --device cuda``) the program is captured
with the model and inputs on that GPU and Inductor generates Triton kernels plus a C++ wrapper that
launches them; the package then loads with ``aoti_load_package(path, device_index=N)``.
``cuda_graphs=True`` (``--cuda-graphs``) does not change the compile options: AOTInductor packages
carry no CUDA graphs (torch's ``compile_fx`` returns the AOT-compiled library before Inductor's
``triton.cudagraphs`` step, which wraps only JIT-compiled code), so the wish is recorded in the
package metadata (:data:`CUDA_GRAPHS_KEY`) and the sidecar, and ptopt's loaders replay the loaded
package through CUDA graphs (:mod:`ptopt.core.cudagraph`).

A ``.pt2`` is either this or a ``torch.export`` ExportedProgram; the sidecar's ``format``
(``aoti_package`` vs ``exported_program``) says which, and ``is_aoti_package`` tells them apart
from the archive alone (:mod:`ptopt.formats.aoti`, shared with the model loaders).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec
from ptopt.formats.aoti_files import DEFAULT_MODEL, VERSION_KEY, package_metadata, static_model_name

__all__ = ["CUDA_GRAPHS_KEY", "DEFAULT_OPTIONS", "check_compiler", "write_aoti"]

#: Inductor options every package is compiled with (recorded in the sidecar with what was added)
DEFAULT_OPTIONS: dict[str, Any] = {"freezing": True}
#: package metadata key: "1" when ptopt's loaders should replay the package through CUDA graphs
CUDA_GRAPHS_KEY = "ptopt_cuda_graphs"


def write_aoti(
    module: Any,
    path: Path,
    *,
    specs: Sequence[InputSpec],
    style: str,
    example: Any = None,
    source_format: str = "eager",
    inductor_configs: dict[str, Any] | None = None,
    device: str = "cpu",
    cuda_graphs: bool = False,
    static_batches: Sequence[int] = (),
    **_: Any,
) -> dict[str, Any]:
    """Capture ``module`` with the specs' Dims and compile it into an AOTInductor package at ``path``.

    ``inductor_configs``: extra Inductor options (on top of :data:`DEFAULT_OPTIONS`). ``device``:
    where ``module`` is and the package runs (``cpu`` or ``cuda:N``); ``cuda_graphs``: replay it
    through CUDA graphs when loaded by ptopt (CUDA only); ``static_batches``: batch sizes that also
    get a fixed-batch model in the package (``batch_B``, picked by ptopt's loader for a batch of
    exactly B; :func:`ptopt.formats.aoti.load_package`). Returns the writer's info: files, method,
    compile options, torch version, compile seconds, CPU ISA, device."""
    import torch

    from ptopt.formats.capture import export_program, fits_for_export

    if source_format == "torchscript" or isinstance(module, torch.jit.ScriptModule):
        raise UnsupportedModelError(
            "a TorchScript model cannot go through torch.export; export the original nn.Module "
            "(pkg.module:factory --weights W, or zoo:NAME) to --target aoti"
        )
    compiler = check_compiler()
    x = example if example is not None and fits_for_export(specs, example) else None
    batches = _fixed_batches(specs, static_batches)  # refused before anything is captured
    ep = export_program(module, specs, style, device=device, example=x)
    statics = {
        static_model_name(b): export_program(
            module, [s.with_batch(b, b, b) for s in specs], style, device=device
        )
        for b in batches
    }
    options = compile_options(inductor_configs)
    metadata = {CUDA_GRAPHS_KEY: "1"} if cuda_graphs else {}
    threads = torch.get_num_threads()
    built = compile_package(ep, path, options, compiler, metadata, statics, device=device)
    seconds = built["seconds"]
    meta = package_metadata(path)
    return {
        **({"compile_cache": {"built": built["built"]}} if built.get("hit") else {}),
        "files": [path.name],
        "method": "torch.export.export (strict=False) + torch._inductor.aoti_compile_and_package",
        "compile_options": options,
        "compiler": compiler,
        "compile_threads": threads,
        "compile_seconds": round(seconds, 2),
        "torch_version": torch.__version__,
        "cpu_isa": meta.get("AOTI_CPU_ISA", ""),
        "device": meta.get("AOTI_DEVICE_KEY", device.split(":")[0]),
        "cuda_graphs": bool(cuda_graphs),
        "static_batches": batches,
    }


def _fixed_batches(specs: Sequence[InputSpec], batches: Sequence[int]) -> list[int]:
    """The batch sizes that get a fixed-batch model (``--static-batch``): each must lie in the specs'
    batch range (UsageError otherwise); one the dynamic model already fixes (``1:1:1``) is skipped.

    A fixed batch lets Inductor prepack convolution weights for oneDNN, which it skips under a
    dynamic batch (``mkldnn_ir``: no weight prepack for Conv with dynamic shapes): docs/benchmarks.md."""
    if not batches:
        return []
    if any(len(s.min_shape) == 0 for s in specs):
        raise UsageError("--static-batch: an input has no batch dimension (a 0-d tensor)")
    lo, hi = min(s.min_shape[0] for s in specs), max(s.max_shape[0] for s in specs)
    out = []
    for b in sorted({int(b) for b in batches}):
        if not lo <= b <= hi:
            raise UsageError(
                f"--static-batch {b}: outside the package's batch range [{lo}, {hi}] (--dynamic-batch)"
            )
        if lo != hi:
            out.append(b)
    return out


def compile_options(inductor_configs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Inductor options a package is compiled with: :data:`DEFAULT_OPTIONS` and the caller's."""
    return {**DEFAULT_OPTIONS, **(inductor_configs or {})}


def check_compiler(what: str = "AOTInductor") -> str:
    """The C++ compiler Inductor will use (its name), or MissingDependencyError naming the ones tried
    (``what``: the feature that needs it, first in the message)."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder

    try:
        return str(cpp_builder.get_cpp_compiler())
    except Exception:  # noqa: BLE001 - InvalidCxxCompiler, or an OSError from probing the compiler
        tried = [c for c in _as_tuple(inductor_config.cpp.cxx) if c]
        raise MissingDependencyError(
            f"{what} needs a C++ compiler and none works here (tried: {', '.join(tried) or 'g++'}); "
            f"install g++ (e.g. apt-get install g++) or point CXX at one"
        ) from None


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def compile_package(
    ep: Any,
    path: Path,
    options: dict[str, Any],
    compiler: str,
    metadata: dict[str, str] | None = None,
    statics: dict[str, Any] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """``aoti_compile_and_package`` into a temporary folder, then moved to ``path`` (any name: the
    compiler wants a ``.pt2`` name and writes scratch files beside it). ``statics``: more programs
    (``{model name: ExportedProgram}``, the fixed-batch ones) compiled into the same package beside
    ``ep``, which stays the package's default model (``model``). A package ptopt's compile cache
    holds for the same programs and build (:mod:`ptopt.formats.aoti_cache`) is copied instead. Returns
    ``seconds`` (the compile's; for a copy, its first build's) and, for a copy, ``hit`` and ``built``."""
    import torch

    from ptopt.formats.aoti_cache import cached_compile, package_key

    configs = {**options, "aot_inductor.metadata": {VERSION_KEY: torch.__version__, **(metadata or {})}}
    programs = {DEFAULT_MODEL: ep, **(statics or {})}
    key = package_key(programs, configs, compiler, device)
    with tempfile.TemporaryDirectory(prefix="ptopt-aoti-") as d:
        out = Path(d) / "model.pt2"
        with cached_compile(key, out) as cached:
            if not cached.get("hit"):
                started = time.perf_counter()
                _compile(out, programs, configs, compiler)
                cached["seconds"] = time.perf_counter() - started
        shutil.move(str(out), path)
    return cached


def _compile(out: Path, programs: dict[str, Any], configs: dict[str, Any], compiler: str) -> None:
    import torch

    from ptopt.formats.capture import first_lines

    try:
        # freezing applies only with autograd off (torch._inductor.compile_fx): under grad the
        # package silently keeps plain aten convolutions instead of oneDNN's packed/int8 kernels
        with torch.no_grad(), _quiet_inductor():
            if len(programs) > 1:
                _compile_models(out, programs, configs)
            else:
                torch._inductor.aoti_compile_and_package(
                    programs[DEFAULT_MODEL], package_path=str(out), inductor_configs=configs
                )
    except Exception as e:  # noqa: BLE001 - Inductor lowering / the C++ build raise many kinds
        text = str(e)
        where = (
            f" ({compiler} failed to build the generated code)"
            if "CppCompileError" in (type(e).__name__ + text[:200])
            else ""
        )
        raise UnsupportedModelError(
            f"AOTInductor cannot compile the model{where}: {type(e).__name__}: {first_lines(text, 2)[:300]}"
            f"; --target exported_program or onnx still work"
        ) from None


def _compile_models(out: Path, programs: dict[str, Any], configs: dict[str, Any]) -> None:
    """Several programs into one package, one model name each: ``torch._inductor.aot_compile`` per
    program, then ``package_aoti`` (the multi-model recipe of ``aoti_compile_and_package``'s docs)."""
    import torch
    from torch._inductor.package import package_aoti

    files = {}
    for name, program in programs.items():
        args, kwargs = program.example_inputs
        gm = program.module(check_guards=False)
        opts = {**configs, "aot_inductor.package": True}
        files[name] = torch._inductor.aot_compile(gm, args, kwargs, options=opts)
    package_aoti(str(out), files)


@contextlib.contextmanager
def _quiet_inductor() -> Iterator[None]:
    from ptopt.formats.capture import quiet_export

    with quiet_export():
        yield
