"""``ptopt demo``: the whole pipeline on the zoo ResNet-style CNN and bundled digits.

fp32 model (trained on first use, cached) → static int8, QAT, dynamic int8 (zoo LSTM), structured
pruning with distillation recovery, global pruning → TorchScript and ONNX exports (fp32 and int8;
TensorRT when available) → ``validate`` everything with gates → HTML report + Markdown summary →
a TorchServe ``.mar`` of the best artifact within the accuracy budget.

A second run reuses every artifact already in the output folder (``fresh=True`` rebuilds them).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact, sidecar_path

CNN = "zoo:resnet"
LSTM = "zoo:lstm"
TRAIN, TEST = "builtin:digits32:train", "builtin:digits32:test"
SEQ_TEST = "builtin:digits-seq:test"
#: the accuracy budget the demo gates on (points of top-1 accuracy)
MAX_ACCURACY_DROP = 1.0


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


def demo(
    output: str | Path = "ptopt-demo",
    *,
    fresh: bool = False,
    threads: int | None = None,
    log: Callable[[str], None] = print,
    min_seconds: float = 0.5,
) -> DemoResult:
    """Run the pipeline into ``output``; returns what was written and the validation results."""
    from ptopt.compress.prune import prune
    from ptopt.compress.quantize import quantize
    from ptopt.core.features import CHECKS
    from ptopt.core.modelref import load_model
    from ptopt.export.api import export
    from ptopt.serve.package import package
    from ptopt.validate.api import validate

    t_start = time.perf_counter()
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    arts: dict[str, Path] = {}
    reused: list[str] = []
    total = 11

    def step(n: int, name: str, filename: str, make: Callable[[Path], Any]) -> Path:
        path = out / filename
        if not fresh and sidecar_path(path).is_file() and path.exists():
            log(f"[{n}/{total}] {name}: reusing {path}")
            reused.append(filename)
        else:
            t0 = time.perf_counter()
            log(f"[{n}/{total}] {name} ...")
            make(path)
            log(f"[{n}/{total}] {name}: {path} ({time.perf_counter() - t0:.1f} s)")
        arts[name] = path
        return path

    log(f"[0/{total}] fp32 models: {CNN} and {LSTM} (trained on bundled digits on first use, then cached)")
    load_model(CNN)
    load_model(LSTM)

    int8 = step(
        1,
        "static int8",
        "resnet.int8.pt",
        lambda p: quantize(CNN, "static", p, calib_data=TRAIN, eval_data=TEST, progress=False),
    )
    step(
        2,
        "QAT int8 (1 epoch)",
        "resnet.qat.pt",
        lambda p: quantize(CNN, "qat", p, train_data=TRAIN, eval_data=TEST, epochs=1, progress=False),
    )
    lstm8 = step(
        3,
        "dynamic int8 LSTM",
        "lstm.int8.pt",
        lambda p: quantize(LSTM, "dynamic", p, eval_data=SEQ_TEST, progress=False),
    )
    step(
        4,
        "structured pruning 50% + distillation",
        "resnet.pruned.pt",
        lambda p: prune(
            CNN,
            "structured",
            0.5,
            p,
            fine_tune_data=TRAIN,
            eval_data=TEST,
            epochs=3,
            teacher="self",
            temperature=2.0,
            alpha=0.5,
            lr=2e-3,
        ),
    )
    step(
        5,
        "global pruning 50% + 1 epoch",
        "resnet.sparse.pt",
        lambda p: prune(CNN, "global", 0.5, p, fine_tune_data=TRAIN, eval_data=TEST, epochs=1),
    )
    step(6, "export TorchScript fp32", "resnet.ts.pt", lambda p: export(CNN, "torchscript", p))
    step(7, "export ONNX fp32", "resnet.onnx", lambda p: export(CNN, "onnx", p))
    step(8, "export ONNX int8", "resnet.int8.onnx", lambda p: export(int8, "onnx", p, data=TRAIN))
    if CHECKS["torch_tensorrt"]().available:
        step(
            8, "export TensorRT fp16", "resnet.trt.ep", lambda p: export(CNN, "tensorrt", p, precision="fp16")
        )
    else:
        log(f"[8/{total}] TensorRT: skipped ({CHECKS['torch_tensorrt']().detail}; needs CUDA)")

    cnn_arts = [str(p) for k, p in arts.items() if k != "dynamic int8 LSTM"]
    log(
        f"[9/{total}] validate {len(cnn_arts)} artifacts against {CNN} on {TEST} "
        f"(gate: accuracy drop <= {MAX_ACCURACY_DROP} points)"
    )
    result = validate(
        CNN,
        cnn_arts,
        TEST,
        batch_sizes=(1, 32),
        threads=threads,
        max_accuracy_drop=MAX_ACCURACY_DROP,
        json_path=out / "report.json",
        markdown_path=out / "summary.md",
        report_path=out / "report.html",
        junit_path=out / "junit.xml",
        min_seconds=min_seconds,
    )
    log(f"[10/{total}] validate the dynamic int8 LSTM against {LSTM} on {SEQ_TEST}")
    lstm_result = validate(
        LSTM,
        [str(lstm8)],
        SEQ_TEST,
        batch_sizes=(1, 32),
        threads=threads,
        max_accuracy_drop=MAX_ACCURACY_DROP,
        json_path=out / "lstm-report.json",
        markdown_path=out / "lstm-summary.md",
        min_seconds=min_seconds,
    )

    mar = None
    best = result.best
    if best is not None:
        best_path = next((p for p in cnn_arts if Path(p).name == Path(best).name or p == best), None)
        if (
            best_path is not None
            and Artifact.maybe_load(best_path) is not None
            and Artifact.load(best_path).format in ("torchscript", "onnx")
        ):
            mar = out / "resnet-best.mar"
            log(f"[11/{total}] package the best artifact within budget ({Path(best_path).name}) as {mar}")
            package(best_path, "mar", mar)
        else:
            log(f"[11/{total}] best artifact {best} is not a TorchScript/ONNX file; no .mar written")
    else:
        log(f"[11/{total}] no artifact met the accuracy budget; no .mar written")
    return DemoResult(out, arts, result, lstm_result, mar, best, time.perf_counter() - t_start, reused)
