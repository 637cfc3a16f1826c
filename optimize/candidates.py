"""The candidate catalogue of ``ptopt optimize``: every artifact it may build, promising and cheap first.

Each candidate is built by the stages' own functions (``ptopt.export``, ``ptopt.quantize``,
``ptopt.prune``, ``autoquantize``): no second implementation of any technique lives here. A
:class:`Spec` is one row of the table, every field named: what a candidate is (technique, format,
runtime, engine, precision), what it needs to apply (``needs``: names of the ``NEEDS`` table, each
saying why it is missing), roughly what it costs to build, and how to build it into a stage ``Result``.

======================  ==========================================================  ==================
name                    built by                                                    when
======================  ==========================================================  ==================
fp32-eager              the model itself (the reference every speedup divides)      always
fp32-openvino           ``export(target="openvino")``                               openvino + nncf
bf16-openvino           ``export(target="openvino", precision="bf16")``             + bf16 kernels
int8-openvino           ``export(target="openvino", precision="int8", data=calib)`` openvino + nncf
int8-onnx-dynamic       ``export(target="onnx", precision="int8",                   Linear-heavy
                        int8_method="ort_dynamic")``
int8-openvino-float-    ``export(target="openvino", precision="int8",               int8-openvino
layers                  float_modules=...)``, the fewest layers ranked by their     rejected
                        int8 error in PyTorch (``optimize.float_layers``)
int8-openvino-search    ``export(target="openvino", precision="int8",               int8-openvino
                        accuracy_control=True)`` (NNCF's accuracy control)          rejected, the above
                                                                                    not kept
fp32-torchscript        ``export(target="torchscript")``                            always
fp32-exported-program   ``export(target="exported_program")``                       always
fp32-onnx               ``export(target="onnx")``                                   always
int8-fx                 ``quantize(mode="static", engine="fx")``                    always
int8-onnx-qdq           ``export(target="onnx", precision="int8", data=calib)``     always
int8-dynamic            ``quantize(mode="dynamic")``                                Linear-heavy
fp32-aoti               ``export(target="aoti", static_batches=batch sizes)``       a C++ compiler
int8-pt2e               ``quantize(mode="static", engine="pt2e")`` (AOTInductor)    torchao, compiler
int8-dynamic-search     ``autoquantize`` (dynamic int8, SmoothQuant/float layers)   int8-dynamic rej.
int8-fx-float-layers    ``autoquantize`` (int8 with the layers that must stay       int8-fx rejected
                        float kept float)
pruned30-ft             ``prune("structured", 0.3, fine_tune_data=train)``          ``train_data``
pruned30-ft-int8        the above, then ``quantize(mode="static")``                 ``train_data``
======================  ==========================================================  ==================

On a GPU (``--device cuda``, ``Spec.devices``) the catalogue is another: the fp32 reference and fp32 torch
formats, then ``fp16-``/``bf16-torchscript``, ``fp16-``/``bf16-exported-program``, ``fp16-onnx-cuda`` (ONNX
Runtime's CUDA provider), ``fp16-compiled-graphs`` (the fp16 ExportedProgram through
``torch.compile(mode="reduce-overhead")``: reported, not packageable), ``fp16-aoti``, ``fp16-aoti-graphs``
(the same package replayed as CUDA graphs) and ``bf16-aoti``; each built with ``export(..., device=)``.

The runtimes users would pick instead come first (OpenVINO fp32, bf16 and NNCF int8, ONNX Runtime's
``quantize_dynamic``), then the refinements of NNCF int8 when it was rejected (float layers, NNCF's
accuracy control): when the time budget runs short, they are the ones still tried. On all-MiniLM-L6-v2
the torch fp32 formats, built first, took 55 s and left no room for the float-layer search that beats every
peer; earlier, the FX and dynamic int8 builds (50 s and 225 s, both rejected) left none for NNCF int8. The
slow builds come last: AOTInductor compiles (a minute or more each on a real model) and the
accuracy-aware searches (all-MiniLM-L6-v2: 261 s and 653 s); a search whose plain build a kept candidate
already outruns is skipped (``ceiling``, ``search.Search._dominated``).

A build that breaks the accuracy rule raises :class:`Rejected` (the stage's own fidelity check, a
ParityError, or autoquant finding nothing within the goal); a missing optional backend
(MissingDependencyError) makes the candidate *skipped*; any other error makes it *failed*.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

#: the structured-pruning amount and the fine-tune epochs of the training candidates
PRUNE_AMOUNT = 0.3
FINE_TUNE_EPOCHS = 1
#: stages of the search: candidates are built in this order (promising and cheap before slow)
STAGES = (
    "the runtimes users pick instead (OpenVINO fp32 / bf16 / NNCF int8, ONNX Runtime's dynamic int8), refined",
    "the torch and ONNX Runtime formats, fp32 and int8",
    "slow builds: compilers and searches",
    "training",
)


def runtime_filters() -> dict[str, tuple[str, ...] | None]:
    """``--runtime`` value -> the candidate runtimes it admits: ``any``, and each runtime family of the
    catalogue's formats (``torch`` admits AOTInductor, PyTorch's own compiled runtime)."""
    families: dict[str, tuple[str, ...] | None] = {"any": None}
    for spec in CATALOGUE:
        family = spec.row.runtime
        families[family] = tuple(dict.fromkeys([*(families.get(family) or ()), spec.runtime]))
    return families


class Rejected(Exception):
    """A built candidate that the accuracy rule turned down while it was being built."""


@dataclasses.dataclass
class Context:
    """What every build reads: the fp32 source, the data (as given, for the sidecars), the goal."""

    module: Any
    calib: Any
    evald: Any
    train: Any
    input_shapes: Any
    max_accuracy_drop: float | None
    min_cosine: float | None
    #: seconds left in the time budget (autoquant's tuning budget)
    seconds_left: Callable[[], float]
    #: name -> status of the candidates seen so far
    status: dict[str, str] = dataclasses.field(default_factory=dict)
    #: name -> Result of built candidates (a chain builds on an earlier one)
    built: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: name -> seconds its build took (what the accuracy-aware search's cost is estimated from)
    build_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    #: the batch sizes the search times (``--batch-size``): the AOTInductor package gets a fixed-batch
    #: model for each (``export --static-batch``)
    batch_sizes: tuple[int, ...] = ()
    #: where the candidates are built and run (``--device``): ``cpu`` or ``cuda:N``
    device: str = "cpu"
    #: seconds of one fp32 eager pass over the eval data (the search's estimate): what a sensitivity pass
    #: costs per layer, one such pass over its samples
    eval_pass_s: Callable[[], float] = lambda: 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec:
    """One candidate of the catalogue (see the module docstring)."""

    name: str
    label: str
    technique: str
    #: the ``export --target`` its artifact is (``eager`` for the reference)
    format: str
    engine: str | None
    precision: str
    stage: int
    steps: tuple[str, ...]
    build: Callable[[Context], Any] | None
    #: estimated build cost, in units of the fp32 TorchScript build (``fixed`` seconds on top); set from
    #: builds of the zoo ResNet on the shared 2-core machine (TorchScript 2.3 s, ONNX 26 s, FX int8 28 s,
    #: ONNX QDQ 37 s, AOTInductor ~3 min while other jobs loaded it)
    cost: float = 1.0
    fixed: float = 0.0
    #: what the candidate needs of this model, these inputs and this machine: names of ``NEEDS`` (each says
    #: why it is missing, or nothing), or ``built:NAME`` (a candidate of the catalogue built already)
    needs: tuple[str, ...] = ()
    #: the candidate this one cannot run faster than (a search that keeps layers of that plain int8 build
    #: float): skipped when a kept candidate is already much faster than it (``Search._dominated``)
    ceiling: str | None = None
    #: the device kinds it is a candidate on (``--device``): the CPU catalogue, the GPU one, or both
    devices: tuple[str, ...] = ("cpu",)
    #: its artifact runs through ``torch.compile(mode=...)`` (the runtime, not the file: not packageable)
    compile_mode: str | None = None

    @property
    def row(self) -> Any:
        """The artifact's format (its row of ``ptopt.core.formats``)."""
        from ptopt.core.formats import format_for_target, get_format

        return get_format("eager") if self.format == "eager" else format_for_target(self.format)

    @property
    def runtime(self) -> str:
        return self.row.runs_on + (f" + torch.compile ({self.compile_mode})" if self.compile_mode else "")

    @property
    def suffix(self) -> str:
        return self.row.suffix

    @property
    def packageable(self) -> bool:
        """``ptopt package`` takes the artifact as it is (TorchServe runs its format; not one measured
        through ``torch.compile``, which the server would run without)."""
        return "torchserve" in self.row.servers and self.compile_mode is None

    def not_applicable(self, ctx: Context) -> str | None:
        """Why the candidate does not apply here (its first unmet need), or None."""
        for need in self.needs:
            name = need.removeprefix("built:")
            if need.startswith("built:"):
                why = (
                    None
                    if name in ctx.built
                    else f"{name} was not built (this candidate replays its package)"
                )
            else:
                why = NEEDS[need](ctx)
            if why:
                return why
        return None


# -- builds: one call into a stage each ------------------------------------------------------------


def _export(target: str, precision: str | None = None, **options: Any) -> Callable[[Context], Any]:
    def build(ctx: Context) -> Any:
        from ptopt.core.errors import UsageError
        from ptopt.core.inputspec import DEFAULT_MAX_BATCH
        from ptopt.export.api import export

        shapes = ctx.input_shapes or None
        kwargs = dict(data=ctx.calib, input_shapes=shapes, precision=precision, **options)
        if ctx.device != "cpu":
            kwargs["device"] = ctx.device
        if precision not in (None, "fp32"):  # a lossy artifact is accepted by the user's budget
            kwargs.update(_budget(ctx))
        largest = max(ctx.batch_sizes, default=0)
        if largest > DEFAULT_MAX_BATCH and shapes is None:  # a batch range that holds every timed batch size
            kwargs["dynamic_batch"] = f"1:{DEFAULT_MAX_BATCH}:{largest}"
        if target == "aoti":  # a fixed-batch model per timed batch size (in the batch range)
            fixed = [b for b in ctx.batch_sizes if b <= max(largest, DEFAULT_MAX_BATCH)]
            try:
                return export(ctx.module, target, static_batches=fixed, **kwargs)
            except UsageError:  # e.g. the model declares a narrower batch range: the dynamic model alone
                pass  # (any other bad input is refused again just below)
        return export(ctx.module, target, **kwargs)

    return build


def _quantize(mode: str, engine: str | None = None, source: str | None = None) -> Callable[[Context], Any]:
    def build(ctx: Context) -> Any:
        from ptopt.compress.quantize import quantize
        from ptopt.core.errors import ParityError

        module = ctx.module if source is None else ctx.built[source].model
        try:  # dynamic int8 reads the calibration data only as the example its fidelity check runs on
            return quantize(
                module, mode, calib_data=ctx.calib, engine=engine, input_shapes=ctx.input_shapes or (),
                progress=None,  # the search reports the build; its steps (calibration) show inside
                advice=False,  # the layers to keep float: the float-layer candidates, under the time budget
            )  # fmt: skip
        except ParityError as e:
            return _within_budget(ctx, e)

    return build


def _within_budget(ctx: Context, err: Any) -> Any:
    """An int8 model the default rule refused, kept when the user's own budget takes it (the search then
    judges it on the held-out data like every candidate); else the refusal stands."""
    result = getattr(err, "result", None)
    fid = (result.metrics.get("vs_fp32") or {}) if result is not None else {}
    budget = _budget(ctx).get("min_cosine")
    if budget is None or fid.get("min_cosine") is None or fid["min_cosine"] < budget:
        raise err
    result.template.extra["accepted_by"] = (
        f"the user's budget (worst-sample cosine {fid['min_cosine']:.4f} >= {budget}); the default int8 "
        f"rule refused it: {str(err).split(';')[0][:200]}"
    )
    return result


def _autoquant(mode: str) -> Callable[[Context], Any]:
    """The accuracy-aware search of ``mode`` int8 (float layers; SmoothQuant in dynamic mode) under the
    user's budget, fitted on part of the search's eval data (optimize accepts it on its held-out part)."""

    def build(ctx: Context) -> Any:
        return _search(ctx, mode)

    return build


def _search(ctx: Context, mode: str) -> Any:
    from ptopt.compress.quantize.autoquant import autoquantize

    seconds = max(10, int(ctx.seconds_left() * 0.5))
    found = autoquantize(
        ctx.module,
        mode,
        engine="fx",  # int8-fx-float-layers / int8-dynamic-search: TorchScript (static's default is auto)
        eval_data=ctx.evald,
        calib_data=ctx.calib if mode == "static" else None,
        accuracy_budget=ctx.max_accuracy_drop,
        min_cosine=ctx.min_cosine,
        tuning_budget=f"{seconds}s",
        input_shapes=ctx.input_shapes or (),
        progress=None,
    )
    if not found.met:
        raise Rejected(f"no {mode} int8 configuration the search tried met the goal ({found.reason})")
    return found.result


def _openvino_search(ctx: Context) -> Any:
    """NNCF's accuracy-aware int8 (``export --accuracy-control``) under the user's budget, validated on the
    search's half of the eval data (optimize accepts it on the held-out half, like every candidate)."""
    from ptopt.core.data import split_eval
    from ptopt.export.api import export

    select = split_eval(ctx.evald)[0]
    goal = _budget(ctx)
    if ctx.max_accuracy_drop is not None:
        # top-1 on the samples NNCF is fitted on: it aims at half the allowed drop there
        goal["accuracy_budget"] = ctx.max_accuracy_drop / 2
    else:
        # NNCF's metric is the worst cosine projected to 1000 samples (ptopt.core.tail), as the held-out
        # acceptance; it aims one standard error of that projection (1/sqrt(n) of the allowed deviation)
        # inside the budget, so that what just holds on the samples it chose by holds on the others too
        goal["min_cosine"] = 1 - (1 - ctx.min_cosine) / (1 + 1 / math.sqrt(max(len(select), 1)))
    return export(
        ctx.module, "openvino", data=ctx.calib, precision="int8", accuracy_control=True,
        validation_data=select, input_shapes=ctx.input_shapes or None, **goal,
    )  # fmt: skip


def _openvino_float_layers(ctx: Context) -> Any:
    """NNCF int8 with the fewest most-harmful layers float that holds the goal on the search's half of the
    eval data (``optimize.float_layers``), written by ``export --exclude``; optimize accepts it on the
    held-out half like every candidate."""
    from ptopt.core.data import split_eval
    from ptopt.export.api import export
    from ptopt.optimize.float_layers import OutOfTime, Trials, fewest_float_layers, sensitivity

    select = split_eval(ctx.evald)[0]
    one_build = ctx.build_seconds.get(
        "int8-openvino", 0.0
    )  # what the ranking leaves: one NNCF build at least
    try:
        ranked = sensitivity(
            ctx.module, ctx.calib, select, seconds_left=lambda: ctx.seconds_left() - one_build
        )
    except OutOfTime as e:
        raise Rejected(f"time budget: {e}") from None
    ranked = [name for name, _ in ranked]
    trials = Trials(ctx, select)
    try:
        k, log = fewest_float_layers(trials, ranked, ctx.seconds_left)
    finally:
        trials.close()
    if k is None and not log:
        raise Rejected(
            f"ranking {len(ranked)} layers left no time for an NNCF build ({ctx.seconds_left():.0f} s left)"
        )
    if k is None:
        raise Rejected(f"no number of float layers tried held on the search's samples ({'; '.join(log)})")
    res = export(
        ctx.module, "openvino", data=ctx.calib, precision="int8", float_modules=ranked[:k],
        input_shapes=ctx.input_shapes or None, **_budget(ctx),
    )  # fmt: skip
    res.template.extra["float_layers_search"] = {
        "goal": trials.goal,
        "ranked": ranked[: max(k, 8)],
        "trials": log,
    }
    return res


def _prune(ctx: Context) -> Any:
    from ptopt.compress.prune import prune

    return prune(
        ctx.module,
        "structured",
        PRUNE_AMOUNT,
        fine_tune_data=ctx.train,
        epochs=FINE_TUNE_EPOCHS,
        # unlabelled training data (a sentence encoder's text): distilled from the unpruned model, whose
        # output width it then keeps
        teacher=None if ctx.train.has_labels else "self",
        input_shapes=ctx.input_shapes or (),
        progress=None,
    )


# -- when a candidate applies ----------------------------------------------------------------------


def _budget(ctx: Context) -> dict[str, Any]:
    """The build's own check of a lossy artifact under the user's budget: their worst-sample cosine, or
    with an accuracy budget none at all (the search judges accuracy on the eval data); the parity
    numbers are recorded either way, and the report shows the default rule's verdict beside."""
    if ctx.min_cosine is not None:
        return {"min_cosine": ctx.min_cosine}
    return {"min_cosine": -1.0} if ctx.max_accuracy_drop is not None else {}


def _linear_heavy(ctx: Context) -> str | None:
    """Most computing parameters in Linear/LSTM/GRU layers: what dynamic int8 of the matrix products
    speeds up. Embedding tables are looked up, not multiplied: they are left out of the count (a
    sentence encoder's vocabulary is as large as all its Linear layers together)."""
    from torch import nn

    kinds = (nn.Linear, nn.LSTM, nn.GRU)
    lookups = sum(
        p.numel() for m in ctx.module.modules() if isinstance(m, nn.Embedding) for p in m.parameters(False)
    )
    total = (sum(p.numel() for p in ctx.module.parameters()) - lookups) or 1
    share = sum(p.numel() for m in ctx.module.modules() if isinstance(m, kinds) for p in m.parameters(False))
    if share / total >= 0.5:
        return None
    return (
        f"only {share / total:.0%} of the parameters outside embedding tables are in Linear/LSTM/GRU layers: "
        "dynamic int8 gains little"
    )


def _openvino(ctx: Context) -> str | None:
    from ptopt.core.errors import MissingDependencyError
    from ptopt.formats.openvino import require_openvino

    try:
        require_openvino(nncf=True)
    except MissingDependencyError as e:
        return str(e)
    return None


def _openvino_bf16(ctx: Context) -> str | None:
    """OpenVINO and a CPU plugin with bf16 kernels (avx512_bf16 or AMX)."""
    from ptopt.core.errors import UsageError
    from ptopt.formats.openvino import check_bf16

    why = _openvino(ctx)
    if why is None:
        try:
            check_bf16()
        except UsageError as e:
            why = str(e)
    return why


def _dynamic_int8(ctx: Context) -> str | None:
    """The one rule of every dynamic int8 candidate (TorchScript and ONNX Runtime): layers it
    quantizes, and most computing parameters in them (:func:`_linear_heavy`)."""
    from torch import nn

    kinds = (nn.Linear, nn.LSTM, nn.GRU)
    if not any(isinstance(m, kinds) for m in ctx.module.modules()):
        return "no Linear/LSTM/GRU layer: dynamic int8 has nothing to quantize"
    return _linear_heavy(ctx)


def _compiler(ctx: Context) -> str | None:
    from ptopt.core.errors import MissingDependencyError
    from ptopt.formats.aoti_compile import check_compiler

    try:
        check_compiler()
    except MissingDependencyError as e:
        return str(e)
    return None


def _bf16_gpu(ctx: Context) -> str | None:
    """bf16 needs a GPU with bfloat16 kernels (Ampere and later)."""
    import torch

    if torch.cuda.is_bf16_supported():
        return None
    return f"{torch.cuda.get_device_name(ctx.device)} has no bfloat16 kernels (an Ampere or later GPU has)"


def _bf16_aoti(ctx: Context) -> str | None:
    return _bf16_gpu(ctx) or _compiler(ctx)


def _ort_cuda(ctx: Context) -> str | None:
    """ONNX Runtime with its CUDA execution provider (the onnxruntime-gpu build)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed (pip install onnxruntime-gpu)"
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return None
    return (
        f"onnxruntime {ort.__version__} here has no CUDAExecutionProvider (only "
        f"{', '.join(ort.get_available_providers())}): pip install onnxruntime-gpu"
    )


def _graphs_of(name: str) -> Callable[[Context], Any]:
    """The AOTInductor package ``name`` built already, replayed as CUDA graphs: the same file, its sidecar
    marked ``cuda_graphs`` (what ptopt's loaders read to wrap it in ``ptopt.core.cudagraph``; what ``export
    --cuda-graphs`` writes, without compiling the package again)."""

    def build(ctx: Context) -> Any:
        res = copy.copy(ctx.built[name])
        res.template = dataclasses.replace(res.template, extra={**res.template.extra, "cuda_graphs": True})
        res.artifact = None
        return res

    return build


def _reuse(name: str, build: Callable[[Context], Any]) -> Callable[[Context], Any]:
    """The artifact ``name`` built already (another runtime of the same file), else ``build``."""

    def reuse(ctx: Context) -> Any:
        return ctx.built[name] if name in ctx.built else build(ctx)

    return reuse


def _pt2e(ctx: Context) -> str | None:
    from ptopt.core.features import check_torchao

    feature = check_torchao()
    if not feature.available:
        return f"torchao is not installed ({feature.fix})"
    return _compiler(ctx)


def _after_fx_rejected(ctx: Context) -> str | None:
    status = ctx.status.get("int8-fx")
    if status == "rejected":
        return _search_fits(ctx, "int8-fx", "static")
    return f"plain static int8 (int8-fx) was {status or 'not tried'}, not rejected: no float layers needed"


#: the samples autoquant's sensitivity pass measures each layer on (``AccuracyGoal.sensitivity_samples``)
SENSITIVITY_SAMPLES = 256
#: a layer's share of a plain int8 build in a sensitivity pass: a quantized copy of the model, not scripted,
#: checked or written (all-MiniLM-L6-v2: the plain build, halved, priced 36 layers at 7411 s)
QUANTIZE_SHARE = 0.1


def _per_layer_s(ctx: Context, samples: int, plain_build_s: float) -> float:
    """One layer of a sensitivity pass: an fp32-eager-sized pass over ``samples`` of the eval data, and a
    share of the plain int8 build (a quantized copy: ``QUANTIZE_SHARE``)."""
    return ctx.eval_pass_s() * samples / max(len(ctx.evald), 1) + QUANTIZE_SHARE * plain_build_s


def _search_fits(ctx: Context, plain: str, mode: str) -> str | None:
    """The accuracy-aware search first quantizes each layer alone (its sensitivity): about one plain
    int8 build per quantizable layer. Skipped, with the estimate, when that does not fit the time left."""
    from torch import nn

    kinds = (
        (nn.Linear, nn.LSTM, nn.GRU) if mode == "dynamic" else (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    )
    layers = sum(isinstance(m, kinds) for m in ctx.module.modules())
    need = layers * _per_layer_s(
        ctx, min(SENSITIVITY_SAMPLES, len(ctx.evald)), ctx.build_seconds.get(plain, 0.0)
    )
    left = ctx.seconds_left()
    if need <= left:
        return None
    return f"time budget: its sensitivity pass ({layers} layers) needs about {need:.0f} s, {left:.0f} s left"


def _after_openvino_rejected(ctx: Context) -> str | None:
    """After a rejected int8-openvino, when NNCF's accuracy control fits the time left and the ranked
    float-layer search found nothing: it ranks the quantized ops by reverting each and recompiling (about
    one plain int8 build per layer: all-MiniLM-L6-v2's 36 took 19 minutes on 2 busy cores), then
    reverts the worst until the goal holds."""
    from torch import nn

    status = ctx.status.get("int8-openvino")
    if status != "rejected":
        return (
            f"plain OpenVINO int8 (int8-openvino) was {status or 'not tried'}, not rejected: no search needed"
        )
    if ctx.status.get("int8-openvino-float-layers") == "kept":
        return "int8-openvino-float-layers holds the budget already (NNCF's accuracy control ranks the same ops, slower)"
    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    layers = sum(isinstance(m, kinds) for m in ctx.module.modules())
    need = ctx.build_seconds.get("int8-openvino", 0.0) * (1 + layers)
    left = ctx.seconds_left()
    if need <= left:
        return None
    return f"time budget: NNCF's accuracy control ({layers} layers to rank) needs about {need:.0f} s, {left:.0f} s left"


def _float_layers_fit(ctx: Context) -> str | None:
    """After a rejected int8-openvino, when the ranked float-layer search fits the time left: a PyTorch pass
    per layer, up to ``MAX_TRIALS`` NNCF builds (cheaper than the plain export: no conversion, no parity
    check) and the final export; about four plain int8 builds."""
    from ptopt.optimize.float_layers import layer_kinds

    status = ctx.status.get("int8-openvino")
    if status != "rejected":
        return f"plain OpenVINO int8 (int8-openvino) was {status or 'not tried'}, not rejected: no float layers needed"
    layers = sum(isinstance(m, layer_kinds()) for m in ctx.module.modules())
    if not layers:
        return "no Linear or Conv layer to keep float"
    # the ranking: the reference's outputs and one pass per layer over the search's half of the eval data
    ranking = (layers + 1) * ctx.eval_pass_s() / 2
    need, left = ranking + ctx.build_seconds.get("int8-openvino", 0.0) * 4, ctx.seconds_left()
    if need <= left:
        return None
    return (
        f"time budget: the float-layer search (ranking {layers} layers, about {ranking:.0f} s, then NNCF "
        f"builds) needs about {need:.0f} s, {left:.0f} s left"
    )


def _after_dynamic_rejected(ctx: Context) -> str | None:
    status = ctx.status.get("int8-dynamic")
    if status == "rejected":
        return _search_fits(ctx, "int8-dynamic", "dynamic")
    return f"plain dynamic int8 (int8-dynamic) was {status or 'not tried'}, not rejected: no search needed"


def _needs_train(ctx: Context) -> str | None:
    return None if ctx.train is not None else "no --train-data: pruning needs a fine-tune"


def _after_pruned(ctx: Context) -> str | None:
    return None if "pruned30-ft" in ctx.built else "pruned30-ft was not built"


_PRUNE_STEP = (
    f"prune --method structured --amount {PRUNE_AMOUNT} --epochs {FINE_TUNE_EPOCHS} (--teacher self when "
    "--train-data has no labels)"
)


def _gpu(
    name: str, *, label: str, target: str, precision: str, cost: float, fixed: float = 0.0,
    needs: tuple[str, ...] = (), **options: Any,
) -> Spec:  # fmt: skip
    """A row of the GPU catalogue: ``export --target TARGET --precision P --device cuda`` (stage 1, or 2 for
    AOTInductor: the slow builds)."""
    flags = "".join(f" --{k.replace('_', '-')}" for k, v in options.items() if v is True)
    step = f"export --target {target} --precision {precision} --device cuda{flags}"
    stage = 2 if target == "aoti" else 1
    build = _export(target, precision, **options)
    return Spec(
        name=name,
        label=label,
        technique=precision,
        format=target,
        engine=None,
        precision=precision,
        stage=stage,
        steps=(step,),
        build=build,
        cost=cost,
        fixed=fixed,
        needs=needs,
        devices=('cuda',),
    )  # fmt: skip


#: what a candidate may need (``Spec.needs``), each saying why it is missing here (None: it is there)
NEEDS: dict[str, Callable[[Context], str | None]] = {
    "openvino": _openvino,
    "openvino-bf16": _openvino_bf16,
    "dynamic-int8": _dynamic_int8,
    "pt2e": _pt2e,
    "compiler": _compiler,
    "bf16-gpu": _bf16_gpu,
    "bf16-aoti": _bf16_aoti,
    "ort-cuda": _ort_cuda,
    "train-data": _needs_train,
    "pruned-built": _after_pruned,
    "float-layers-fit": _float_layers_fit,
    "openvino-int8-rejected": _after_openvino_rejected,
    "int8-dynamic-rejected": _after_dynamic_rejected,
    "int8-fx-rejected": _after_fx_rejected,
}


CATALOGUE: tuple[Spec, ...] = (
    Spec(
        name="fp32-eager",
        label="fp32 eager (reference)",
        technique="fp32",
        format="eager",
        engine=None,
        precision="fp32",
        stage=0,
        steps=(),
        build=None,
        cost=0,
        devices=("cpu", "cuda"),
    ),  # fmt: skip
    Spec(
        name="fp32-openvino",
        label="fp32 OpenVINO",
        technique="fp32",
        format="openvino",
        engine=None,
        precision="fp32",
        stage=0,
        steps=("export --target openvino",),
        build=_export("openvino"),
        cost=6,
        needs=("openvino",),
    ),
    Spec(
        name="bf16-openvino",
        label="bf16 OpenVINO (the CPU plugin's bf16 kernels)",
        technique="bf16",
        format="openvino",
        engine=None,
        precision="bf16",
        stage=0,
        steps=("export --target openvino --precision bf16",),
        build=_export("openvino", "bf16"),
        cost=6,
        needs=("openvino-bf16",),
    ),
    Spec(
        name="int8-openvino",
        label="static int8, NNCF (OpenVINO)",
        technique="static-int8",
        format="openvino",
        engine="nncf",
        precision="int8",
        stage=0,
        steps=("export --target openvino --precision int8 --data CALIB",),
        build=_export("openvino", "int8"),
        cost=15,
        needs=("openvino",),
    ),
    Spec(
        name="int8-onnx-dynamic",
        label="dynamic int8 (matrix products), ONNX Runtime",
        technique="dynamic-int8",
        format="onnx",
        engine="ort",
        precision="int8",
        stage=0,
        steps=("export --target onnx --precision int8 --int8-method ort_dynamic",),
        build=_export("onnx", "int8", int8_method="ort_dynamic"),
        cost=12,
        needs=("dynamic-int8",),
    ),
    Spec(
        name="int8-openvino-float-layers",
        label="static int8 with the most sensitive layers float, NNCF (OpenVINO)",
        technique="autoquant-int8",
        format="openvino",
        engine="nncf",
        precision="int8",
        stage=0,
        steps=(
            "export --target openvino --precision int8 --exclude LAYER ... (the ranked float-layer search)",
        ),
        build=_openvino_float_layers,
        cost=20,
        fixed=10,
        needs=("float-layers-fit",),
        ceiling="int8-openvino",
    ),
    Spec(
        name="int8-openvino-search",
        label="static int8 with float ops, NNCF accuracy control (OpenVINO)",
        technique="autoquant-int8",
        format="openvino",
        engine="nncf",
        precision="int8",
        stage=0,
        steps=(
            "export --target openvino --precision int8 --accuracy-control --min-cosine/--accuracy-budget",
        ),
        build=_openvino_search,
        cost=30,
        fixed=10,
        needs=("openvino-int8-rejected",),
        ceiling="int8-openvino",
    ),
    Spec(
        name="fp32-torchscript",
        label="fp32 TorchScript",
        technique="fp32",
        format="torchscript",
        engine=None,
        precision="fp32",
        stage=1,
        steps=("export --target torchscript",),
        build=_export("torchscript"),
        devices=("cpu", "cuda"),
    ),
    Spec(
        name="fp32-exported-program",
        label="fp32 ExportedProgram",
        technique="fp32",
        format="exported_program",
        engine=None,
        precision="fp32",
        stage=1,
        steps=("export --target exported_program",),
        build=_export("exported_program"),
        cost=8,
        devices=("cpu", "cuda"),
    ),
    _gpu(
        "fp16-torchscript",
        label="fp16 TorchScript",
        target="torchscript",
        precision="fp16",
        cost=1,
    ),
    _gpu(
        "bf16-torchscript",
        label="bf16 TorchScript",
        target="torchscript",
        precision="bf16",
        cost=1,
        needs=("bf16-gpu",),
    ),
    _gpu(
        "fp16-exported-program",
        label="fp16 ExportedProgram",
        target="exported_program",
        precision="fp16",
        cost=8,
    ),
    _gpu(
        "bf16-exported-program",
        label="bf16 ExportedProgram",
        target="exported_program",
        precision="bf16",
        cost=8,
        needs=("bf16-gpu",),
    ),
    _gpu(
        "fp16-onnx-cuda",
        label="fp16 ONNX Runtime (CUDA)",
        target="onnx",
        precision="fp16",
        cost=10,
        needs=("ort-cuda",),
    ),
    Spec(
        name="fp32-onnx",
        label="fp32 ONNX Runtime",
        technique="fp32",
        format="onnx",
        engine=None,
        precision="fp32",
        stage=1,
        steps=("export --target onnx",),
        build=_export("onnx"),
        cost=10,
    ),
    Spec(
        name="int8-fx",
        label="static int8, torch.ao FX (TorchScript)",
        technique="static-int8",
        format="torchscript",
        engine="fx",
        precision="int8",
        stage=1,
        steps=("quantize --mode static --engine fx",),
        build=_quantize("static", "fx"),
        cost=10,
    ),
    Spec(
        name="int8-onnx-qdq",
        label="static int8, ONNX Runtime QDQ",
        technique="static-int8",
        format="onnx",
        engine="ort",
        precision="int8",
        stage=1,
        steps=("export --target onnx --precision int8 --data CALIB",),
        build=_export("onnx", "int8"),
        cost=15,
    ),
    Spec(
        name="int8-dynamic",
        label="dynamic int8 (Linear/LSTM/GRU), TorchScript",
        technique="dynamic-int8",
        format="torchscript",
        engine="fx",
        precision="int8",
        stage=1,
        steps=("quantize --mode dynamic",),
        build=_quantize("dynamic"),
        cost=3,
        fixed=0,
        needs=("dynamic-int8",),
    ),
    Spec(
        name="fp16-compiled-graphs",
        label="fp16 ExportedProgram through torch.compile(mode='reduce-overhead'): Inductor + CUDA graphs",
        technique="fp16",
        format="exported_program",
        engine=None,
        precision="fp16",
        stage=2,
        steps=(
            "export --target exported_program --precision fp16 --device cuda",
            "run: torch.compile(torch.export.load(FILE).module(), mode='reduce-overhead')",
        ),
        build=_reuse("fp16-exported-program", _export("exported_program", "fp16")),
        cost=8,
        fixed=30,
        needs=("compiler",),
        devices=("cuda",),
        compile_mode="reduce-overhead",
    ),
    _gpu(
        "fp16-aoti",
        label="fp16 AOTInductor (CUDA)",
        target="aoti",
        precision="fp16",
        cost=60,
        fixed=120,
        needs=("compiler",),
    ),
    Spec(
        name="fp16-aoti-graphs",
        label="fp16 AOTInductor (CUDA), replayed as CUDA graphs",
        technique="fp16",
        format="aoti",
        engine=None,
        precision="fp16",
        stage=2,
        steps=("export --target aoti --precision fp16 --device cuda --cuda-graphs",),
        build=_graphs_of("fp16-aoti"),
        cost=0,
        fixed=0,
        needs=("built:fp16-aoti",),
        devices=("cuda",),
    ),
    _gpu(
        "bf16-aoti",
        label="bf16 AOTInductor (CUDA)",
        target="aoti",
        precision="bf16",
        cost=60,
        fixed=120,
        needs=("bf16-aoti",),
    ),
    Spec(
        name="fp32-aoti",
        label="fp32 AOTInductor",
        technique="fp32",
        format="aoti",
        engine=None,
        precision="fp32",
        stage=2,
        steps=("export --target aoti --static-batch (each --batch-size)",),
        build=_export("aoti"),
        cost=60,
        fixed=120,
        needs=("compiler",),
        devices=("cpu", "cuda"),
    ),
    Spec(
        name="int8-pt2e",
        label="static int8, torchao PT2E (AOTInductor)",
        technique="static-int8",
        format="aoti",
        engine="pt2e",
        precision="int8",
        stage=2,
        steps=("quantize --mode static --engine pt2e",),
        build=_quantize("static", "pt2e"),
        cost=40,
        fixed=60,
        needs=("pt2e",),
    ),
    Spec(
        name="int8-dynamic-search",
        label="dynamic int8 with SmoothQuant / float layers (autoquant), TorchScript",
        technique="autoquant-int8",
        format="torchscript",
        engine="fx",
        precision="int8",
        stage=2,
        steps=("quantize --mode dynamic --accuracy-budget/--min-cosine (autoquant)",),
        build=_autoquant("dynamic"),
        cost=40,
        fixed=10,
        needs=("int8-dynamic-rejected",),
        ceiling="int8-dynamic",
    ),
    Spec(
        name="int8-fx-float-layers",
        label="static int8 with float layers (autoquant), TorchScript",
        technique="autoquant-int8",
        format="torchscript",
        engine="fx",
        precision="int8",
        stage=2,
        steps=("quantize --mode static --accuracy-budget/--min-cosine (autoquant)",),
        build=_autoquant("static"),
        cost=40,
        fixed=10,
        needs=("int8-fx-rejected",),
        ceiling="int8-fx",
    ),
    Spec(
        name="pruned30-ft",
        label=f"structured prune {PRUNE_AMOUNT:.0%} + fine-tune, fp32 TorchScript",
        technique="pruned",
        format="torchscript",
        engine=None,
        precision="fp32",
        stage=3,
        steps=(_PRUNE_STEP,),
        build=_prune,
        cost=20,
        fixed=5,
        needs=("train-data",),
    ),
    Spec(
        name="pruned30-ft-int8",
        label=f"structured prune {PRUNE_AMOUNT:.0%} + fine-tune + static int8 FX",
        technique="pruned",
        format="torchscript",
        engine="fx",
        precision="int8",
        stage=3,
        steps=(_PRUNE_STEP, "quantize --mode static --engine fx"),
        build=_quantize("static", "fx", source="pruned30-ft"),
        cost=3,
        fixed=0,
        needs=("pruned-built",),
    ),
)

#: name -> Spec
SPECS: dict[str, Spec] = {s.name: s for s in CATALOGUE}
REFERENCE = "fp32-eager"


def select(names: Any = None, skip: Any = None, device: str = "cpu") -> list[Spec]:
    """The catalogue of ``device``'s kind (``cpu`` or ``cuda[:N]``) filtered by ``names`` (only these, plus
    the reference) and ``skip``; unknown names, and names of the other device's catalogue, are a UsageError
    listing the ones that apply."""
    from ptopt.core.errors import UsageError

    def as_list(value: Any) -> list[str]:
        if value is None:
            return []
        items = value.split(",") if isinstance(value, str) else list(value)
        return [str(v).strip() for v in items if str(v).strip()]

    kind = str(device).split(":")[0]
    here = [s.name for s in CATALOGUE if kind in s.devices]
    wanted, skipped = as_list(names), as_list(skip)
    for option, given in (("--candidates", wanted), ("--skip", skipped)):
        unknown = [n for n in given if n not in SPECS]
        if unknown:
            raise UsageError(
                f"{option}: unknown candidate(s) {', '.join(unknown)} (known: {', '.join(SPECS)})"
            )
        elsewhere = [n for n in given if n not in here] if option == "--candidates" else []
        if elsewhere:
            other = "cuda" if kind == "cpu" else "cpu"
            raise UsageError(
                f"{option}: {', '.join(elsewhere)}: a candidate with --device {other}, not --device {device} "
                f"(the candidates on {kind}: {', '.join(here)})"
            )
    if REFERENCE in skipped:
        raise UsageError(f"--skip {REFERENCE}: the fp32 reference is always measured (speedups divide by it)")
    keep = set(wanted) | {REFERENCE} if wanted else set(here)
    return [s for s in CATALOGUE if s.name in keep and s.name not in skipped]


@dataclasses.dataclass
class Candidate:
    """One candidate as the search saw it: its :class:`Spec`, what happened to it, what it measured.

    ``status``: kept | rejected (accuracy) | failed (build error) | skipped (budget, runtime, not
    applicable); ``reason`` one line when not kept. ``result`` is the stage's in-memory Result (None for
    the reference, and when nothing was built); ``path`` the artifact's file relative to the output
    folder once saved. The rest are the report's fields (see ``to_dict``).
    """

    spec: Spec
    status: str = "pending"
    reason: str | None = None
    result: Any = None
    path: str | None = None
    size_bytes: int | None = None
    accuracy: float | None = None
    accuracy_drop: float | None = None
    #: the worst sample's cosine as measured on the held-out samples
    cosine_min: float | None = None
    #: that worst projected to ``ptopt.core.tail.REFERENCE_SAMPLES`` samples (what ``--min-cosine`` judges)
    cosine_projected: float | None = None
    #: the projection's record (``WorstCosine.to_dict``: measured, projected, mean, samples, ...)
    tail: dict[str, Any] | None = None
    #: "1" -> {"median": ms, "spread_pct": %, "rounds": n}
    latency_ms: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    speedup: dict[str, float] = dataclasses.field(default_factory=dict)
    noisy: bool = False
    within_budget: bool | None = None
    #: the figures on the samples the search chose on, when the headline ones are the held-out ones
    search: dict[str, Any] | None = None
    build_seconds: float | None = None
    #: where the artifact was written while searching (the runners load it from there), and how long that took
    work_path: Any = None
    save_seconds: float | None = None
    #: how long opening its runner took (loading, compiling): paid again by the final timing and each --isa child
    open_seconds: float = 0.0
    #: its full evaluation on the eval data (the search's and the held-out samples), first calls' compiles and
    #: all: recorded, not an estimate's basis (``Search.own_costs`` prices its speed from its probe)
    eval_seconds: float = 0.0
    #: the seconds its build, evaluation and timing were estimated at when it was tried (the report compares)
    estimate_s: float | None = None
    #: what trying it took: build, working copy, evaluation (and a probe)
    spent_s: float | None = None
    #: a quick look at its speed while searching ("1" -> ms per call; ``search.probe``)
    probe_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    #: ``--isa``: CPU level -> its figures there and whether it holds the budget (``ptopt.optimize.isa``)
    by_isa: dict[str, dict[str, Any]] | None = None

    def __getattr__(self, name: str) -> Any:
        # name, label, technique, format, runtime, engine, precision, steps, packageable, suffix
        if name.startswith("_") or name == "spec":
            raise AttributeError(name)
        return getattr(self.spec, name)

    @property
    def model(self) -> Any:
        """The candidate's in-memory callable (the reference's module for fp32-eager), or None."""
        return None if self.result is None else self.result.model

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        return {
            "name": s.name,
            "label": s.label,
            "technique": s.technique,
            "format": s.format,
            "runtime": s.runtime,
            "engine": s.engine,
            "precision": s.precision,
            "status": self.status,
            "reason": self.reason,
            "path": self.path,
            "size_bytes": self.size_bytes,
            "accuracy": _rounded(self.accuracy, 6),
            "accuracy_drop": _rounded(self.accuracy_drop, 4),
            "cosine_min": _rounded(self.cosine_min, 6),
            "cosine_projected": _rounded(self.cosine_projected, 6),
            "tail": self.tail,
            "latency_ms": self.latency_ms,
            "speedup": self.speedup,
            "noisy": self.noisy,
            "within_budget": self.within_budget,
            "search": None if self.search is None else {k: _rounded(v, 6) for k, v in self.search.items()},
            "packageable": s.packageable,
            "build_seconds": self.build_seconds,
            **({"estimate_s": round(self.estimate_s, 1)} if self.estimate_s is not None else {}),
            **({"spent_s": round(self.spent_s, 1)} if self.spent_s is not None else {}),
            "steps": list(s.steps),
            **({"by_isa": self.by_isa} if self.by_isa else {}),
        }


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)
