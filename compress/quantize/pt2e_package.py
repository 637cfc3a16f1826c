"""The PT2E int8 graph as a deployable package: an AOTInductor ``.pt2`` whose int8 kernels come from
Inductor's lowering, probed at every batch size of its range (no torchao here: ``engine_pt2e``
makes the converted q/dq graph this module compiles).

That speed comes only with autograd off (``ptopt.formats.aoti_compile`` compiles under ``no_grad``)
and with the int8 conv layout fixed (:func:`int8_conv_layout`).

**Dynamic batch** (REFERENCE.md's ``assert_size_stride`` failure): with torch 2.13 + torchao 0.18,
``torch.compile`` of the converted module with a symbolic batch failed in the qconv lowering. The
AOTInductor path taken here re-exports the converted graph with the InputSpecs' ``Dim``s and
compiles it under ``no_grad``; :func:`compile_int8` then runs the package at every batch size of
:func:`probe_batches` and, should any fail inside generated code, raises one UnsupportedModelError
naming the batch sizes that fail and those that work (and how to build a fixed-batch package)
instead of letting a crash in generated code reach the user.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import UnsupportedModelError
from ptopt.core.inputspec import InputSpec
from ptopt.core.quiet import silenced

#: what Inductor and torch.export log while a package is built
_NOISY_LOGGERS = ("torch.utils._pytree", "torchao", "torch._inductor", "torch.export", "torch._export")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with silenced(_NOISY_LOGGERS, streams=True):
        yield


#: what quantize says when the compiled package does not compute what the int8 graph computes
PACKAGE_ADVICE = (
    " (compared with the int8 graph it was compiled from; --no-compile writes that graph as an int8 "
    "ExportedProgram instead, and --engine fx writes int8 TorchScript)"
)


def probe_batches(spec: InputSpec) -> list[int]:
    """The batch sizes a dynamic-batch package is tried at: min, 2, 3, opt, max-1, max (in range)."""
    lo, opt, hi = spec.min_shape[0], spec.opt_shape[0], spec.max_shape[0]
    return sorted({b for b in (lo, lo + 1, 2, 3, opt, hi - 1, hi) if lo <= b <= hi})


def compile_int8(
    converted: Any,
    path: str | os.PathLike,
    specs: Sequence[InputSpec],
    style: str,
    samples: Any = None,
    **write_options: Any,
) -> dict[str, Any]:
    """The converted graph as an AOTInductor package at ``path`` (int8 kernels from Inductor's
    lowering with freezing, :func:`int8_conv_layout` applied), run at every :func:`probe_batches`
    size with the package's own stride checks on, and parity-checked against ``converted`` at
    min/opt/max on ``samples`` (a Dataset or a batch of real inputs, e.g. the calibration data).
    Returns the writer's facts (``extra["pt2e"]``: quantizer, batch sizes probed).

    Real samples matter: with 7-bit activations (``reduce_range``, CPUs without VNNI) the q/dq
    reference clamps requantized values to [0, 127] and Inductor's fused int8 kernels do not, so on
    out-of-distribution random inputs the two part (cosine ~0.95 on zoo:resnet) while on data like
    the calibration data they agree to ~1e-5 (the kernel is then the closer one to fp32)."""
    from ptopt.compress.quantize.engine_pt2e import reduce_range
    from ptopt.export.writers import Check, check_reload, write_model
    from ptopt.formats.aoti import load_aoti

    path = Path(path)
    write_options.setdefault("precision", "int8")
    # the probe turns the package's size/stride checks on; their dynamic-dim lower bound is not the
    # Dim's (Inductor narrows it while lowering), so it is left out: the probe's calls decide
    configs = {"aot_inductor.check_lowerbound": False, **(write_options.pop("inductor_configs", None) or {})}
    write_options["inductor_configs"] = configs
    converted = plain_outputs(converted)
    with _quiet(), int8_conv_layout():
        facts = write_model(
            converted, "aoti_package", path, specs=specs, style=style, check=False, **write_options
        )
    with _runtime_checks():
        model = load_aoti(path)
        probed = _probe(model, specs, style)
    rule = Check(
        reference=converted, samples=samples, what="the compiled int8 package", advice=PACKAGE_ADVICE
    )
    parity = check_reload(path, "aoti_package", specs, style, rule, precision="int8", model=model)
    facts["metrics"] = {"parity": parity}
    facts["extra"]["pt2e"] = {
        "quantizer": "X86InductorQuantizer",
        "reduce_range": reduce_range(),
        "batches_probed": probed,
        "int8_conv_layout_fix": True,
    }
    return facts


def _plain(out: Any) -> Any:
    """Hugging Face ModelOutputs (dict subclasses) → plain dicts of their set fields, recursively."""
    if isinstance(out, dict):
        return {k: _plain(v) for k, v in out.items() if v is not None}
    if isinstance(out, (tuple, list)) and not hasattr(out, "_fields"):
        return type(out)(_plain(v) for v in out)
    return out


def plain_outputs(graph: Any) -> Any:
    """``graph`` returning plain containers: a package records its output's pytree type, and one of
    transformers' ModelOutput classes would not load where transformers is not imported."""
    import inspect

    import torch

    class _PlainOutputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = graph  # not "graph": a GraphModule's own attribute of that name would shadow it

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return _plain(self.inner(*args, **kwargs))

    # torch.export binds inputs (and their dynamic shapes) by the forward's parameter names
    sig = inspect.signature(graph.forward)
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [this, *sig.parameters.values()]
    _PlainOutputs.forward.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return _PlainOutputs()


@contextlib.contextmanager
def int8_conv_layout() -> Iterator[None]:
    """Work around Inductor's int8 conv layout with a dynamic batch (torch 2.13, the root of
    REFERENCE.md's ``assert_size_stride`` failure).

    ``torch._inductor.mkldnn_ir._prepare_convolution_fusion_create`` declares a conv's output
    *contiguous* when shapes are dynamic and its input is contiguous (an input with one channel,
    ``(s0, 1, H, W)``, stays contiguous after the channels-last request: size-1 strides don't
    count). That rule is right for fp32 convs, which skip weight prepacking under dynamic shapes;
    the int8 ``qconv`` always runs on prepacked weights and always writes channels-last. The
    generated code then reads a channels-last buffer as contiguous: torch.compile stops at its
    ``assert_size_stride``, an AOTInductor package (checks off by default) computes garbage. Inside
    this block the int8 convs (those with ``quantize_args``) get the channels-last output layout they
    really produce; fp32 convs keep upstream's rule."""
    from torch._inductor import mkldnn_ir

    prepare, contiguous = (
        mkldnn_ir._prepare_convolution_fusion_create,
        mkldnn_ir.is_contiguous_storage_and_layout,
    )
    quantized = [False]

    def prepare_fusion(*args: Any, **kwargs: Any) -> Any:
        quantized.append(kwargs.get("quantize_args", args[10] if len(args) > 10 else None) is not None)
        try:
            return prepare(*args, **kwargs)
        finally:
            quantized.pop()

    def is_contiguous(x: Any) -> bool:
        return False if quantized[-1] else contiguous(x)

    mkldnn_ir._prepare_convolution_fusion_create = prepare_fusion
    mkldnn_ir.is_contiguous_storage_and_layout = is_contiguous
    try:
        yield
    finally:
        mkldnn_ir._prepare_convolution_fusion_create = prepare
        mkldnn_ir.is_contiguous_storage_and_layout = contiguous


@contextlib.contextmanager
def _runtime_checks() -> Iterator[None]:
    """A package loaded inside this block checks every buffer's size and stride where Inductor
    asserted them (``AOTI_RUNTIME_CHECK_INPUTS``, read once per loaded library at its first call):
    a layout mismatch becomes an error instead of wrong numbers."""
    before = os.environ.get("AOTI_RUNTIME_CHECK_INPUTS")
    os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("AOTI_RUNTIME_CHECK_INPUTS", None)
        else:
            os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = before


def _probe(model: Any, specs: Sequence[InputSpec], style: str) -> list[int]:
    """Run the package at every probe batch (and, where other dims are dynamic, such as a token
    sequence, at the specs' min and max shapes); refuse (one line) when some fail in generated code."""
    import torch

    from ptopt.core.inputspec import call_model, make_inputs
    from ptopt.formats.capture import first_lines

    sizes = probe_batches(specs[0])
    shapes: list[tuple[str, int | None]] = [("opt", b) for b in sizes]
    if any(i for s in specs for i in s.dynamic_dims):
        shapes += [("min", None), ("max", None)]
    works, fails, why = [], [], ""
    for which, b in shapes:
        x = make_inputs(specs, style, which=which, batch=b)
        shown = str(b) if which == "opt" else _shape_text(specs, which)
        try:
            with torch.no_grad(), _quiet():
                call_model(model, x)
            works.append(shown)
        except Exception as e:  # noqa: BLE001 - a failure inside Inductor's generated code
            fails.append(shown)
            why = why or f"{type(e).__name__}: {first_lines(str(e), 1)[:160]}"
    if fails:
        raise UnsupportedModelError(
            f"--engine pt2e: the compiled int8 package fails at batch size(s) {_sizes(fails)} ({why}) and runs "
            f"at {_sizes(works) or 'none'}; quantize with --no-compile (the int8 ExportedProgram), then "
            f"compile it for one size that works (ptopt export OUT.pt2 --target aoti --dynamic-batch B:B:B), "
            f"or use --engine fx"
        )
    return sizes


def _shape_text(specs: Sequence[InputSpec], which: str) -> str:
    return "shape " + "x".join(str(d) for d in specs[0].shape(which))


def _sizes(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values)
