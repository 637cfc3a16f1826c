"""Hand-built ``ptopt.optimize/2`` report dicts (docs/optimize.md's schema) for the report tests: no model
is built or timed, so the reports are tested on their own and fast."""

from __future__ import annotations

import copy
from typing import Any


def _lat(ms1: float | None, ms32: float | None, spread: float = 4.0) -> dict[str, Any]:
    out = {}
    for bs, ms in (("1", ms1), ("32", ms32)):
        if ms is not None:
            out[bs] = {"median": ms, "spread_pct": spread, "rounds": 9}
    return out


def machine() -> dict[str, Any]:
    """``ptopt.core.system.machine_summary()``'s shape, as validate's report and optimize's (since /2) carry."""
    return {
        "cpu": {
            "model": "AMD EPYC",
            "arch": "x86_64",
            "logical_cores": 2,
            "usable_cores": 2,
            "isa": {"avx2": True, "fma": True, "avx512_vnni": False, "amx_int8": False},
        },
        "os": "Linux 6.18.44",
        "hostname": "ci-runner",
        "versions": {"python": "3.11.7", "ptopt": "0.1.0", "torch": "2.13.0"},
    }


def candidate(name: str, **over: Any) -> dict[str, Any]:
    c = {
        "name": name,
        "label": name.replace("-", " "),
        "technique": "fp32",
        "format": "eager",
        "runtime": "torch",
        "engine": None,
        "precision": "fp32",
        "status": "kept",
        "reason": None,
        "path": None,
        "size_bytes": 1_238_293,
        "accuracy": 0.9944,
        "accuracy_drop": 0.0,
        "cosine_min": 1.0,
        "latency_ms": _lat(3.601, 36.54),
        "speedup": {"1": 1.0, "32": 1.0},
        "within_budget": True,
        "build_seconds": 0.0,
        "steps": [],
    }
    c.update(over)
    return c


def winner_report() -> dict[str, Any]:
    """Six candidates: a winner (ORT QDQ int8), a rejected one, a failed one (no numbers), a skipped one,
    a noisy one; budget on top-1."""
    cands = [
        candidate("fp32-eager"),
        candidate(
            "fp32-torchscript", format="torchscript", path="candidates/fp32-torchscript.pt",
            latency_ms=_lat(2.671, 32.13), speedup={"1": 1.35, "32": 1.14}, build_seconds=1.2,
            steps=["export --target torchscript"],
        ),
        candidate(
            "fp32-onnx", format="onnx", runtime="onnxruntime", path="candidates/fp32-onnx.onnx",
            size_bytes=1_233_743, latency_ms=_lat(0.824, 21.21, spread=31.0), speedup={"1": 4.37, "32": 1.72},
            noisy=True, build_seconds=2.0, steps=["export --target onnx"],
        ),
        candidate(
            "int8-fx", technique="static-int8", format="torchscript", engine="fx", precision="int8",
            path="candidates/int8-fx.pt", size_bytes=338_541, accuracy=0.9900, accuracy_drop=0.44,
            cosine_min=0.9981, latency_ms=_lat(0.828, 20.20), speedup={"1": 4.35, "32": 1.81},
            build_seconds=7.0, steps=["quantize --mode static --engine fx"],
        ),
        candidate(
            "int8-onnx-qdq", label="static int8, ONNX Runtime QDQ", technique="static-int8", format="onnx",
            runtime="onnxruntime", engine="ort", precision="int8", path="candidates/int8-onnx-qdq.onnx",
            size_bytes=338_601, accuracy=0.9911, accuracy_drop=0.33, cosine_min=0.9978,
            latency_ms=_lat(0.590, 13.83), speedup={"1": 6.10, "32": 2.64}, build_seconds=12.3,
            steps=["quantize --mode static --engine ort", "export --target onnx --precision int8"],
        ),
        candidate(
            "int8-pt2e", technique="static-int8", format="aoti", runtime="aoti", engine="pt2e",
            precision="int8", status="rejected", reason="accuracy drop 2.10 points > 1 allowed",
            size_bytes=401_112, accuracy=0.9734, accuracy_drop=2.10, cosine_min=0.9612,
            latency_ms=_lat(0.450, 11.90), speedup={"1": 8.0, "32": 3.07}, within_budget=False,
            build_seconds=40.0,
        ),
        candidate(
            "dynamic-int8", technique="dynamic-int8", precision="int8", status="skipped",
            reason="the model has no Linear/LSTM/GRU layer worth it", size_bytes=None, accuracy=None,
            accuracy_drop=None, cosine_min=None, latency_ms={}, speedup={}, within_budget=None,
            build_seconds=None,
        ),
        candidate(
            "int8-autoquant", technique="autoquant-int8", format="torchscript", precision="int8",
            status="failed", reason="RuntimeError: cannot fuse conv | relu", size_bytes=None, accuracy=None,
            accuracy_drop=None, cosine_min=None, latency_ms=None, speedup=None, within_budget=None,
            build_seconds=3.1,
        ),
    ]  # fmt: skip
    return {
        "schema": "ptopt.optimize/2",
        "ptopt_version": "0.1.0",
        "torch_version": "2.13.0",
        "machine": machine(),
        "threads": 2,
        "device": "cpu",
        "model": "zoo:resnet",
        "budget": {"max_accuracy_drop": 1.0, "min_cosine": None},
        "batch_sizes": [1, 32],
        "runtime": "any",
        "time_budget_s": 600,
        "elapsed_s": 312.4,
        "metric": "top1",
        "reference": "fp32 eager",
        "candidates": cands,
        "best": "int8-onnx-qdq",
        "best_within_budget": True,
        "ranking_batch_size": 32,
        "exit_code": 0,
    }


def no_winner_report(best_found: bool = True) -> dict[str, Any]:
    """Nothing meets a tight budget; the best found (``int8-fx``) is still named unless ``best_found`` is False."""
    r = copy.deepcopy(winner_report())
    r["budget"] = {"max_accuracy_drop": 0.1, "min_cosine": None}
    for c in r["candidates"]:
        if c["status"] == "kept" and (c["accuracy_drop"] or 0) > 0.1:
            c.update(status="rejected", reason=f"accuracy drop {c['accuracy_drop']:.2f} points > 0.1 allowed")
            c["within_budget"] = False
        elif c["status"] == "kept":  # the fp32 formats: the time budget ran out before they were timed
            c.update(status="skipped", reason="time budget spent", latency_ms={}, speedup={})
    r.update(best="int8-fx" if best_found else None, best_within_budget=False, exit_code=1)
    return r


def cosine_report() -> dict[str, Any]:
    """Unlabeled eval data: the budget is the worst-sample cosine; no accuracy anywhere."""
    r = copy.deepcopy(winner_report())
    r["budget"] = {"max_accuracy_drop": None, "min_cosine": 0.99}
    r["metric"] = "cosine"
    for c in r["candidates"]:
        c["accuracy"] = c["accuracy_drop"] = None
    return r


def single_report() -> dict[str, Any]:
    """One candidate (the fp32 reference) wins: nothing else was allowed (e.g. --runtime torch, tiny budget)."""
    r = copy.deepcopy(winner_report())
    r["candidates"] = [r["candidates"][0]]
    r["batch_sizes"], r["ranking_batch_size"] = [32], 32
    r["best"] = "fp32-eager"
    return r


def v1_report() -> dict[str, Any]:
    """A ``ptopt.optimize/1`` report: its reduced ``machine`` dict (CPU model, ISA flags as one string,
    threads, device), the versions at the top level."""
    r = copy.deepcopy(winner_report())
    r["schema"] = "ptopt.optimize/1"
    r["machine"] = {"cpu": "AMD EPYC", "isa": "avx2,fma", "threads": 2, "device": "cpu"}
    del r["threads"], r["device"]
    return r
