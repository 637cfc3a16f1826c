"""``ptopt quantize --engine pt2e|auto``: int8 through torchao's PT2E flow, compiled by AOTInductor.

=======  ==========================================================================================
engine   what ``quantize`` returns / writes
=======  ==========================================================================================
fx       (default) torch.ao FX graph mode → frozen int8 TorchScript (``quantize_steps``)
pt2e     ``quant_engine_pt2e``: torch.export → prepare_pt2e / prepare_qat_pt2e → calibrate / train
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
torch.export captures the model (checked, :func:`fx_cannot_trace`); ``auto`` falls back to pt2e
and says so in ``engine_choice``. The default stays fx because the engines write different
artifacts (int8 TorchScript, which ``ptopt export`` re-quantizes for ONNX Runtime, vs an AOTInductor
package compiled for this CPU, minutes to build): a default that switched silently would change
the file a command writes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ptopt.core.errors import UsageError

ENGINES = ("fx", "pt2e", "auto")
#: auto keeps the faster engine only within this many accuracy points of fp32 (with eval data)
AUTO_MAX_DROP = 0.5


def check_engine(config: Any) -> None:
    """Refuse an engine the config's options cannot run on (called by the config's validation)."""
    engine = config.engine
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
    if not config.compile and engine != "pt2e":
        raise UsageError(
            f"--no-compile keeps the int8 ExportedProgram of --engine pt2e; --engine {engine} has none"
        )
    if engine == "fx":
        return
    if config.mode == "dynamic":
        raise UsageError(
            f"--engine {engine} does static and qat int8; --mode dynamic runs on --engine fx (the default)"
        )
    if config.backend != "x86" or not config.per_channel:
        raise UsageError(
            f"--engine {engine} quantizes for x86 with per-channel weights (X86InductorQuantizer); "
            f"--backend {config.backend}{'' if config.per_channel else ' --per-tensor'} runs on --engine fx"
        )


def quantize_with_engine(config: Any, prep: Any, refs: dict[str, Any], progress: bool) -> Any:
    """The Result of ``config.engine`` (``pt2e`` or ``auto``) for the prepared model and data."""
    if config.engine == "pt2e":
        return quantize_pt2e(config, prep, refs, progress)
    return _auto(config, prep, refs, progress)


def quantize_pt2e(config: Any, prep: Any, refs: dict[str, Any], progress: bool) -> Any:
    """PT2E int8 of ``prep.module`` compiled into an AOTInductor package (in a temporary folder kept
    while the Result lives); ``.model`` is that package loaded, ``.save`` copies it."""
    from ptopt.compress import quant_engine_pt2e as pt2e
    from ptopt.compress.quant_steps import _accuracy, int8_share, vs_fp32
    from ptopt.compress.stage import input_files
    from ptopt.core.artifact import Artifact
    from ptopt.core.quiet import silenced
    from ptopt.core.result import Result
    from ptopt.export.writers import serialized_bytes
    from ptopt.formats.aoti import load_aoti

    style = prep.loaded.input_style
    specs = token_sequence_specs(prep.module, list(prep.loaded.input_specs), style)
    converted, summary = _convert(config, prep, specs, style, progress)
    folder = tempfile.TemporaryDirectory(prefix="ptopt-pt2e-")
    path = Path(folder.name) / "model.int8.pt2"
    if config.compile:
        fmt = "aoti_package"
        facts = pt2e.compile_int8(converted, path, specs, style, samples=prep.calib or prep.train)
        model = load_aoti(path)
    else:
        fmt, facts, model = "exported_program", *_int8_program(converted, path, specs, style, prep)
    batch = min(256, specs[0].max_shape[0]) if specs else 256  # a program guards its batch range
    metrics = _accuracy(prep.module, model, prep.evald, refs.get("eval_data"), batch)
    with silenced(("transformers",)):  # tracing reads every attribute: HF's loss_function warns
        fp32_bytes = serialized_bytes(
            prep.module, "torchscript", prep.example, specs=specs or None, style=style
        )
    metrics |= {
        "fp32_torchscript_bytes": fp32_bytes,
        "size_ratio_vs_fp32_torchscript": round(path.stat().st_size / fp32_bytes, 4),
        "larger_than_fp32": path.stat().st_size > fp32_bytes,  # the package carries compiled code
        **facts["metrics"],
    }
    metrics |= vs_fp32(prep.module, model, prep)
    cfg = config.to_dict() | {"mode": config.mode, "engine": "pt2e"}
    cfg |= {k: str(v) for k, v in refs.items() if isinstance(v, (str, os.PathLike))}
    excluded = float_layers(prep.module, converted, config.float_modules)
    template = Artifact(
        path=path,
        format=fmt,
        inputs=specs,
        input_style=style,
        config=cfg,
        parent=prep.loaded.parent_record(),
        precision="int8",
        metrics=metrics,
        extra={
            "float_layers": excluded,
            "int8_share": int8_share(prep.module, prep.example, excluded),
            **summary,
            **facts["extra"],
        },
    )

    def write(dest: Path) -> dict[str, Any]:
        _ = folder  # the compiled package lives as long as the Result
        shutil.copyfile(path, dest)
        return {"files": [dest.name]}

    sources = input_files(prep.loaded.path, prep.loaded.info.get("weights"), *refs.values())
    return Result(model, template, write, inputs_paths=sources)


def _int8_program(converted: Any, path: Path, specs: list, style: str, prep: Any) -> tuple[dict, Any]:
    """The converted q/dq graph saved as an ExportedProgram, reloaded and compared with it (facts,
    the reloaded program's module)."""
    from ptopt.export.writers import reload, write_model

    samples = prep.calib or prep.train
    facts = write_model(converted, "exported_program", path, specs=specs, style=style, precision="int8",
                        samples=samples)  # fmt: skip
    facts["extra"]["pt2e"] = {"quantizer": "X86InductorQuantizer", "compiled": False}
    return facts, reload(path, "exported_program", style=style)


def _convert(config: Any, prep: Any, specs: list, style: str, progress: bool) -> tuple[Any, dict[str, Any]]:
    """The converted int8 q/dq graph and the calibration / training summary."""
    from ptopt.compress import quant_engine_pt2e as pt2e
    from ptopt.core.inputspec import batch_size_of

    if config.mode == "static":
        batches = calibration_batches(config, prep)
        module, swapped = linearized(prep.module, config.float_modules)
        converted = pt2e.quantize_static(module, specs, style, config, batches)
        samples = sum(batch_size_of(x) for x in batches)
        calibration = {"data": prep.calib.name, "batches": len(batches), "samples": samples}
        calibration["batch_size"] = config.batch_size
        calibration |= {"observer": config.observer, "per_channel": True, "engine": "pt2e"}
        return converted, {"calibration": calibration, "conv1d_as_linear": swapped}
    return _qat(config, prep, specs, style, progress)


def linearized(module: Any, float_modules: Any) -> tuple[Any, list[str]]:
    """``module``, or a copy whose transformers ``Conv1D`` layers (GPT-2's attention and MLP) are the
    ``nn.Linear`` they are (X86InductorQuantizer annotates linear ops, not Conv1D's ``addmm``), and
    the names swapped; float modules are left alone."""
    import copy

    from ptopt.compress.quant_engine import is_conv1d_linear, linearize_conv1d

    if not any(is_conv1d_linear(m) for m in module.modules()):
        return module, []
    module = copy.deepcopy(module)
    return module, linearize_conv1d(module, skip=float_modules)


def calibration_batches(config: Any, prep: Any) -> list[Any]:
    """The calibration batches (inputs only) of a static config, as the FX engine draws them."""
    batches = []
    for b in prep.calib.batches(config.batch_size, shuffle=True, seed=0):
        if len(batches) >= config.calibration_batches:
            break
        batches.append(b.x)
    return batches


def float_layers(module: Any, converted: Any, excluded: Any) -> dict[str, str]:
    """The layers with weights that stay float in the converted graph, and why: ``--exclude``d, or
    not a kind X86InductorQuantizer makes int8 (embeddings, LayerNorm...); BatchNorm folds into its
    convolution."""
    import torch

    from ptopt.compress import quant_engine_pt2e as pt2e

    int8 = pt2e.int8_modules(converted)
    out = {n: "excluded (--exclude)" for n in excluded}
    for name, m in module.named_modules():
        own = name and any(True for _ in m.parameters(recurse=False))
        if not own or name in int8 or name in out or isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            continue
        out[name] = f"{type(m).__name__}: float in PT2E (X86InductorQuantizer makes conv / linear int8)"
    return out


#: token inputs by the names Hugging Face tokenizers give them
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


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
    return [
        dataclasses.replace(s, min_shape=(s.min_shape[0], 1), max_shape=(s.max_shape[0], limit))
        for s in specs
    ]


def _qat(config: Any, prep: Any, specs: list, style: str, progress: bool) -> tuple[Any, dict[str, Any]]:
    """prepare_qat_pt2e → the shared trainer → convert_pt2e."""
    import torch

    from ptopt.compress import quant_engine_pt2e as pt2e
    from ptopt.compress.qat import distill_loss
    from ptopt.compress.trainer import TrainConfig, cross_entropy_loss, train

    class Trainable(torch.nn.Module):
        """The prepared graph behind ``.train()``/``.eval()`` (an exported graph ignores them)."""

        def __init__(self, graph: Any):
            super().__init__()
            self.graph = graph

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return _logits(self.graph(*args, **kwargs))

        def train(self, mode: bool = True) -> Trainable:
            self.training = mode
            pt2e.set_training(self.graph, mode)
            return self

    module, swapped = linearized(prep.module, config.float_modules)
    prepared = Trainable(pt2e.prepare(module, specs, style, config, qat=True))
    tcfg = TrainConfig(
        epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
        weight_decay=config.weight_decay, seed=config.seed, keep_best=False,
    )  # fmt: skip
    data = prep.train
    teacher = prep.module.eval()
    loss = cross_entropy_loss if data.has_labels else distill_loss(lambda *a, **k: _logits(teacher(*a, **k)))
    result = train(prepared, data, tcfg, loss_fn=loss, progress=progress, description="QAT (pt2e)")
    pt2e.set_training(prepared.graph, False)
    converted = pt2e.convert(prepared.graph)
    summary = {"data": data.name, "samples": len(data), "epochs": config.epochs, "history": result.history}
    return converted, {"training": summary | {"engine": "pt2e"}, "conv1d_as_linear": swapped}


def _logits(out: Any) -> Any:
    """The tensor the trainer's losses take: a Hugging Face ModelOutput's (or dict's) ``logits``."""
    if isinstance(out, dict) and "logits" in out:
        return out["logits"]
    return out


def _auto(config: Any, prep: Any, refs: dict[str, Any], progress: bool) -> Any:
    """Both engines; the faster within the accuracy budget (see the module docstring)."""
    import dataclasses

    from ptopt.compress.quant_engine import FxTraceError
    from ptopt.compress.quant_steps import quantize_prepared
    from ptopt.core.inputspec import make_inputs
    from ptopt.core.timing import measure_interleaved

    batch = prep.loaded.input_specs[0].opt_shape[0] if prep.loaded.input_specs else 1
    try:
        fx = quantize_prepared(dataclasses.replace(config, engine="fx"), prep, refs, progress)
    except FxTraceError as e:  # fx cannot trace it: pt2e alone, and the reason said
        pt = quantize_pt2e(config, prep, refs, progress)
        reason = str(e).split(": ", 1)[-1].split(". ")[0][:160]
        why = f"torch.fx cannot trace the model ({reason}); torch.export can"
        pt.extra["engine_choice"] = {"chosen": "pt2e", "why": why, "p50_ms": {}, "batch": batch}
        return pt
    pt = quantize_pt2e(config, prep, refs, progress)
    x = make_inputs(prep.loaded.input_specs, prep.loaded.input_style, which="opt")
    results = {"fx": fx, "pt2e": pt}
    stats = measure_interleaved(
        {k: _timed(r.model, x) for k, r in results.items()}, rounds=3, min_iters=6, min_seconds=0.6
    )
    ms = {k: round(v["p50_ms"], 3) for k, v in stats.items()}
    drop = {k: r.metrics.get("accuracy_drop_points") for k, r in results.items()}
    fast, slow = sorted(ms, key=ms.get)  # type: ignore[arg-type]
    ok = drop[fast] is None or drop[fast] <= AUTO_MAX_DROP
    chosen = fast if ok else slow
    why = f"faster at batch {batch}" if ok else f"{fast} drops {drop[fast]} points (> {AUTO_MAX_DROP})"
    choice = {"chosen": chosen, "why": why, "p50_ms": ms, "accuracy_drop_points": drop, "batch": batch}
    winner = results[chosen]
    winner.extra["engine_choice"] = choice
    return winner


def fx_cannot_trace(config: Any, prep: Any, err: Exception) -> Exception:
    """fx's trace failure (``err``), pointing to ``--engine pt2e`` when this engine takes the config
    and torch.export captures the model (tried here, so the suggestion is one that runs)."""
    from ptopt.compress import quant_engine_pt2e as pt2e
    from ptopt.core.errors import PtoptError

    if config.mode not in pt2e.MODES or config.backend != "x86" or not config.per_channel:
        return err
    style = prep.loaded.input_style
    try:
        pt2e.capture(
            prep.module, token_sequence_specs(prep.module, list(prep.loaded.input_specs), style), style
        )
    except PtoptError:
        return err
    return type(err)(
        f"{str(err).rstrip('.')}. torch.export captures this model: add --engine pt2e (engine='pt2e'), "
        f"which writes an int8 AOTInductor package (e.g. -o model.int8.pt2)"
    )


#: layers nearest the output tried in float when the pt2e int8 model breaks the rule
MAX_HEAD_FLOAT = 4


def suggest_float_layers(config: Any, prep: Any) -> str:
    """What to do when the pt2e int8 model breaks export's parity rule: the fewest conv / linear
    layers nearest the output (a task head: classifier, pooler) that, kept float, make the converted
    q/dq graph hold it. Judged eagerly (no compile: seconds, not minutes) on the same data; the
    compiled kernels do not clamp 7-bit activations as the q/dq graph does and were the closer to
    fp32 where measured (BERT: 0.9996 here, 0.9997 in the package)."""
    import torch

    from ptopt.compress import quant_engine_pt2e as pt2e
    from ptopt.compress.fidelity import INT8_VS_FP32, fidelity_data, measure_fidelity

    if config.mode != "static":
        return ""
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    module, _ = linearized(prep.module, config.float_modules)
    layers = [n for n, m in module.named_modules() if isinstance(m, kinds) and n not in config.float_modules]
    style = prep.loaded.input_style
    specs = token_sequence_specs(prep.module, list(prep.loaded.input_specs), style)
    data = fidelity_data(prep.evald, prep.calib, prep.train, example=prep.example)
    batches, graph = calibration_batches(config, prep), pt2e.capture(module, specs, style)
    for k in range(1, min(MAX_HEAD_FLOAT, len(layers) - 1) + 1):
        floats = layers[-k:]
        candidate = config.replace(float_modules=tuple(config.float_modules) + tuple(floats))
        converted = pt2e.quantize_static(
            module, specs, style, candidate, batches, graph=pt2e.copy_graph(graph)
        )
        fid = measure_fidelity(prep.module, converted, data, **INT8_VS_FP32)
        if fid["passed"]:
            flags = " ".join(f"--exclude {n}" for n in floats)
            return (
                f" Keep {', '.join(floats)} in float: rerun with {flags} (float_modules={tuple(floats)!r}); "
                f"with them float the min cosine is {fid['min_cosine']:.4f}"
            )
    return (
        f" Keeping the {MAX_HEAD_FLOAT} conv / linear layers nearest the output float does not make it hold: "
        "use --engine fx where torch.fx traces the model, or --mode dynamic"
    )


def _timed(model: Any, x: Any) -> Any:
    import torch

    from ptopt.core.inputspec import call_model

    def run() -> Any:
        with torch.no_grad():
            return call_model(model, x)

    return run
