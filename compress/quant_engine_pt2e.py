"""The PT2E quantization engine: the ONLY module of ptopt that imports ``torchao``.

torchao's PT2E flow, beside the torch.ao FX engine (``quant_engine``) behind the same kind of
boundary::

    torch.export (the InputSpecs' Dims) → prepare_pt2e / prepare_qat_pt2e (X86InductorQuantizer)
      → calibrate (or train, for QAT) → convert_pt2e → an int8 q/dq graph (a GraphModule)
      → compile_int8: an AOTInductor package whose int8 kernels come from Inductor's lowering

The converted graph run eagerly is SLOWER than fp32 (every q/dq is a separate op); its speed comes
from Inductor with freezing, which matches ``dequant → conv/linear → quant`` patterns into oneDNN
int8 kernels (``qconv2d_pointwise``, ``qlinear_pointwise``; a ``+`` residual and a ReLU fused in).
That happens only with autograd off (``ptopt.formats.aoti_compile`` compiles under ``no_grad``).

The quantizer is X86InductorQuantizer: uint8 per-tensor affine activations, int8 per-channel
symmetric weights. The scheme's ``observer`` picks the activation observer (histogram, minmax,
percentile), as in the FX engine; ``float_modules`` stay float (``set_module_name_qconfig(name,
None)``). Per-tensor weights and dynamic int8 are not offered by this quantizer's Inductor lowering:
refused with the way out (``--engine fx``).

**Dynamic batch** (REFERENCE.md's ``assert_size_stride`` failure): with torch 2.13 + torchao 0.18,
``torch.compile`` of the converted module with a symbolic batch failed in the qconv lowering. The
AOTInductor path taken here re-exports the converted graph with the InputSpecs' ``Dim``s and
compiles it under ``no_grad``; :func:`compile_int8` then runs the package at every batch size of
:func:`probe_batches` and, should any fail inside generated code, raises one UnsupportedModelError
naming the batch sizes that fail and those that work (and how to build a fixed-batch package)
instead of letting a crash in generated code reach the user.

torchao is imported lazily with ``TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1`` (its CUDA/mxfp8 kernels
print load messages on a CPU machine) and its warnings/log noise filtered here (:func:`_quiet`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec
from ptopt.core.quiet import silenced

MODES = ("static", "qat")
OBSERVERS = ("histogram", "minmax", "percentile")
DEFAULT_PERCENTILE = 99.99
_NOISY_LOGGERS = ("torch.utils._pytree", "torchao", "torch._inductor", "torch.export", "torch._export")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torchao's import prints ("Skipping import of cpp extensions"), torch's pytree logs Enum
    registration deprecations, and prepare/convert warn about internals: none reaches the user."""
    with silenced(_NOISY_LOGGERS, streams=True):
        yield


def _torchao() -> Any:
    """The torchao PT2E modules (a namespace), or MissingDependencyError naming the extra."""
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # before torchao's first import
    try:
        with _quiet():
            from torchao.quantization.pt2e import (
                move_exported_model_to_eval,
                move_exported_model_to_train,
                observer,
            )
            from torchao.quantization.pt2e import quantize_pt2e as flow
            from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    except ImportError as e:
        raise MissingDependencyError(
            f"--engine pt2e needs torchao (PT2E quantization): pip install 'ptopt[torchao]' ({e})"
        ) from None
    return _Torchao(observer, flow, x86, move_exported_model_to_train, move_exported_model_to_eval)


@dataclasses.dataclass(frozen=True)
class _Torchao:
    observer: Any
    flow: Any
    x86: Any
    to_train: Any
    to_eval: Any


def check_scheme(scheme: Any, mode: str) -> None:
    """Refuse what this engine cannot do, naming the way out (UsageError)."""
    if mode not in MODES:
        raise UsageError(
            f"--engine pt2e does {' and '.join(MODES)} int8; --mode {mode} runs on --engine fx "
            f"(X86InductorQuantizer's dynamic int8 has no Inductor int8 lowering for convolutions)"
        )
    if getattr(scheme, "backend", "x86") != "x86":
        raise UsageError(f"--engine pt2e quantizes for x86 (X86InductorQuantizer); --backend {scheme.backend} "
                         f"runs on --engine fx")  # fmt: skip
    if not getattr(scheme, "per_channel", True):
        raise UsageError(
            "--engine pt2e quantizes weights per channel (X86InductorQuantizer); per-tensor weights "
            "run on --engine fx"
        )
    observer = getattr(scheme, "observer", None) or "histogram"
    if observer not in OBSERVERS:
        raise UsageError(f"unknown observer {observer!r} for --engine pt2e (known: {', '.join(OBSERVERS)})")


def _reduce_range() -> bool:
    """7-bit activations on CPUs without VNNI (their int8 dot products saturate 16-bit sums), as
    torchao advises and the FX engine does for x86."""
    from ptopt.core.system import cpu_info

    isa = cpu_info()["isa"]
    return not any(isa.get(f) for f in ("avx512_vnni", "avx_vnni", "amx_int8"))  # type: ignore[union-attr]


def build_quantizer(scheme: Any, qat: bool = False) -> Any:
    """X86InductorQuantizer for ``scheme``: its activation observer, its float modules."""
    ao = _torchao()
    with _quiet():
        cfg = ao.x86.get_default_x86_inductor_quantization_config(is_qat=qat, reduce_range=_reduce_range())
        observer = getattr(scheme, "observer", None) or "histogram"
        if not qat and observer != "histogram":
            ctr = {"minmax": ao.observer.MinMaxObserver, "percentile": _percentile_observer(ao)}[observer]
            act = dataclasses.replace(
                cfg.input_activation, observer_or_fake_quant_ctr=ctr.with_args(eps=2**-12)
            )
            cfg = dataclasses.replace(cfg, input_activation=act, output_activation=act)
        quantizer = ao.x86.X86InductorQuantizer().set_global(cfg)
        for name in getattr(scheme, "float_modules", ()) or ():
            quantizer.set_module_name_qconfig(name, None)
    return quantizer


def _percentile_observer(ao: Any) -> Any:
    """torchao's HistogramObserver with its range clipped to [100-p, p] percentiles (as the FX
    engine's PercentileObserver)."""
    import torch

    class PercentileObserver(ao.observer.HistogramObserver):
        def calculate_qparams(self):  # type: ignore[override]
            if self.min_val == float("inf") or float(self.histogram.sum()) == 0:
                return super().calculate_qparams()
            cdf = torch.cumsum(self.histogram, 0) / self.histogram.sum()
            edges = torch.linspace(float(self.min_val), float(self.max_val), self.bins + 1)
            lo = int(torch.searchsorted(cdf, torch.tensor((100.0 - DEFAULT_PERCENTILE) / 100.0)))
            hi = int(torch.searchsorted(cdf, torch.tensor(DEFAULT_PERCENTILE / 100.0)))
            lo_v, hi_v = edges[min(lo, self.bins - 1)], edges[min(hi + 1, self.bins)]
            return self._calculate_qparams(lo_v.reshape(()), hi_v.reshape(()))

    return PercentileObserver


# -- capture, prepare, calibrate, convert ------------------------------------------------------------


def capture(module: Any, specs: Sequence[InputSpec], style: str, example: Any = None) -> Any:
    """``torch.export`` with the specs' Dims → its GraphModule (what prepare_pt2e takes). A model
    torch.export cannot capture is one UnsupportedModelError naming the op/module and the ways out."""
    import torch

    from ptopt.core.inputspec import call_args
    from ptopt.formats.capture import example_for_export, failing_op, first_lines, quiet_export
    from ptopt.formats.shapes import torch_export_dynamic_shapes

    args, kwargs = call_args(example if example is not None else example_for_export(specs, style))
    try:
        with quiet_export():
            ep = torch.export.export(
                module, tuple(args), kwargs or None, dynamic_shapes=torch_export_dynamic_shapes(specs, style),
                strict=False,
            )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - torch.export raises many kinds (UserError, GuardOnDataDependent...)
        what = failing_op(e) or f"{type(e).__name__}: {first_lines(str(e), 2)[:240]}"
        raise UnsupportedModelError(
            f"--engine pt2e: torch.export cannot capture the model ({what}); PT2E quantizes the whole "
            f"model as one graph: use --engine fx (with --exclude MODULE to keep that part float)"
        ) from None
    return ep.module()


def prepare(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    scheme: Any,
    *,
    qat: bool = False,
    example: Any = None,
    graph: Any = None,
) -> Any:
    """Capture ``module`` (eval mode; train mode for QAT) and insert observers / fake quantization.
    ``graph``: a :func:`capture` of ``module`` to use instead (prepare changes it in place)."""
    check_scheme(scheme, "qat" if qat else "static")
    ao = _torchao()
    quantizer = build_quantizer(scheme, qat)
    _check_names(module, getattr(scheme, "float_modules", ()) or ())
    if graph is None:
        graph = capture(module, specs, style, example)
    with _quiet():
        prepared = (ao.flow.prepare_qat_pt2e if qat else ao.flow.prepare_pt2e)(graph, quantizer)
        (ao.to_train if qat else ao.to_eval)(prepared)
    return prepared


def copy_graph(graph: Any) -> Any:
    """A copy of a captured graph to prepare again (prepare changes its graph in place); quiet:
    copying an exported module warns about pytree internals."""
    import copy

    with _quiet():
        return copy.deepcopy(graph)


def _check_names(module: Any, names: Iterable[str]) -> None:
    known = {n for n, _ in module.named_modules() if n}
    bad = [n for n in names if n not in known]
    if bad:
        sample = ", ".join(sorted(known, key=len)[:8])
        raise UsageError(
            f"--exclude {', '.join(bad)}: no such module in the model (modules include: {sample})"
        )


def calibrate(prepared: Any, batches: Iterable[Any]) -> int:
    """Run calibration batches (inputs in the model's calling style) through the observers; count."""
    import torch

    from ptopt.core.inputspec import call_model

    n = 0
    with torch.no_grad(), _quiet():
        for x in batches:
            call_model(prepared, x)
            n += 1
    return n


def set_training(prepared: Any, training: bool) -> None:
    """QAT: switch a prepared graph between train and eval behaviour (BatchNorm, dropout) — an
    exported graph ignores ``.train()``."""
    ao = _torchao()
    with _quiet():
        (ao.to_train if training else ao.to_eval)(prepared)


def convert(prepared: Any) -> Any:
    """Observed / fake-quant graph → the int8 q/dq graph (eval mode)."""
    ao = _torchao()
    with _quiet():
        converted = ao.flow.convert_pt2e(prepared)
        ao.to_eval(converted)
    return converted


def quantize_static(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    scheme: Any,
    batches: Iterable[Any],
    example: Any = None,
    graph: Any = None,
) -> Any:
    """prepare → calibrate → convert: the int8 q/dq GraphModule (run it fast through :func:`compile_int8`).
    ``graph``: a :func:`capture` of ``module`` to reuse (consumed)."""
    prepared = prepare(module, specs, style, scheme, example=example, graph=graph)
    if calibrate(prepared, batches) == 0:
        raise UsageError("--engine pt2e: no calibration batches")
    return convert(prepared)


def int8_modules(converted: Any) -> set[str]:
    """The modules whose weights the converted graph dequantizes from int8 (the conv / linear layers
    the quantizer annotated; weights are per channel), by their names in the source model."""
    int8 = set()
    for node in converted.graph.nodes:
        weight = node.args[1] if node.op == "call_function" and len(node.args) > 1 else None
        if "dequantize_per_channel" in str(getattr(weight, "target", "")):
            stack = node.meta.get("nn_module_stack") or {}
            if stack:
                int8.add(list(stack.values())[-1][0])
    return int8


# -- compile --------------------------------------------------------------------------------------


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
    from ptopt.export.writers import check_reload, write_model
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
    parity = check_reload(
        path, "aoti_package", converted, specs, style, precision="int8", model=model, samples=samples
    )
    facts["metrics"] = {"parity": parity}
    facts["extra"]["pt2e"] = {
        "quantizer": "X86InductorQuantizer",
        "reduce_range": _reduce_range(),
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
            f"at {_sizes(works) or 'none'}; build one package per batch size (--dynamic-batch B:B:B) for a "
            f"size that works, or use --engine fx"
        )
    return sizes


def _shape_text(specs: Sequence[InputSpec], which: str) -> str:
    return "shape " + "x".join(str(d) for d in specs[0].shape(which))


def _sizes(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values)
