"""``ptopt demo``: the whole pipeline on the zoo ResNet-style CNN and bundled digits.

fp32 model (shipped trained weights, cached) → static int8, QAT, dynamic int8 (zoo LSTM), structured
pruning with distillation recovery, global pruning → TorchScript and ONNX exports (fp32 and int8;
TensorRT when available) → ``validate`` everything with gates → HTML report + Markdown summary →
a TorchServe ``.mar`` of the best artifact within the accuracy budget.

The demo is a built-in recipe (``demo_recipe``: steps and vars, as ``ptopt run`` reads them) run by
``ptopt.pipeline``. A second run reuses every artifact already in the output folder (``fresh=True``
rebuilds them).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptopt.core.options import Options, Part, option

CNN = "zoo:resnet"
LSTM = "zoo:lstm"
TRAIN, TEST = "builtin:digits32:train", "builtin:digits32:test"
SEQ_TEST = "builtin:digits-seq:test"
#: the accuracy budget the demo gates on (points of top-1 accuracy)
MAX_ACCURACY_DROP = 1.0
#: artifact steps of the CNN: (id, title, command, file name, options)
CNN_STEPS: tuple[tuple[str, str, str, str, dict[str, Any]], ...] = (
    ("int8", "static int8 (256 calibration samples)", "quantize", "resnet.int8.pt",
     {"model": CNN, "mode": "static", "calib_data": TRAIN, "calibration_batches": 8, "eval_data": TEST,
      "progress": None}),
    ("qat", "QAT int8 (8 steps of 64)", "quantize", "resnet.qat.pt",
     {"model": CNN, "mode": "qat", "train_data": TRAIN, "eval_data": TEST, "epochs": 1, "max_steps": 8,
      "progress": None}),
    ("lstm8", "dynamic int8 LSTM", "quantize", "lstm.int8.pt",
     {"model": LSTM, "mode": "dynamic", "eval_data": SEQ_TEST, "progress": None}),
    ("pruned", "structured pruning 50% + distillation", "prune", "resnet.pruned.pt",
     {"model": CNN, "method": "structured", "amount": 0.5, "fine_tune_data": TRAIN, "eval_data": TEST,
      "epochs": 3, "teacher": "self", "temperature": 2.0, "alpha": 0.5, "lr": 2e-3, "progress": True}),
    ("sparse", "global pruning 50% + 1 epoch", "prune", "resnet.sparse.pt",
     {"model": CNN, "method": "global", "amount": 0.5, "fine_tune_data": TRAIN, "eval_data": TEST, "epochs": 1,
      "progress": True}),
    ("ts", "export TorchScript fp32", "export", "resnet.ts.pt", {"model": CNN, "target": "torchscript"}),
    ("onnx", "export ONNX fp32", "export", "resnet.onnx", {"model": CNN, "target": "onnx"}),
    ("int8_onnx", "export ONNX int8", "export", "resnet.int8.onnx",
     {"model": "${int8}", "target": "onnx", "data": TRAIN}),
    ("trt", "export TensorRT fp16", "export", "resnet.trt.ep",
     {"model": CNN, "target": "tensorrt", "precision": "fp16"}),
)  # fmt: skip


@dataclasses.dataclass
class DemoResult:
    output: Path
    artifacts: dict[str, Path]
    validation: Any  # ValidationResult of the CNN artifacts
    lstm_validation: Any
    mar: Path | None
    best: str | None
    seconds: float
    reused: list[str]

    @property
    def passed(self) -> bool:
        return bool(self.validation.passed and self.lstm_validation.passed)


def _tensorrt_missing(scope: dict[str, Any]) -> str | None:
    from ptopt.core.features import CHECKS

    check = CHECKS["torch_tensorrt"]()
    return None if check.available else f"TensorRT: skipped ({check.detail}; needs CUDA)"


def _best_not_packageable(scope: dict[str, Any]) -> str | None:
    from ptopt.core.artifact import Artifact

    best, path = scope["cnn"]["best"], scope["cnn"]["best_path"]
    if best is None or path is None:
        return "no artifact met the accuracy budget; no .mar written"
    art = Artifact.maybe_load(path)
    if art is None or art.format not in ("torchscript", "onnx"):
        return f"best artifact {best} is not a TorchScript/ONNX file; no .mar written"
    return None


def demo_recipe(
    *,
    threads: int | None = None,
    min_seconds: float = 0.5,
    tensorrt: bool = False,
    min_iters: int | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    """The demo as a recipe: the artifact steps, two validations with gates, the best as a ``.mar``.
    Set var ``out`` to the output folder. ``tensorrt``: whether the TensorRT export can run here (its
    step is in the recipe either way, skipped where it cannot). ``min_seconds`` / ``min_iters``: the
    validations' timing per artifact and batch size, totals over the ``rounds`` (validate's options; None:
    its default)."""
    steps: list[dict[str, Any]] = []
    for sid, title, command, filename, options in CNN_STEPS:
        when = {"when": _tensorrt_missing} if sid == "trt" else {}
        steps.append(
            {command: {"id": sid, "title": title, **when, **options, "output": f"${{out}}/{filename}"}}
        )
    cnn_arts = [f"${{{s[0]}}}" for s in CNN_STEPS if s[0] != "lstm8" and (s[0] != "trt" or tensorrt)]
    timing = {"batch_sizes": [1, 32], "threads": threads, "min_seconds": min_seconds}
    timing |= {k: v for k, v in (("min_iters", min_iters), ("rounds", rounds)) if v is not None}
    gate = {"max_accuracy_drop": MAX_ACCURACY_DROP}
    cnn_title = (
        f"validate {len(cnn_arts)} artifacts against {CNN} on {TEST} "
        f"(gate: accuracy drop <= {MAX_ACCURACY_DROP} points)"
    )
    cnn_reports = {k: f"${{out}}/{v}" for k, v in (
        ("json_path", "report.json"), ("markdown_path", "summary.md"), ("report_path", "report.html"),
        ("junit_path", "junit.xml"),
    )}  # fmt: skip
    lstm_reports = {"json_path": "${out}/lstm-report.json", "markdown_path": "${out}/lstm-summary.md"}
    steps += [
        {"validate": {"id": "cnn", "title": cnn_title, "reference": CNN, "artifacts": cnn_arts, "data": TEST,
                      **timing, **gate, **cnn_reports}},
        {"validate": {"id": "lstm_check", "title": f"validate the dynamic int8 LSTM against {LSTM} on {SEQ_TEST}",
                      "reference": LSTM, "artifacts": ["${lstm8}"], "data": SEQ_TEST, **timing, **gate,
                      **lstm_reports}},
        {"package": {"id": "mar", "when": _best_not_packageable,
                     "title": "package the fastest artifact within budget (${cnn.best}) as ${out}/resnet-best.mar",
                     "artifact": "${cnn.best_path}", "format": "mar", "output": "${out}/resnet-best.mar"}},
    ]  # fmt: skip
    return {"version": 1, "vars": {"out": "ptopt-demo"}, "steps": steps}


class _Progress:
    """The demo's progress lines: ``[n/total] title ...`` and ``[n/total] title: path (s)`` per artifact;
    a skipped step's reason under the number of the step before it."""

    def __init__(self, total: int, log: Callable[[str], None]):
        self.n, self.total, self.log = 0, total, log
        self.reused: list[str] = []

    def __call__(self, event: Any) -> None:
        res = event.result
        if event.kind in ("start", "reused"):
            self.n += 1
        tag = f"[{self.n}/{self.total}]"
        producing = event.step.command not in ("validate", "package")
        if event.kind == "skipped":
            self.log(f"{tag} {res.reason}")
        elif event.kind == "start":
            self.log(f"{tag} {event.title} ..." if producing else f"{tag} {event.title}")
        elif event.kind == "reused":
            self.log(f"{tag} {event.title}: reusing {res.outputs['output']}")
            self.reused.append(Path(res.outputs["output"]).name)
        elif event.kind == "done" and producing:
            self.log(f"{tag} {event.title}: {res.outputs['output']} ({res.seconds:.1f} s)")


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """How the demo runs (the validations' timing: validate's ``LatencyOptions``)."""

    fresh: bool = option(False, help="Rebuild every artifact instead of reusing those already in --output.")
    threads: int | None = option(None, help="Intra-op threads for every runtime (default: all usable cores).")


def _groups() -> tuple[Any, ...]:
    from ptopt.validate.latency import LatencyOptions

    return (DemoOptions, Part(LatencyOptions, ("min_seconds", "min_iters", "rounds")))


#: the options of ``ptopt demo`` / ``ptopt.demo.demo`` (its validations time 0.5 s per artifact and batch size)
OPTIONS = Options("demo", _groups, defaults={"min_seconds": 0.5})


@OPTIONS.twin
def demo(
    output: str | Path = "ptopt-demo", *, log: Callable[[str], None] = print, **options: Any
) -> DemoResult:
    """Run the demo recipe into ``output``; returns what was written and the validation results
    (``min_seconds`` / ``min_iters`` / ``rounds``: the validations' timing, as in :func:`demo_recipe`)."""
    from ptopt.core.features import CHECKS
    from ptopt.core.modelref import load_model
    from ptopt.pipeline import run_recipe
    from ptopt.validate.latency import LatencyOptions

    given = OPTIONS.check(options)
    opts = OPTIONS.build(DemoOptions, given)
    lat = OPTIONS.build(LatencyOptions, given)  # bad timing: refused before any work
    fresh, threads = opts.fresh, opts.threads
    t_start = time.perf_counter()
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    tensorrt = CHECKS["torch_tensorrt"]().available
    recipe = demo_recipe(
        threads=threads,
        tensorrt=tensorrt,
        min_seconds=lat.min_seconds,
        min_iters=lat.min_iters,
        rounds=lat.rounds,
    )
    progress = _Progress(len(recipe["steps"]) - (not tensorrt), log)
    log(f"[0/{progress.total}] fp32 models: {CNN} and {LSTM} (both ship trained; cached on first use)")
    load_model(CNN)
    load_model(LSTM)
    results = run_recipe(
        recipe,
        {"out": str(out)},
        source="demo",
        reuse=() if fresh else [s[0] for s in CNN_STEPS],
        stop_on_gate_failure=False,
        on_event=progress,
    )
    by_id = {r.step.id: r for r in results}
    arts = {
        r.title or r.step.command: Path(r.outputs["output"])
        for r in results
        if r.step.command != "validate" and r.step.id != "mar" and r.status != "skipped"
    }
    mar = by_id["mar"].outputs["output"]
    return DemoResult(
        out,
        arts,
        by_id["cnn"].value,
        by_id["lstm_check"].value,
        None if mar is None else Path(mar),
        by_id["cnn"].outputs["best"],
        time.perf_counter() - t_start,
        progress.reused,
    )
