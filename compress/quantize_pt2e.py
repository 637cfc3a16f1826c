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
    from ptopt.core.result import Result
    from ptopt.export.aoti import load_aoti
    from ptopt.export.writers import serialized_bytes

    specs, style = list(prep.loaded.input_specs), prep.loaded.input_style
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
    fp32_bytes = serialized_bytes(prep.module, "torchscript", prep.example, specs=specs or None, style=style)
    metrics |= {
        "fp32_torchscript_bytes": fp32_bytes,
        "size_ratio_vs_fp32_torchscript": round(path.stat().st_size / fp32_bytes, 4),
        "larger_than_fp32": path.stat().st_size > fp32_bytes,  # the package carries compiled code
        **facts["metrics"],
    }
    metrics |= vs_fp32(prep.module, model, prep)
    cfg = config.to_dict() | {"mode": config.mode, "engine": "pt2e"}
    cfg |= {k: str(v) for k, v in refs.items() if isinstance(v, (str, os.PathLike))}
    excluded = {n: "excluded (--exclude)" for n in config.float_modules}
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
        batches = []
        for b in prep.calib.batches(config.batch_size, shuffle=True, seed=0):
            if len(batches) >= config.calibration_batches:
                break
            batches.append(b.x)
        converted = pt2e.quantize_static(prep.module, specs, style, config, batches)
        samples = sum(batch_size_of(x) for x in batches)
        calibration = {"data": prep.calib.name, "batches": len(batches), "samples": samples}
        calibration["batch_size"] = config.batch_size
        return converted, {
            "calibration": calibration | {"observer": config.observer, "per_channel": True, "engine": "pt2e"}
        }
    return _qat(config, prep, specs, style, progress)


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
            return self.graph(*args, **kwargs)

        def train(self, mode: bool = True) -> Trainable:
            self.training = mode
            pt2e.set_training(self.graph, mode)
            return self

    prepared = Trainable(pt2e.prepare(prep.module, specs, style, config, qat=True))
    tcfg = TrainConfig(
        epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
        weight_decay=config.weight_decay, seed=config.seed, keep_best=False,
    )  # fmt: skip
    data = prep.train
    loss = cross_entropy_loss if data.has_labels else distill_loss(prep.module.eval())
    result = train(prepared, data, tcfg, loss_fn=loss, progress=progress, description="QAT (pt2e)")
    pt2e.set_training(prepared.graph, False)
    converted = pt2e.convert(prepared.graph)
    summary = {"data": data.name, "samples": len(data), "epochs": config.epochs, "history": result.history}
    return converted, {"training": summary | {"engine": "pt2e"}}


def _auto(config: Any, prep: Any, refs: dict[str, Any], progress: bool) -> Any:
    """Both engines; the faster within the accuracy budget (see the module docstring)."""
    import dataclasses

    from ptopt.compress.quant_steps import quantize_prepared
    from ptopt.core.inputspec import make_inputs
    from ptopt.core.timing import measure_interleaved

    fx = quantize_prepared(dataclasses.replace(config, engine="fx"), prep, refs, progress)
    pt = quantize_pt2e(config, prep, refs, progress)
    x = make_inputs(prep.loaded.input_specs, prep.loaded.input_style, which="opt")
    batch = prep.loaded.input_specs[0].opt_shape[0] if prep.loaded.input_specs else 1
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


def _timed(model: Any, x: Any) -> Any:
    import torch

    from ptopt.core.inputspec import call_model

    def run() -> Any:
        with torch.no_grad():
            return call_model(model, x)

    return run
