"""Which AOTInductor compile-and-load step crashes on a machine (seen: a segfault in
``aoti_load_package`` on the GPU machine's torch 2.11 image; the same torch 2.11.0+cu130 loads the same
packages on this project's CPU machines). Each variant runs in its own process, so a crash costs that line
only; prints one line per variant with its exit code and its last output line, then the toolchain facts.
A variant that dies of a signal is run once more under ``cuda-gdb`` (the GPU image has no gdb) for the
native backtrace.

    python benchmarks/probe_aoti_load.py [--cuda]

Variants, each on the CPU and, with ``--cuda``, on the GPU:

- ``plain``: ``aoti_compile_and_package`` + ``aoti_load_package``;
- ``options``: the same with ptopt's options (freezing, package metadata, no_grad);
- ``container``: the plain package run by torch's model-container runner, without the package loader
  (``ptopt.formats.aoti_container``: what ptopt falls back to where the package loader crashes);
- ``ptopt``: ``ptopt.export.export(..., "aoti")`` (its parity check loads the package the way ptopt does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

VARIANT = r"""
import faulthandler, os, sys, tempfile, torch
faulthandler.enable()
kind, device = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval().to(device)
x = torch.randn(2, 8, device=device)
d = tempfile.mkdtemp()
path = os.path.join(d, "m.pt2")
if kind == "ptopt":
    from ptopt.export.api import export
    res = export(model.cpu(), "aoti", path, input_shapes="2x8", device=device)
    print("ptopt export ok, parity", res.metrics["parity"]["passed"])
else:
    ep = torch.export.export(model, (x,))
    opts = {"freezing": True, "aot_inductor.metadata": {"k": "v"}} if kind == "options" else {}
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=opts)
    print("compiled", flush=True)
    if kind == "container":
        from ptopt.formats.aoti_container import ContainerModel
        fn = ContainerModel(path, "model", "cuda:0" if device == "cuda" else "cpu")
    else:
        fn = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        print("loaded; max diff", (fn(x) - model(x)).abs().max().item())
"""
KINDS = ("plain", "options", "container", "ptopt")


def facts() -> list[str]:
    """The toolchain the packages are compiled with (a crash in the loader can come from there)."""
    out = []
    for cmd in (["g++", "--version"], ["ldd", "--version"], ["nvcc", "--version"]):
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            out.append(f"{' '.join(cmd)}: {(run.stdout or run.stderr).strip().splitlines()[0]}")
        except (OSError, IndexError, subprocess.TimeoutExpired) as e:
            out.append(f"{' '.join(cmd)}: {type(e).__name__}")
    code = "import torch, torch._inductor.config as c; print(torch.__version__, c.cpp.cxx, torch._C._GLIBCXX_USE_CXX11_ABI)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    out.append(
        f"torch, Inductor's C++ compiler, CXX11 ABI: {run.stdout.strip() or run.stderr.strip()[-200:]}"
    )
    env = {k: v for k, v in os.environ.items() if k.startswith(("TORCH", "LD_", "CUDA", "CC", "CXX", "TMP"))}
    out.append(f"environment: {env}")
    return out


def backtrace(kind: str, device: str) -> str:
    """The crashing variant once more under cuda-gdb: the native frames of the crash (last 40 lines)."""
    gdb = shutil.which("cuda-gdb")
    if gdb is None:
        return "    (no cuda-gdb here for a backtrace)"
    cmd = [
        gdb,
        "-q",
        "-batch",
        "-ex",
        "run",
        "-ex",
        "bt 30",
        "--args",
        sys.executable,
        "-c",
        VARIANT,
        kind,
        device,
    ]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return "    (cuda-gdb did not finish in 240 s)"
    lines = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.strip()]
    return "    gdb| " + "\n    gdb| ".join(lines[-40:])


def main() -> None:
    devices = ["cpu"] + (["cuda"] if "--cuda" in sys.argv else [])
    procs, crashed = {}, []
    with tempfile.TemporaryDirectory() as d:
        for kind in KINDS:
            for device in devices:
                log = open(f"{d}/{kind}-{device}.log", "w+")  # noqa: SIM115 - read back below
                cmd = [sys.executable, "-c", VARIANT, kind, device]
                procs[(kind, device)] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
        for (kind, device), (proc, log) in procs.items():
            proc.wait(timeout=900)
            log.seek(0)
            lines = [ln for ln in log.read().splitlines() if ln.strip()]
            print(f"{kind:9s} {device:5s} exit {proc.returncode}: {(lines or [''])[-1][:300]}", flush=True)
            if proc.returncode:
                print("    " + "\n    ".join(lines[-25:]))
            if proc.returncode < 0:
                crashed.append((kind, device))
    print("\n".join(facts()), flush=True)
    for kind, device in crashed[:1]:  # one backtrace says where
        print(f"backtrace of {kind} {device}:\n{backtrace(kind, device)}", flush=True)


if __name__ == "__main__":
    main()
