"""The torch.ao engine (FX graph mode and eager dynamic int8): the ONLY module of ptopt that imports
``torch.ao`` (the structure test, ``tests/compress/test_structure.py``, holds every module to that).

Everything the fx handlers (``techniques/static_fx``, ``dynamic_fx``, ``qat_fx``) and the search
need from the upstream quantization stack goes through the functions here. ``torch.ao.quantization``
raises a DeprecationWarning on every call in torch 2.13 ("migrate to torchao"); :func:`_quiet`
handles them at this boundary so users never see them.

A quantization *scheme* is any object with the attributes ``backend``, ``per_channel``,
``float_modules`` and (optionally) ``observer``: the configs of ``ptopt.compress.quantize.config``
are such objects, and so are the candidates of accuracy-aware quantization (some modules left float,
per-tensor vs per-channel weights, another observer). :func:`build_qconfig_mapping` turns a scheme
into the upstream ``QConfigMapping``.
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ptopt.compress.quantize.config import BACKENDS, engine_observer, normalize_observer
from ptopt.compress.quantize.layers import linearize_conv1d, mha_fastpath_disabled
from ptopt.compress.quantize.tied import INT8_MARK, tie_int8, tied_groups
from ptopt.core.errors import UnsupportedModelError, UsageError, clip

# Activation observers for static calibration: "histogram" minimizes the quantization error over a
# histogram (the entropy-style choice, upstream's default), "minmax" takes the full range, and
# "percentile" clips the range to the 0.01th..99.99th percentile of the histogram.
#: layer types dynamic quantization acts on (never convolutions: ConvInteger is slower than fp32)
DYNAMIC_TYPES = {"linear": nn.Linear, "lstm": nn.LSTM, "gru": nn.GRU, "embedding": nn.Embedding}
DEFAULT_PERCENTILE = 99.99


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence upstream deprecations of torch.ao.quantization / torch.jit inside the engine."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        # upstream internals (reduce_range deprecation notes, observer notices): not the user's business
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.ao\..*")
        warnings.filterwarnings("ignore", message=".*must run observer before calling calculate_qparams.*")
        warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
        warnings.filterwarnings("ignore", message=".*_check_is_size will be removed.*")
        yield


with _quiet():
    import torch.ao.quantization as tq
    from torch.ao.quantization import QConfig, QConfigMapping
    from torch.ao.quantization.observer import HistogramObserver, MinMaxObserver, PerChannelMinMaxObserver
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx, prepare_qat_fx


def check_backend(backend: str) -> str:
    """The backend name if this torch build can run it, else a UsageError naming the known ones."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    if backend not in torch.backends.quantized.supported_engines:
        raise UsageError(
            f"backend {backend!r} is not available in this torch build "
            f"(available: {', '.join(e for e in BACKENDS if e in torch.backends.quantized.supported_engines)})"
        )
    return backend


@contextlib.contextmanager
def quantized_engine(backend: str) -> Iterator[None]:
    """Run with ``torch.backends.quantized.engine = backend`` (packing of weights depends on it)."""
    prev = torch.backends.quantized.engine
    torch.backends.quantized.engine = check_backend(backend)
    try:
        yield
    finally:
        torch.backends.quantized.engine = prev


# -- observers and qconfigs --------------------------------------------------------------------


class PercentileObserver(HistogramObserver):
    """Histogram observer whose range is clipped to [100-p, p] percentiles: outliers stop
    stretching the scale (a few extreme activations otherwise cost every other value precision)."""

    def __init__(self, percentile: float = DEFAULT_PERCENTILE, **kwargs: Any):
        super().__init__(**kwargs)
        self.percentile = float(percentile)

    def calculate_qparams(self):  # type: ignore[override]
        if self.min_val == float("inf") or float(self.histogram.sum()) == 0:
            return super().calculate_qparams()
        cdf = torch.cumsum(self.histogram, 0) / self.histogram.sum()
        edges = torch.linspace(float(self.min_val), float(self.max_val), self.bins + 1)
        lo = int(torch.searchsorted(cdf, torch.tensor((100.0 - self.percentile) / 100.0)))
        hi = int(torch.searchsorted(cdf, torch.tensor(self.percentile / 100.0)))
        new_min, new_max = edges[min(lo, self.bins - 1)], edges[min(hi + 1, self.bins)]
        return self._calculate_qparams(new_min.reshape(()), new_max.reshape(()))


def _reduce_range(backend: str) -> bool:
    # x86/fbgemm int8 kernels accumulate in 16 bits without VNNI; upstream keeps 7-bit activations there
    return backend in ("x86", "fbgemm")


def _activation(backend: str, observer: str, qat: bool):
    rr = _reduce_range(backend)
    if qat:
        if observer != "minmax":
            raise UsageError(
                f"QAT learns ranges with moving-average min-max fake quantization; observer "
                f"{observer!r} applies to static calibration only"
            )
        return tq.FusedMovingAvgObsFakeQuantize.with_args(
            observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255, reduce_range=rr
        )
    if observer == "minmax":
        return MinMaxObserver.with_args(reduce_range=rr)
    if observer == "percentile":
        return PercentileObserver.with_args(reduce_range=rr)
    return HistogramObserver.with_args(reduce_range=rr)


def _weight(per_channel: bool, qat: bool):
    if qat:
        return tq.default_fused_per_channel_wt_fake_quant if per_channel else tq.default_fused_wt_fake_quant
    if per_channel:
        return PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    return MinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)


def build_qconfig(scheme: Any, qat: bool = False) -> QConfig:
    observer = normalize_observer(
        getattr(scheme, "observer", None) or ("minmax" if qat else engine_observer("fx"))
    )
    return QConfig(
        activation=_activation(scheme.backend, observer, qat), weight=_weight(scheme.per_channel, qat)
    )


def build_qconfig_mapping(scheme: Any, qat: bool = False) -> QConfigMapping:
    """The upstream QConfigMapping for ``scheme`` (backend, observer, per_channel, float_modules).

    Starts from the backend's default mapping (fixed-qparams ops such as sigmoid, reuse-input ops,
    LayerNorm's float weight, per-tensor transposed convs), swaps in the scheme's activation observer
    and weight observer, and maps every name in ``scheme.float_modules`` to None (stays float).
    """
    check_backend(scheme.backend)
    qconfig = build_qconfig(scheme, qat)
    with _quiet():
        base = (
            tq.get_default_qat_qconfig_mapping(scheme.backend)
            if qat
            else tq.get_default_qconfig_mapping(scheme.backend)
        )
    fixed = set(getattr(tq.qconfig_mapping, "_FIXED_QPARAMS_OP_TO_OBSERVER", {}))
    mapping = QConfigMapping().set_global(qconfig)
    for pattern, qc in base.object_type_qconfigs.items():
        if pattern in fixed or pattern == "reshape" or qc is None:
            mapping.set_object_type(pattern, qc)
        elif (
            pattern in (nn.LayerNorm, torch.nn.functional.layer_norm, nn.PReLU)
            or "transpose" in str(pattern).lower()
        ):
            # keep upstream's weight choice for these (float LayerNorm weight, per-tensor transposed convs)
            mapping.set_object_type(pattern, QConfig(activation=qconfig.activation, weight=qc.weight))
        else:
            mapping.set_object_type(pattern, qconfig)
    # embeddings would get an activation observer on their integer indices; weight-only int8
    # embeddings are not supported by this engine, so they stay float
    for emb in (nn.Embedding, nn.EmbeddingBag):
        mapping.set_object_type(emb, None)
    for name in getattr(scheme, "float_modules", ()) or ():
        mapping.set_module_name(name, None)
    return mapping


# -- graph mode (FX): static and QAT ---------------------------------------------------------------


class FxTraceError(UnsupportedModelError):
    """torch.fx cannot trace the model (graph-mode static int8 / QAT); the message says where."""


def _trace_failure(model: nn.Module, err: BaseException, qat: bool) -> UnsupportedModelError:
    """Name the module and source line where symbolic tracing stopped, and what the user can do."""
    ids = {id(m): n for n, m in model.named_modules()}
    where, line = None, None
    tb = err.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in ids:
            where = (ids[id(owner)], type(owner).__name__, tb.tb_frame.f_code.co_name)
            line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
        tb = tb.tb_next
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    mode = "QAT" if qat else "static quantization"
    if where is None:
        return FxTraceError(
            f"graph mode ({mode}) cannot trace the model: {clip(reason, 300)}. "
            "Use --mode dynamic (Linear/LSTM/GRU only), or make the model "
            "symbolically traceable (torch.fx)"
        )
    name, cls, fn = where
    at = f"module {name!r} ({cls}.{fn})" if name else f"the top-level model ({cls}.{fn})"
    todo = (
        f"keep that module in float with --exclude {name} (float_modules=('{name}',)), or use --mode dynamic"
        if name
        else "use --mode dynamic, or move that code into a submodule and --exclude it"
    )
    src = f" at `{line}`" if line else ""
    return FxTraceError(
        f"graph mode ({mode}) cannot trace the model: tracing stopped in {at}{src}: "
        f"{clip(reason, 200)}. {todo[0].upper() + todo[1:]}"
    )


def _prepare_custom_config(scheme: Any):
    from torch.ao.quantization.fx.custom_config import PrepareCustomConfig

    # a float module is also left untraced: code FX cannot trace can be excluded this way
    return PrepareCustomConfig().set_non_traceable_module_names(
        list(getattr(scheme, "float_modules", ()) or ())
    )


def prepare_static(
    model: nn.Module, scheme: Any, example_args: tuple, example_kwargs: dict | None = None
) -> nn.Module:
    """Trace ``model`` (a copy, in eval mode), fuse conv-bn(-relu) / linear-relu and insert observers."""
    return _prepare(model, scheme, example_args, example_kwargs, qat=False)


def prepare_qat(
    model: nn.Module, scheme: Any, example_args: tuple, example_kwargs: dict | None = None
) -> nn.Module:
    """Like :func:`prepare_static` in train mode with fake quantization (conv-bn kept for training)."""
    return _prepare(model, scheme, example_args, example_kwargs, qat=True)


def _prepare(
    model: nn.Module, scheme: Any, example_args: tuple, example_kwargs: dict | None, qat: bool
) -> nn.Module:
    mapping = build_qconfig_mapping(scheme, qat=qat)
    model = copy.deepcopy(model)
    model.train(qat)
    kwargs_example = dict(example_kwargs or {})
    if kwargs_example:
        # FX traces forward(*args); keyword inputs are traced as concrete_args-free placeholders by name
        example_args = tuple(kwargs_example.values())
    fn = prepare_qat_fx if qat else prepare_fx
    with _quiet(), quantized_engine(scheme.backend):
        try:
            return fn(model, mapping, example_args, prepare_custom_config=_prepare_custom_config(scheme))
        except (
            torch.fx.proxy.TraceError,
            TypeError,
            RuntimeError,
            AttributeError,
            NotImplementedError,
            ValueError,
            AssertionError,
            KeyError,
            IndexError,
        ) as e:
            raise _trace_failure(model, e, qat) from None


def convert(prepared: nn.Module, backend: str) -> nn.Module:
    """Observed/fake-quant graph → int8 modules (quantized conv/linear kernels of ``backend``)."""
    with _quiet(), quantized_engine(backend):
        prepared.eval()
        return convert_fx(prepared)


def freeze_observers(model: nn.Module) -> None:
    """QAT: stop updating quantization ranges (they settle; the weights adapt to them)."""
    with _quiet():
        model.apply(tq.disable_observer)


def freeze_bn_stats(model: nn.Module) -> None:
    """QAT: stop updating BatchNorm running statistics (fused conv-bn modules and plain BN)."""
    with _quiet():
        import torch.ao.nn.intrinsic.qat as nniqat

        model.apply(nniqat.freeze_bn_stats)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()


def is_quantized_module(m: nn.Module) -> bool:
    if getattr(m, INT8_MARK, False):
        return True
    mod = type(m).__module__
    return ".quantized" in mod and not mod.endswith(".reference") and "fake" not in mod


# -- dynamic -------------------------------------------------------------------------------------


def quantize_dynamic(
    model: nn.Module, types: Any, per_channel: bool, backend: str, float_modules: Any = ()
) -> nn.Module:
    """Int8 weights, activations quantized on the fly, for the given layer types (a copy)."""
    with _quiet():
        if per_channel:
            qconfig = tq.per_channel_dynamic_qconfig
        else:
            qconfig = tq.default_dynamic_qconfig
        spec: dict[Any, Any] = {}
        for t in types:
            cls = DYNAMIC_TYPES[t]
            # per-channel dynamic kernels exist for Linear only; recurrent layers stay per-tensor;
            # embeddings are looked up, not multiplied: int8 rows with a float scale each
            if cls is nn.Embedding:
                spec[cls] = tq.float_qparams_weight_only_qconfig
            else:
                spec[cls] = qconfig if cls is nn.Linear else tq.default_dynamic_qconfig
        for name in float_modules:
            spec[name] = None
    work = copy.deepcopy(model).eval()
    if "linear" in types:
        linearize_conv1d(work, skip=float_modules)
    # a tied embedding + output layer (one matrix) becomes one int8 table, stored once
    groups = tied_groups(work, float_modules) if {"linear", "embedding"} <= set(types) else []
    spec.update({name: None for embs, lins in groups for name in embs + lins})
    with _quiet(), quantized_engine(backend):
        q = tq.quantize_dynamic(work, spec, dtype=torch.qint8, inplace=False)
        tie_int8(q, groups, lambda: dynamic_weight_observer(per_channel))
    return q


def dynamic_weight_observer(per_channel: bool) -> Any:
    """The weight observer torch's dynamic int8 Linear uses (symmetric qint8; per output channel or
    one scale): what the tied int8 table (``tied.Int8Table``) computes its scales with."""
    with _quiet():
        qconfig = tq.per_channel_dynamic_qconfig if per_channel else tq.default_dynamic_qconfig
        return qconfig.weight()


@contextlib.contextmanager
def quantize_context(backend: str) -> Iterator[None]:
    """Where int8 models are built, traced and measured: ``backend``'s kernels for packing and
    running weights, and the MHA fast path off (see :func:`mha_fastpath_disabled`)."""
    with quantized_engine(backend), mha_fastpath_disabled():
        yield
