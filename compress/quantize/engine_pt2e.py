"""The PT2E engine: the ONLY module of ptopt that imports ``torchao`` (the structure test,
``tests/compress/test_structure.py``, holds every module to that).

torchao's PT2E flow, beside the torch.ao engine (``engine_fx``) behind the same kind of boundary::

    torch.export (the InputSpecs' Dims) → prepare_pt2e / prepare_qat_pt2e (X86InductorQuantizer)
      → calibrate (or train, for QAT) → convert_pt2e → an int8 q/dq graph (a GraphModule)
      → ``pt2e_package.compile_int8``: an AOTInductor package whose int8 kernels come from
        Inductor's lowering

The converted graph run eagerly is SLOWER than fp32 (every q/dq is a separate op); its speed comes
from Inductor with freezing, which matches ``dequant → conv/linear → quant`` patterns into oneDNN
int8 kernels (``qconv2d_pointwise``, ``qlinear_pointwise``; a ``+`` residual and a ReLU fused in).

The quantizer is X86InductorQuantizer: uint8 per-tensor affine activations, int8 per-channel
symmetric weights. The scheme's ``observer`` picks the activation observer (histogram, minmax,
percentile; when it names none, ``config.engine_observer``); ``float_modules`` stay float
(``set_module_name_qconfig(name, None)``). Per-tensor weights and dynamic int8 are not offered by this
quantizer's Inductor lowering: refused with the way out (``--engine fx``).

torchao is imported lazily, inside ``core.quiet.quiet_imports``: on a machine without CUDA it is
told not to load its CUDA kernels (``TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1`` for that import only),
and its import notices are dropped; its warnings and log noise while it runs are filtered here
(:func:`_quiet`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ptopt.compress.quantize.config import engine_observer
from ptopt.core.errors import MissingDependencyError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import InputSpec
from ptopt.core.quiet import quiet_imports, silenced

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
    try:
        with quiet_imports(), _quiet():
            from torchao.quantization.pt2e import (
                move_exported_model_to_eval,
                move_exported_model_to_train,
                observer,
            )
            from torchao.quantization.pt2e import quantize_pt2e as flow

            _tolerate_symbolic_expand()  # before the quantizer's import registers the x86 passes
            from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    except ImportError as e:
        raise MissingDependencyError(
            f"--engine pt2e needs torchao (PT2E quantization): pip install 'ptopt[torchao]' ({e})"
        ) from None
    return _Torchao(observer, flow, x86, move_exported_model_to_train, move_exported_model_to_eval)


def _tolerate_symbolic_expand() -> None:
    """The x86 Inductor pass that packs int8 Linear weights checks a Linear on a non-contiguous 3-D
    input (lowered as ``expand`` + ``bmm``) with ``torch.Size(expand's sizes)``; under a dynamic batch
    those sizes hold an fx Node, and the check raises ``TypeError: torch.Size() takes an iterable of
    'int'``, failing the whole AOTInductor compile (LeViT's attention; torch 2.13, torchao 0.18). Both
    copies of that check (torchao's and Inductor's own) are wrapped so that such a Linear is simply not
    fused (it runs as dequantize -> fp32 linear, the same numbers) and the rest compiles. Applied before
    the passes are registered (torchao's on ``x86_inductor_quantizer``'s import, Inductor's on its first
    freezing compile), once per process; a version without this private check runs unchanged."""
    import importlib

    for name in ("torchao.quantization.pt2e.inductor_passes.x86", "torch._inductor.fx_passes.quantization"):
        try:
            passes = importlib.import_module(name)
        except ImportError:
            continue
        original = getattr(passes, "_is_valid_dequant_linear_pattern", None)
        if original is not None and not getattr(original, "ptopt_tolerant", False):
            passes._is_valid_dequant_linear_pattern = _tolerant(original)


def _tolerant(original: Any) -> Any:
    """``original`` (a factory of pattern checks) whose checks answer False where they raise TypeError."""

    def factory(*args: Any, **kwargs: Any) -> Any:
        check = original(*args, **kwargs)

        def inner(match: Any) -> bool:
            try:
                return check(match)
            except TypeError:  # torch.Size() of sizes that hold a dynamic dimension's Node
                return False

        return inner

    factory.ptopt_tolerant = True  # type: ignore[attr-defined]
    return factory


#: torchao's QAT conv-bn passes, each run once per conv kind (conv1d/2d, transposed 1d/2d)
_CONV_BN_PASSES = ("_fuse_conv_bn_qat_helper", "_fold_conv_bn_qat_helper")


@contextlib.contextmanager
def _conv_bn_patterns_present_only() -> Iterator[None]:
    """Run torchao's QAT conv-bn fuse (prepare) and fold (convert) passes only for the conv kinds the
    graph has. Each pass exports its match and replacement patterns (2 to 24 ``torch.export`` calls
    of ~0.2 s each) for conv1d, conv2d, conv_transpose1d and conv_transpose2d whether the graph has
    them or not: 26 s of the 27 s ``convert`` of a small Conv2d CNN. A pass over a graph without its
    conv kind rewrites nothing, so skipping it changes no result (tests/compress/test_pt2e.py checks
    the outputs). A torchao without these private passes runs unchanged."""
    from torchao.quantization.pt2e import qat_utils

    originals = {name: getattr(qat_utils, name, None) for name in _CONV_BN_PASSES}
    for name, original in originals.items():
        if original is not None:
            setattr(qat_utils, name, _skip_absent_conv(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            if original is not None:
                setattr(qat_utils, name, original)


#: torchao's train/eval switches of an exported graph (``move_exported_model_to_eval`` / ``_train``)
_MODE_PASSES = {"_replace_dropout": "dropout", "_replace_batchnorm": "batch_norm"}


@contextlib.contextmanager
def _mode_patterns_present_only() -> Iterator[None]:
    """Run torchao's dropout / batch-norm train<->eval rewrites only on graphs that hold such an op in
    the mode being switched from. Each rewrite exports its match and replacement patterns (12
    ``torch.export`` calls for a switch to eval, whether the graph has those ops or not: most of the
    time ``prepare`` takes on a small model); a graph without them is rewritten to itself. A graph
    whose op's mode cannot be read is rewritten as before."""
    from torchao.quantization.pt2e import export_utils

    originals = {name: getattr(export_utils, name, None) for name in _MODE_PASSES}
    for name, original in originals.items():
        if original is not None:
            setattr(export_utils, name, _skip_absent_mode(original, _MODE_PASSES[name]))
    try:
        yield
    finally:
        for name, original in originals.items():
            if original is not None:
                setattr(export_utils, name, original)


def _skip_absent_mode(helper: Any, kind: str) -> Any:
    def run(m: Any, train_to_eval: bool) -> Any:
        if _has_mode(m, kind, training=train_to_eval) is False:
            return None
        return helper(m, train_to_eval)

    return run


def _has_mode(m: Any, kind: str, training: bool) -> bool | None:
    """Whether the graph has a ``kind`` op (dropout, batch_norm) running in ``training`` mode; None when
    one's mode cannot be read."""
    for node in m.graph.nodes:
        target = str(node.target)
        if node.op != "call_function" or kind not in target:
            continue
        if "no_training" in target:
            flag: Any = False
        else:
            at = 2 if kind == "dropout" else 5
            flag = (
                node.args[at]
                if len(node.args) > at
                else node.kwargs.get("train", node.kwargs.get("training"))
            )
        if not isinstance(flag, bool):
            return None
        if flag == training:
            return True
    return False


def _skip_absent_conv(helper: Any) -> Any:
    def run(m: Any, conv_fn: Any, *args: Any, **kwargs: Any) -> Any:
        kind = f"aten.{conv_fn.__name__}"
        if not any(str(getattr(n.target, "_overloadpacket", "")) == kind for n in m.graph.nodes):
            return m
        return helper(m, conv_fn, *args, **kwargs)

    return run


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
    observer = getattr(scheme, "observer", None) or engine_observer("pt2e")
    if observer not in OBSERVERS:
        raise UsageError(f"unknown observer {observer!r} for --engine pt2e (known: {', '.join(OBSERVERS)})")


def reduce_range() -> bool:
    """7-bit activations on CPUs without VNNI (their int8 dot products saturate 16-bit sums), as
    torchao advises and the FX engine does for x86."""
    from ptopt.core.isa import int8_dot_products

    return not int8_dot_products()


def build_quantizer(scheme: Any, qat: bool = False) -> Any:
    """X86InductorQuantizer for ``scheme``: its activation observer, its float modules."""
    ao = _torchao()
    with _quiet():
        cfg = ao.x86.get_default_x86_inductor_quantization_config(is_qat=qat, reduce_range=reduce_range())
        observer = getattr(scheme, "observer", None) or engine_observer("pt2e")
        if not qat and observer != "histogram":
            ctr = {"minmax": ao.observer.MinMaxObserver, "percentile": _percentile_observer(ao)}[observer]
            act = dataclasses.replace(
                cfg.input_activation, observer_or_fake_quant_ctr=ctr.with_args(eps=2**-12)
            )
            cfg = dataclasses.replace(cfg, input_activation=act, output_activation=act)
        quantizer = ao.x86.X86InductorQuantizer().set_global(cfg)
        for name in getattr(scheme, "float_modules", ()) or ():
            quantizer.set_module_name_qconfig(name, None)
    annotate = quantizer.annotate

    def float_tensors_only(model: Any) -> Any:
        padding_as_numbers(model)
        try:
            model = annotate(model)
        except ValueError as e:  # torchao refuses a pattern it matched (a conv it cannot annotate)
            raise UnsupportedModelError(
                f"PT2E int8 cannot annotate this model: X86InductorQuantizer says {e}; --engine openvino "
                "(NNCF) or --mode dynamic still work"
            ) from e
        drop_integer_annotations(model)
        return model

    quantizer.annotate = float_tensors_only
    return quantizer


def padding_as_numbers(model: Any) -> None:
    """``nn.Conv2d(..., padding="valid")`` (SigLIP's patch embedding) or ``"same"`` exports as
    ``aten.conv2d.padding``, which X86InductorQuantizer refuses ("conv2d is not an aten conv2d operator").
    "valid" is no padding and "same" with an even padding total is ``dilation * (kernel - 1) / 2`` a side:
    those nodes become ``aten.conv2d.default`` with that padding, the same computation."""
    import torch

    changed = False
    for node in model.graph.nodes:
        if node.op != "call_function" or node.target != torch.ops.aten.conv2d.padding or node.kwargs:
            continue
        args = list(node.args) + [None, [1, 1], "valid", [1, 1], 1][len(node.args) - 2 :]
        weight = getattr(args[1], "meta", {}).get("val")
        pads = _numeric_padding(args[4], args[5], None if weight is None else tuple(weight.shape[2:]))
        if pads is None:
            continue
        args[4] = pads
        node.target, node.args = torch.ops.aten.conv2d.default, tuple(args)
        changed = True
    if changed:
        model.graph.lint()
        model.recompile()


def _numeric_padding(padding: Any, dilation: Any, kernel: tuple[int, ...] | None) -> list[int] | None:
    """A conv's string padding as numbers, or None when it cannot be one number a side."""
    if padding == "valid":
        return [0, 0]
    if padding != "same" or kernel is None:
        return None
    dilation = list(dilation) * (len(kernel) // len(dilation))
    totals = [d * (k - 1) for d, k in zip(dilation, kernel, strict=True)]
    return None if any(t % 2 for t in totals) else [t // 2 for t in totals]


def drop_integer_annotations(model: Any) -> None:
    """X86InductorQuantizer annotates ``add`` (and other ops) whatever their dtype: RoBERTa's position
    ids (``cumsum(input_ids != pad) + pad``) are integer adds, and an observer on them stops prepare
    with ``"histogram_cpu" not implemented for 'Int'``. Quantization applies to floating tensors only:
    annotations of integer inputs and outputs are removed."""
    import torch

    def floating(node: Any) -> bool:
        val = node.meta.get("val") if hasattr(node, "meta") else None
        return not isinstance(val, torch.Tensor) or val.dtype.is_floating_point

    for node in model.graph.nodes:
        note = node.meta.get("quantization_annotation")
        if note is None:
            continue
        note.input_qspec_map = {a: q for a, q in note.input_qspec_map.items() if floating(a)}
        if not floating(node):
            note.output_qspec = None


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
    from ptopt.compress.quantize.layers import check_module_names

    check_scheme(scheme, "qat" if qat else "static")
    ao = _torchao()
    quantizer = build_quantizer(scheme, qat)
    check_module_names(module, getattr(scheme, "float_modules", ()) or ())
    if graph is None:
        graph = capture(module, specs, style, example)
    one_partition_per_call(graph)
    layer_ops_as_layers(graph)
    with _quiet(), _conv_bn_patterns_present_only(), _mode_patterns_present_only():
        prepared = (ao.flow.prepare_qat_pt2e if qat else ao.flow.prepare_pt2e)(graph, quantizer)
        (ao.to_train if qat else ao.to_eval)(prepared)
    return prepared


def one_partition_per_call(graph: Any) -> None:
    """Give each call of a module called more than once its own name in the captured graph's
    ``nn_module_stack`` (``layer1.0.relu`` -> ``layer1.0.relu@1`` for the second call).

    torch.export without strict mode records no ``source_fn_stack``, so the quantizer's pattern
    matcher groups ops by their innermost module: torchvision's BasicBlock applies ``self.relu``
    twice, the two calls become one partition with two outputs, and X86InductorQuantizer stops with
    "Input partition has more than one output node". Each call is a connected run of the module's
    ops; the first keeps the module's name (what ``float_modules`` and ``int8_modules`` read)."""
    groups: dict[str, list[Any]] = {}
    for node in graph.graph.nodes:
        stack = node.meta.get("nn_module_stack") if node.op == "call_function" else None
        if stack:
            groups.setdefault(list(stack.values())[-1][0], []).append(node)
    for fqn, nodes in groups.items():
        members = set(nodes)
        if sum(any(u not in members for u in n.users) for n in nodes) < 2:
            continue
        call: dict[Any, int] = {}
        for node in nodes:  # graph order: a node joins the call of an input it takes from this module
            mine = [call[a] for a in node.all_input_nodes if a in call]
            call[node] = mine[0] if mine else len(set(call.values()))
            if call[node]:
                stack = dict(node.meta["nn_module_stack"])
                key = list(stack)[-1]
                stack[key] = (f"{fqn}@{call[node]}", stack[key][1])
                node.meta["nn_module_stack"] = stack


def layer_ops_as_layers(graph: Any) -> None:
    """Mark every convolution and linear op of the captured graph as its layer's call
    (``source_fn_stack``), whatever module made it.

    The quantizer finds the ops it makes int8 by the module that ran them, compared by exact class:
    a subclass of ``nn.Conv2d`` (EfficientNet-Lite's ``Conv2dStaticSamePadding``, all 65 of its
    convolutions) or a parent calling ``F.linear`` with its child's weight (torchvision's Swin
    attention) was left float, and EfficientNet-Lite0's "int8" package held its weights in fp32
    (0.9x the fp32 file). Each op is its own call, named after its node."""
    import torch

    layers = {
        torch.ops.aten.conv1d.default: torch.nn.Conv1d,
        torch.ops.aten.conv2d.default: torch.nn.Conv2d,
        torch.ops.aten.conv3d.default: torch.nn.Conv3d,
        torch.ops.aten.linear.default: torch.nn.Linear,
    }
    for node in graph.graph.nodes:
        layer = layers.get(node.target) if node.op == "call_function" else None
        if layer is not None and not node.meta.get("source_fn_stack"):
            node.meta["source_fn_stack"] = [(node.name, layer)]


def copy_graph(graph: Any) -> Any:
    """A copy of a captured graph to prepare again (prepare changes its graph in place); quiet:
    copying an exported module warns about pytree internals."""
    import copy

    with _quiet():
        return copy.deepcopy(graph)


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
    with _quiet(), _mode_patterns_present_only():
        (ao.to_train if training else ao.to_eval)(prepared)


def convert(prepared: Any) -> Any:
    """Observed / fake-quant graph → the int8 q/dq graph (eval mode), holding only the tensors it reads
    (:func:`drop_unread`)."""
    ao = _torchao()
    with _quiet(), _conv_bn_patterns_present_only(), _mode_patterns_present_only():
        converted = ao.flow.convert_pt2e(prepared)
        ao.to_eval(converted)
    return drop_unread(converted)


def drop_unread(graph: Any) -> Any:
    """``graph`` without the parameters and buffers no node reads. ``convert_pt2e`` folds each weight's
    quantize into an int8 constant and leaves the fp32 weight attached, unread: torch.export lifts every
    attached tensor into the program, so the ``.pt2`` carried the fp32 weights beside their int8 copies
    (a 2-layer BERT's ExportedProgram: 1.42x its fp32 TorchScript)."""
    for node in list(graph.graph.nodes):
        if node.op == "get_attr" and not node.users:
            graph.graph.erase_node(node)
    read = {str(n.target) for n in graph.graph.nodes if n.op == "get_attr"}
    named = [*graph.named_parameters(remove_duplicate=False), *graph.named_buffers(remove_duplicate=False)]
    for name, _ in named:
        if name in read or any(r.startswith(name + ".") for r in read):
            continue
        owner_name, _, leaf = name.rpartition(".")
        owner = graph.get_submodule(owner_name) if owner_name else graph
        owner._parameters.pop(leaf, None)
        owner._buffers.pop(leaf, None)
    graph.recompile()
    return graph


def quantize_static(
    module: Any,
    specs: Sequence[InputSpec],
    style: str,
    scheme: Any,
    batches: Iterable[Any],
    example: Any = None,
    graph: Any = None,
) -> Any:
    """prepare → calibrate → convert: the int8 q/dq GraphModule (run it fast through
    ``pt2e_package.compile_int8``).
    ``graph``: a :func:`capture` of ``module`` to reuse (consumed)."""
    from ptopt.compress.quantize import observed

    prepared, batches = prepare(module, specs, style, scheme, example=example, graph=graph), list(batches)
    first = batches[0] if batches else None
    if observed.calibrated(prepared, lambda: first, lambda: calibrate(prepared, batches), "pt2e") == 0:
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
