"""What a PT2E int8 ``.pt2`` holds, with and without the fp32 weights ``convert_pt2e`` leaves attached
(issue 41: "PT2E int8 files are 4-6x their fp32 source on small transformers"). Prints the file's bytes,
the bytes of its weights/constants entries, the fp32 TorchScript's bytes and the int8 check's min cosine.

    PYTHONPATH=. python benchmarks/probe_pt2e_size.py bert drop        # benchmarks.archs:bert, as ptopt does now
    PYTHONPATH=. python benchmarks/probe_pt2e_size.py bert keep        # the fp32 weights kept (before the fix)
    PYTHONPATH=. python benchmarks/probe_pt2e_size.py zoo:resnet drop  # the zoo ResNet on digits32
    ... [aoti]                                                         # the AOTInductor package (compiles)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ptopt  # noqa: E402
from ptopt.compress.quantize import engine_pt2e  # noqa: E402


def main() -> None:
    name, how, compile_ = sys.argv[1], sys.argv[2], len(sys.argv) > 3
    if how == "keep":
        engine_pt2e.drop_unread = lambda g: g
    if name.startswith("zoo:"):
        model, calib, extra = name, "builtin:digits32:train", {"calibration_batches": 4}
    else:
        from benchmarks import archs

        model, calib, extra = getattr(archs, name)(), getattr(archs, name + "_calib")(), {}
    t = time.time()
    res = ptopt.quantize(model, mode="static", engine="pt2e", compile=compile_, calib_data=calib, progress=False,
                         **extra)  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "m.int8.pt2"
        res.save(out)
        entries = zipfile.ZipFile(out).infolist()
        held = sum(i.file_size for i in entries if "/weights/" in i.filename or "/constants/" in i.filename)
        m = res.metrics
        print(name, how, "compiled" if compile_ else "program", "file", os.path.getsize(out), "weights/constants",
              held, "fp32 TS", m.get("fp32_torchscript_bytes"), "ratio", m.get("size_ratio_vs_fp32_torchscript"),
              "min_cos", m.get("min_cosine"), round(time.time() - t), "s", flush=True)  # fmt: skip
        for i in sorted(entries, key=lambda i: -i.file_size)[:6]:
            print("  ", i.file_size, i.filename)


if __name__ == "__main__":
    main()
