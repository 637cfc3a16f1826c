"""What the pt2e rows of the technique table share (``techniques/static_pt2e``, ``qat_pt2e``):
torchao's PT2E flow compiled by AOTInductor.

=======  ==========================================================================================
engine   what ``quantize`` returns / writes
=======  ==========================================================================================
fx       (default) torch.ao FX graph mode → frozen int8 TorchScript (``techniques/*_fx``)
pt2e     ``engine_pt2e``: torch.export → prepare_pt2e / prepare_qat_pt2e → calibrate / train
         → convert_pt2e → an AOTInductor package (``.pt2``, sidecar format ``aoti_package``) whose
         int8 kernels come from Inductor's lowering; loads with ``torch._inductor.aoti_load_package``.
         With ``compile=False`` (``--no-compile``): the int8 ExportedProgram itself (``.pt2``, format
         ``exported_program``, q/dq ops; slower than fp32 when run eagerly, the input to
         ``ptopt export --target aoti`` or ``torch.compile`` later)
auto     both; each timed at the opt batch in the same interleaved rounds; the faster one is kept
         when its accuracy drop (with ``eval_data``) stays within ``AUTO_MAX_DROP`` points of fp32
         (else the other); the choice and both measurements go into the sidecar (``engine_choice``)
=======  ==========================================================================================

``--engine pt2e`` does static and QAT int8 (dynamic int8 stays on fx). QAT on pt2e fine-tunes the
prepared graph with the shared trainer (no BatchNorm/observer freeze schedule: the graph's
BatchNorm is an op, not a module the FX freeze helpers reach).

**Transformers** (Hugging Face encoders called with ``input_ids`` / ``attention_mask``): torch.fx
cannot trace them, torch.export can. Their Linear layers become int8 (``qlinear`` kernels); the
embeddings, LayerNorm, softmax/attention (``scaled_dot_product_attention``) and GELU stay float, as
X86InductorQuantizer leaves them (``float_layers`` lists them). Token inputs get a dynamic sequence
(:func:`token_sequence_specs`) besides the dynamic batch, so one package takes any padded batch up
to the model's position limit.

**When fx cannot trace** (engine ``fx``, the default): the refusal names ``--engine pt2e`` when
torch.export captures the model (checked, :func:`captures`); ``auto`` falls back to pt2e and says so
in ``engine_choice``. The default stays fx because the engines write different artifacts (int8
TorchScript, which ``ptopt export`` re-quantizes for ONNX Runtime, vs an AOTInductor package
compiled for this CPU, minutes to build): a default that switched silently would change the file a
command writes.
"""

from __future__ import annotations

import shutil
import weakref
from pathlib import Path
from typing import Any

from ptopt.compress.quantize.base import Prepared, Quantized
from ptopt.core.atomic import ScratchDir
from ptopt.core.errors import UsageError

#: token inputs by the names Hugging Face tokenizers give them
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
#: layers nearest the output tried in float when the pt2e int8 model breaks the rule
MAX_HEAD_FLOAT = 4
#: what ``ptopt quantize`` adds when fx cannot trace a model this engine captures
CAPTURES_HINT = (
    "torch.export captures this model: add --engine pt2e (engine='pt2e'), which writes an int8 "
    "AOTInductor package (e.g. -o model.int8.pt2)"
)


def check_x86(config: Any) -> None:
    """X86InductorQuantizer makes x86 int8 with per-channel weights; anything else runs on fx."""
    if config.backend != "x86" or not config.per_channel:
        raise UsageError(
            f"--engine {config.engine} quantizes for x86 with per-channel weights (X86InductorQuantizer); "
            f"--backend {config.backend}{'' if config.per_channel else ' --per-tensor'} runs on --engine fx"
        )


def artifact(config: Any, prep: Prepared, converted: Any, summary: dict[str, Any], specs: list) -> Quantized:
    """The converted q/dq graph compiled into an AOTInductor package (or, ``compile=False``, saved as
    its ExportedProgram) in a temporary folder kept while the Result lives: ``model`` is that file
    loaded back, ``write`` copies it."""
    from ptopt.compress.quantize import pt2e_package
    from ptopt.formats.aoti import load_aoti

    style = prep.style
    folder = ScratchDir(prefix="ptopt-pt2e-")
    path = Path(folder.name) / "model.int8.pt2"
    samples = prep.calib or prep.train
    if config.compile:
        fmt = "aoti_package"
        facts = pt2e_package.compile_int8(
            converted, path, specs, style, samples=samples, static_batches=config.static_batches
        )
        model = load_aoti(path)
    else:
        fmt, facts, model = "exported_program", *_int8_program(converted, path, specs, style, samples)

    def write(dest: Path) -> dict[str, Any]:
        _ = folder  # the compiled package lives as long as the Result
        shutil.copyfile(path, dest)
        return {"files": [dest.name]}

    size = path.stat().st_size
    if fmt == "aoti_package":  # what of the package is weights, and what is the compiled code around them
        weights = weight_bytes(converted)
        facts["metrics"] |= {"weight_bytes": weights, "compiled_code_bytes": max(0, size - weights)}
        fx_int8, why_not = fx_int8_to_time(config, prep)
        refs = {"fp32": prep.module} | ({"fx_int8": fx_int8} if fx_int8 is not None else {})
        speed = speeds(model, refs, specs, style)
        facts["extra"]["pt2e"]["speed_vs_fp32"] = speed["fp32"]
        facts["extra"]["pt2e"]["speed_vs_fx_int8"] = speed.get("fx_int8")
        if why_not:
            facts["extra"]["pt2e"]["fx_int8_not_timed"] = why_not
    return Quantized(
        model=model,
        format=fmt,
        size=size,  # the package carries compiled code: it may outweigh fp32
        write=write,
        config=config.replace(engine="pt2e"),
        float_layers=float_layers(prep.module, converted, config.float_modules),
        summary={**summary, **facts["extra"]},
        metrics=facts["metrics"],
        specs=specs,
        eval_batch=min(256, specs[0].max_shape[0]) if specs else 256,  # a program guards its batch range
    )


def speeds(package: Any, refs: dict[str, Any], specs: list, style: str) -> dict[str, dict[str, float]]:
    """The package's speedup over each of ``refs`` (its fp32 source, and the FX int8 model ``--engine fx``
    writes) at batch 1 and at the specs' opt batch, timed briefly in the same interleaved rounds on this CPU:
    ``{ref: {batch: ref ms / package ms}}``. A package slower than either is said (the CLI warns). Measured on
    an idle 2-core EPYC (AVX2): 0.75x FX int8 at batch 1, 1.36x at batch 32; on an AMX Xeon 0.72-0.79x at
    batch 32: with a symbolic batch Inductor packs the int8 weights without the input's shape
    (``qconv_prepack(..., x_shape=None)``), so oneDNN may reorder them at run time for the kernel it picks."""
    import torch

    from ptopt.core.inputspec import call_model, make_inputs
    from ptopt.core.timing import measure_interleaved

    batches = sorted({1, specs[0].opt_shape[0]}) if specs else [1]
    out: dict[str, dict[str, float]] = {name: {} for name in refs}
    for b in batches:
        x = make_inputs(specs, style, which="opt", batch=b)

        def run(model: Any, x: Any = x) -> Any:
            with torch.no_grad():
                return call_model(model, x)

        fns = {"int8": lambda: run(package)} | {name: (lambda m=m: run(m)) for name, m in refs.items()}
        stats = measure_interleaved(fns, rounds=3, min_iters=6, min_seconds=0.3)
        for name in refs:
            out[name][str(b)] = round(stats[name]["p50_ms"] / stats["int8"]["p50_ms"], 3)
    return out


def fx_int8_to_time(config: Any, prep: Prepared) -> tuple[Any, str | None]:
    """The int8 model ``--engine fx`` would write for this model (frozen int8 TorchScript), built only to
    time the package against: calibrated on one batch with min-max observers (its ranges move its accuracy,
    not its kernels' speed). ``(None, why)`` when torch.fx cannot trace the model or its int8 TorchScript
    cannot be made."""
    from ptopt.compress.quantize import engine_fx as fx
    from ptopt.compress.quantize.config import StaticQuantConfig
    from ptopt.compress.quantize.scripted import frozen_torchscript
    from ptopt.compress.quantize.techniques.static_fx import quantize_static
    from ptopt.core.errors import PtoptError

    data = prep.calib if prep.calib is not None else prep.train
    cfg = StaticQuantConfig(backend=config.backend, per_channel=config.per_channel, observer="minmax",
                            float_modules=config.float_modules, calibration_batches=1, engine="fx")  # fmt: skip
    try:
        with fx.quantize_context(cfg.backend):
            module = quantize_static(prep.module, cfg, data, prep.example, progress=False).module
            return frozen_torchscript(module, prep.example, prep.style)[0], None
    except (PtoptError, RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError) as e:
        return None, f"torch.fx int8 could not be built ({type(e).__name__}: {str(e).splitlines()[0][:160]})"


def weight_bytes(graph: Any) -> int:
    """Bytes of the tensors a converted graph reads (its int8 weights, their scales and zero points, the
    float biases): what an AOTInductor package of it stores as constants, beside its compiled code."""
    import torch

    seen: dict[int, int] = {}
    tensors = []
    for node in graph.graph.nodes:
        if node.op == "get_attr" and node.users:
            obj = graph
            for part in str(node.target).split("."):
                obj = getattr(obj, part, None)
            tensors.append(obj)
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def _int8_program(converted: Any, path: Path, specs: list, style: str, samples: Any) -> tuple[dict, Any]:
    """The converted q/dq graph saved as an ExportedProgram, reloaded and compared with it (facts,
    the reloaded program's module)."""
    from ptopt.compress.quantize.engine_pt2e import reduce_range
    from ptopt.export.writers import Check, reload, write_model

    facts = write_model(converted, "exported_program", path, specs=specs, style=style, precision="int8",
                        check=Check(samples=samples, what="the int8 ExportedProgram read back",
                                    advice=" (compared with the int8 graph it was saved from)"))  # fmt: skip
    # the activation bits travel with the program: torch.compile of 8-bit activations on a CPU without
    # VNNI drifts (7-bit there, ``engine_pt2e.reduce_range``)
    facts["extra"]["pt2e"] = {
        "quantizer": "X86InductorQuantizer",
        "compiled": False,
        "reduce_range": reduce_range(),
    }
    return facts, reload(path, "exported_program", style=style)


def specs_of(prep: Prepared) -> list:
    """The input specs the pt2e artifact is captured with (:func:`token_sequence_specs`)."""
    return token_sequence_specs(prep.module, prep.specs, prep.style)


def linearized(module: Any, float_modules: Any) -> tuple[Any, list[str]]:
    """``module``, or a copy whose transformers ``Conv1D`` layers (GPT-2's attention and MLP) are the
    ``nn.Linear`` they are (X86InductorQuantizer annotates linear ops, not Conv1D's ``addmm``), and
    the names swapped; float modules are left alone."""
    import copy

    from ptopt.compress.quantize.layers import is_conv1d_linear, linearize_conv1d

    if not any(is_conv1d_linear(m) for m in module.modules()):
        return module, []
    module = copy.deepcopy(module)
    return module, linearize_conv1d(module, skip=float_modules)


def calibration_batches(config: Any, calib: Any) -> list[Any]:
    """The calibration batches (inputs only) of a static config, as the FX engine draws them."""
    batches = []
    for b in calib.batches(config.batch_size, shuffle=True, seed=0):
        if len(batches) >= config.calibration_batches:
            break
        batches.append(b.x)
    return batches


def float_layers(module: Any, converted: Any, excluded: Any) -> dict[str, str]:
    """The layers with weights that stay float in the converted graph, and why: ``--exclude``d, or
    not a kind X86InductorQuantizer makes int8 (embeddings, LayerNorm...); BatchNorm folds into its
    convolution."""
    import torch

    from ptopt.compress.quantize.engine_pt2e import int8_modules
    from ptopt.compress.quantize.measure import weight_layers

    int8 = int8_modules(converted)
    out = {n: "excluded (--exclude)" for n in excluded}
    for name, (m, _) in weight_layers(module).items():
        if name in int8 or name in out or isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            continue
        block = next((e for e in excluded if name.startswith(e + ".")), None)
        out[name] = (
            f"inside {block}: excluded (--exclude)"
            if block is not None
            else f"{type(m).__name__}: float in PT2E (X86InductorQuantizer makes Linear and Conv2d int8)"
        )
    return out


def token_sequence_specs(module: Any, specs: list, style: str) -> list:
    """``specs`` with a dynamic sequence when every input is a Hugging Face token tensor (``input_ids``,
    ``attention_mask``...: 2-D integers of one fixed length) and the model says its position limit
    (``config.max_position_embeddings`` / ``n_positions``): the sequence then runs from 1 to that
    limit, so a package takes any padded batch. Other specs are returned as they are."""
    import dataclasses

    config = getattr(module, "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    seqs = {s.opt_shape[1] for s in specs if s.rank == 2}
    tokens = style == "keyword" and all(
        s.name in TOKEN_INPUTS and s.rank == 2 and s.dtype.startswith("int") and 1 not in s.dynamic_dims
        for s in specs
    )
    if not (specs and tokens and isinstance(limit, int) and len(seqs) == 1 and max(seqs) <= limit):
        return specs
    limit = longest_sequence(module, specs, limit)
    if limit is None or max(seqs) > limit:
        return specs
    return [
        dataclasses.replace(s, min_shape=(s.min_shape[0], 1), max_shape=(s.max_shape[0], limit))
        for s in specs
    ]


def longest_sequence(module: Any, specs: list, limit: int) -> int | None:
    """The longest token sequence ``module`` runs: its position limit, or that less the offset of models
    that count positions from the padding id (RoBERTa's start at ``pad_token_id + 1``: 64 tokens in a
    66-wide table); tried on one sequence of each length. None when neither runs."""
    import torch

    pad = getattr(getattr(module, "config", None), "pad_token_id", None)
    fill = {"input_ids": 2, "attention_mask": 1, "token_type_ids": 0}
    for n in dict.fromkeys((limit, limit - (pad if isinstance(pad, int) else 0) - 1)):
        x = {
            s.name: torch.arange(n)[None]
            if s.name == "position_ids"
            else torch.full((1, n), fill.get(s.name, 0))
            for s in specs
        }
        try:
            with torch.no_grad():
                module(**x)
        except (IndexError, RuntimeError, ValueError):
            continue
        return n
    return None


def logits(out: Any) -> Any:
    """The tensor the trainer's losses take: a Hugging Face ModelOutput's (or dict's) ``logits``."""
    if isinstance(out, dict) and "logits" in out:
        return out["logits"]
    return out


def captures(config: Any, prep: Prepared) -> bool:
    """Whether torch.export captures the model (so ``--engine pt2e`` runs where fx cannot trace)."""
    from ptopt.compress.quantize import engine_pt2e
    from ptopt.core.errors import PtoptError

    try:
        engine_pt2e.capture(prep.module, specs_of(prep), prep.style)
    except PtoptError:
        return False
    return True


def advise(config: Any, prep: Prepared) -> str:
    """What to do when the pt2e int8 model breaks export's parity rule: the fewest conv / linear layers
    nearest the output (a task head: classifier, pooler) that, kept float, make the converted q/dq graph
    hold it (``ptopt.core.search.ladder``). Judged eagerly (no compile: seconds, not minutes) on the same
    data; the compiled kernels do not clamp 7-bit activations as the q/dq graph does and were the closer
    to fp32 where measured (BERT: 0.9996 here, 0.9997 in the package).
    """
    import torch

    from ptopt.compress.fidelity import INT8_VS_FP32, fidelity_data, measure_fidelity
    from ptopt.compress.quantize import engine_pt2e
    from ptopt.core.search import ladder

    if config.mode != "static":
        return ""
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    module, _ = linearized(prep.module, config.float_modules)
    layers = [n for n, m in module.named_modules() if isinstance(m, kinds) and n not in config.float_modules]
    specs, style = specs_of(prep), prep.style
    data = fidelity_data(prep.evald, prep.calib, prep.train, example=prep.example)
    batches, graph = calibration_batches(config, prep.calib), engine_pt2e.capture(module, specs, style)
    found: dict[int, Any] = {}

    def holds(k: int) -> bool:  # the k layers nearest the output float
        candidate = config.replace(float_modules=tuple(config.float_modules) + tuple(layers[-k:]))
        graph_k = engine_pt2e.copy_graph(graph)
        converted = engine_pt2e.quantize_static(module, specs, style, candidate, batches, graph=graph_k)
        found[k] = measure_fidelity(prep.module, converted, data, **INT8_VS_FP32)
        return bool(found[k]["passed"])

    k = ladder(holds, min(MAX_HEAD_FLOAT, len(layers) - 1))
    if k is not None:
        floats = layers[-k:]
        flags = " ".join(f"--exclude {n}" for n in floats)
        return (
            f" Keep {', '.join(floats)} in float: rerun with {flags} (float_modules={tuple(floats)!r}); "
            f"with them float the min cosine is {found[k]['min_cosine']:.4f}"
        )
    return (
        f" Keeping the {MAX_HEAD_FLOAT} conv / linear layers nearest the output float does not make it hold: "
        "use --engine fx where torch.fx traces the model, or --mode dynamic"
    )


def candidate(config: Any, prep: Prepared) -> Any:
    """The converted q/dq graph of a static config (no package): what accuracy-aware search measures
    eagerly and times compiled (``autoquant_tuner``) and ``--engine auto`` judges. The model is
    captured once per model and input specs; each candidate prepares a copy of that graph."""
    from ptopt.compress.quantize import engine_pt2e

    batches = calibration_batches(config, prep.calib)  # no observer named: engine_pt2e uses its own
    key = (tuple(s.describe() for s in prep.specs), prep.style)
    graphs = _CAPTURED.setdefault(prep.module, {})
    if key not in graphs:
        graphs[key] = engine_pt2e.capture(prep.module, prep.specs, prep.style)
    graph = engine_pt2e.copy_graph(graphs[key])
    return engine_pt2e.quantize_static(prep.module, prep.specs, prep.style, config, batches, graph=graph)


#: model -> {(its input specs, calling style): its torch.export graph}, while the model lives
_CAPTURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
