"""Static int8 of a Hugging Face BERT classifier through the PT2E engine vs fp32 eager (issue 18).

The model is ``tests.compress.hf_models:bert`` (BertForSequenceClassification, 2 layers, hidden 128,
4 heads, vocab 1000, random weights), calibrated on 64 padded sequences of 32 tokens
(``tests.compress.hf_models:bert_tokens``: ``attention_mask`` rows end in 0-15 padded positions):

    ptopt quantize tests.compress.hf_models:bert --mode static --engine pt2e \\
        --calib-data tests.compress.hf_models:bert_tokens \\
        --exclude bert.pooler.dense --exclude classifier -o bert.int8.pt2

(the head is kept float: whole-model int8 of this random-weight model misses the int8 rule, and the
refusal names these two layers). Measured here:

1. fidelity: the worst-sample cosine of the logits against fp32 on padded batches the model was not
   calibrated on (batch × tokens 1×32, 5×17, 8×64, 3×9, 16×32), and the quantize step's own check;
2. size: the package's bytes against the fp32 TorchScript's (the package carries compiled code);
3. speed: fp32 eager, the int8 package and dynamic int8 (``--mode dynamic``, TorchScript, the same
   head float) at batch
   1 and 8 × 32 tokens (padded), timed in the same interleaved rounds, 2 threads.

Run: PYTHONPATH=. python benchmarks/bench_bert_pt2e.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, setup, write_result  # noqa: E402

THREADS = setup(2)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ptopt  # noqa: E402
from ptopt.core.timing import measure_interleaved  # noqa: E402
from tests.compress.hf_models import bert, bert_tokens  # noqa: E402

HEAD = ["bert.pooler.dense", "classifier"]
SHAPES = ((1, 32), (5, 17), (8, 64), (3, 9), (16, 32))


def logits(out):
    if isinstance(out, dict):
        return out["logits"]
    return getattr(out, "logits", out)


def worst_cosine(fp32, model) -> float:
    worst = 1.0
    with torch.no_grad():
        for n, seq in SHAPES:
            x = bert_tokens(n, seq, seed=100 + n)["x"]
            cos = F.cosine_similarity(fp32(**x).logits, logits(model(**x)), dim=-1)
            worst = min(worst, float(cos.min()))
    return worst


def main() -> None:
    fp32 = bert()
    calib = bert_tokens()["x"]
    tmp = Path(tempfile.mkdtemp(prefix="bench-bert-"))
    t0 = time.perf_counter()
    int8 = ptopt.quantize(
        fp32, "static", tmp / "bert.int8.pt2", calib_data=calib, engine="pt2e", exclude=HEAD, progress=False
    )
    build_s = time.perf_counter() - t0
    dyn = ptopt.quantize(fp32, "dynamic", tmp / "bert.dyn.pt", calib_data=calib, exclude=HEAD, progress=False)
    ts = ptopt.export(fp32, "torchscript", tmp / "bert.pt", data=calib)
    aoti = ptopt.export(fp32, "aoti", tmp / "bert.pt2", data=calib)
    m = int8.metrics
    rows_fid = [
        ["static int8 (pt2e)", f"{worst_cosine(fp32, int8.model):.4f}", f"{m['min_cosine']:.4f}",
         f"{m['size_ratio_vs_fp32_torchscript']:.2f}", f"{build_s:.0f}"],
        ["dynamic int8 (fx)", f"{worst_cosine(fp32, dyn.model):.4f}", f"{dyn.metrics['min_cosine']:.4f}",
         f"{dyn.metrics['size_ratio_vs_fp32_torchscript']:.2f}", ""],
    ]  # fmt: skip
    rows_speed, data = [], {"fidelity": rows_fid, "speed": {}}
    for batch in (1, 8):
        x = bert_tokens(batch, 32, seed=batch)["x"]

        def run(model, x=x):
            def call():
                with torch.no_grad():
                    return model(**x)

            return call

        fns = {
            "fp32 eager": run(fp32),
            "fp32 TorchScript": run(ts.model),
            "fp32 AOTInductor": run(aoti.model),
            "static int8 (pt2e)": run(int8.model),
            "dynamic int8 (fx)": run(dyn.model),
        }
        stats = measure_interleaved(fns, rounds=5, min_iters=50, min_seconds=3.0)
        base = stats["fp32 eager"]["p50_ms"]
        for k, s in stats.items():
            rows_speed.append([batch, k, f"{s['p50_ms']:.3f}", f"{base / s['p50_ms']:.2f}x"])
        data["speed"][batch] = {k: s["p50_ms"] for k, s in stats.items()}
    md = md_table(
        ["model", "worst cosine, held-out padded batches", "quantize's check (min cosine)",
         "size vs fp32 TorchScript", "quantize + compile s"],
        rows_fid,
    )  # fmt: skip
    md += "\n\n" + md_table(["batch × 32 tokens", "model", "p50 ms", "speed vs fp32 eager"], rows_speed)
    md += (
        f"\n\nint8 layers: {int8.extra['int8_share']['layers']} of {int8.extra['int8_share']['of_layers']} "
        f"with weights ({100 * int8.extra['int8_share']['parameters']:.1f}% of the parameters); float: "
        "embeddings, LayerNorm, the head (pooler, classifier); attention and GELU run in float."
    )
    write_result("bert_pt2e", "BERT static int8 through PT2E", md, data, THREADS,
                 command="PYTHONPATH=. python benchmarks/bench_bert_pt2e.py")  # fmt: skip


if __name__ == "__main__":
    main()
