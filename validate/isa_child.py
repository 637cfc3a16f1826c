"""The child process of ``validate --isa`` (``python -m ptopt.validate.isa_child JOB.json``): started by
``ptopt.validate.isa`` with one CPU level's caps in its environment, before any kernel library loaded.

It runs every model of the job on the job's samples (accuracy pass, agreement with the reference's
outputs of the parent's native run, the metric), then, with all of them loaded, times them in
interleaved rounds as the parent does. After each model it rewrites the result file (atomically), so a
crash loses only what was running: the parent reports the rest and names the level that crashed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _load(path: str) -> Any:
    import torch

    from ptopt.core.hf import ensure_torchvision_ops

    # a pickled model whose module imports torchvision (timm's, torchvision's own) needs its ops beside the
    # CPU torch before it unpickles, as in the parent (``formats.eager``); else every model here fails
    ensure_torchvision_ops()
    # the parent wrote these files into its private temporary folder a moment ago: its own objects
    return torch.load(path, weights_only=False)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


class _Results:
    """The result file, rewritten whole after every step."""

    def __init__(self, path: Path, level: str):
        import torch

        self.path = path
        self.data: dict[str, Any] = {
            "level": level,
            "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "models": {},
        }

    def put(self, name: str, **figures: Any) -> None:
        self.data["models"].setdefault(name, {}).update(figures)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, default=float), encoding="utf-8")
        os.replace(tmp, self.path)


def _model(spec: dict[str, Any]) -> Any:
    return _load(spec["pickle"]) if spec.get("pickle") else spec["ref"]


def _open(spec: dict[str, Any], job: dict[str, Any]) -> Any:
    from ptopt.validate.runners import open_runner

    runner = open_runner(
        _model(spec), spec["name"], weights=spec.get("weights"), allow_pickle=job["allow_pickle"],
        providers=job.get("providers"),
    )  # fmt: skip
    try:
        runner.prepare(job["threads"])
    except BaseException:
        runner.close()
        raise
    return runner


def _accuracy(
    spec: dict[str, Any], job: dict[str, Any], ds: Any, ref_out: Any, metric: Any
) -> dict[str, Any]:
    from ptopt.validate.api import _eval_batch_size, evaluate_outputs
    from ptopt.validate.metrics import (
        agreement,
        at_real_tokens,
        attention_mask_of,
        compute_metric,
        per_sample_cosine,
    )

    t0 = time.perf_counter()
    runner = _open(spec, job)
    try:
        out = evaluate_outputs(runner, ds, _eval_batch_size(runner, job["eval_batch_size"], len(ds)))
    finally:
        runner.close()
    if out.shape[0] != len(ds):  # OpenVINO 2026.4 at the sse41 cap answers a dynamic batch with no rows
        raise RuntimeError(f"it returned {out.shape[0]} output rows for {len(ds)} samples")
    fig: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 2)}
    if metric is not None:
        fig["metric"] = compute_metric(metric, out, ds.y)
    mask = attention_mask_of(ds.x)  # judged at the real tokens, as the main table's figures are
    if spec["role"] != "reference":
        fig["agreement"] = agreement(ref_out, out, class_scores=job.get("class_scores", True), mask=mask)
    if spec["role"] != "reference" and tuple(out.shape) == tuple(ref_out.shape):
        if job.get("cosines"):
            fig["cosines"] = [float(c) for c in per_sample_cosine(*at_real_tokens(ref_out, out, mask))]
    return fig


def _latency(specs: list[dict[str, Any]], job: dict[str, Any], ds: Any, results: _Results) -> None:
    from ptopt.validate.latency import LatencyOptions, measure_runners

    runners = []
    try:
        for spec in specs:
            runners.append(_open(spec, job))
        lats = measure_runners(runners, ds, job["batch_sizes"], LatencyOptions(**job["latency"]))
    finally:
        for r in runners:
            r.close()
    for spec, lat in zip(specs, lats, strict=True):
        results.put(spec["name"], latency={str(bs): st for bs, st in lat.items()})


def run(job_path: Path) -> int:
    job = json.loads(job_path.read_text(encoding="utf-8"))
    import torch

    torch.set_num_threads(job["threads"])
    results = _Results(Path(job["out"]), job["level"])
    ds, ref_out = _load(job["data"]), _load(job["ref_outputs"])
    metric = _load(job["metric"]) if job.get("metric") else None
    ok = []
    for spec in job["models"]:
        try:
            results.put(spec["name"], **_accuracy(spec, job, ds, ref_out, metric))
            ok.append(spec)
        except Exception as e:  # noqa: BLE001 - any failure at this level is that model's line
            results.put(spec["name"], error=f"{type(e).__name__}: {_first_line(e)}")
    if job.get("latency") and ok:
        try:
            _latency(ok, job, ds, results)
        except Exception as e:  # noqa: BLE001 - the accuracy figures stand
            for spec in ok:
                results.put(spec["name"], latency_error=f"{type(e).__name__}: {_first_line(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
