"""Which AOTInductor compile-and-load step crashes on a machine (seen: a segfault in
``aoti_load_package`` on the GPU machine's torch 2.11 image). Each variant runs in its own process, so a
crash costs that line only; prints one line per variant with its exit code and its last output line.

    python benchmarks/probe_aoti_load.py [--cuda]

Variants: plain ``aoti_compile_and_package`` + ``aoti_load_package``; the same with ptopt's options
(freezing, package metadata, no_grad); ``ptopt.export.export(..., "aoti")``; each on the CPU and, with
``--cuda``, on the GPU.
"""

from __future__ import annotations

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
    opts = {} if kind == "plain" else {"freezing": True, "aot_inductor.metadata": {"k": "v"}}
    with torch.no_grad():
        torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=opts)
    print("compiled", flush=True)
    fn = torch._inductor.aoti_load_package(path)
    print("loaded; max diff", (fn(x) - model(x)).abs().max().item())
"""


def main() -> None:
    devices = ["cpu"] + (["cuda"] if "--cuda" in sys.argv else [])
    procs = {}
    with tempfile.TemporaryDirectory() as d:
        for kind in ("plain", "options", "ptopt"):
            for device in devices:
                log = open(f"{d}/{kind}-{device}.log", "w+")  # noqa: SIM115 - read back below
                cmd = [sys.executable, "-c", VARIANT, kind, device]
                procs[(kind, device)] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
        for (kind, device), (proc, log) in procs.items():
            proc.wait(timeout=900)
            log.seek(0)
            text = log.read()
            lines = [ln for ln in text.splitlines() if ln.strip()]
            print(f"{kind:8s} {device:5s} exit {proc.returncode}: {(lines or [''])[-1][:300]}")
            if proc.returncode:
                print("    " + "\n    ".join(lines[-25:]))


if __name__ == "__main__":
    main()
