"""Distillation on digits: zoo:resnet (teacher) → resnet_small (1/7 of its parameters), from scratch.

For 3 seeds, the same student with the same budget (epochs, batches, learning-rate schedule, seed,
initialization and batch order) trained two ways: on the labels alone (cross-entropy), and distilled
from the teacher (`ptopt.distill`, which writes a TorchScript artifact). Accuracy is measured on the
held-out split `builtin:digits32:test` from the final weights (no best-epoch selection on the test
set); the distilled number is measured by loading the written artifact with plain `torch.jit.load`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import md_table, setup, write_result  # noqa: E402

TEACHER = "zoo:resnet"
STUDENT = "ptopt.models.resnet:resnet_small"
TRAIN, TEST = "builtin:digits32:train", "builtin:digits32:test"
SEEDS = (0, 1, 2)
EPOCHS, BATCH_SIZE, LR = 4, 32, 3e-3
TEMPERATURE, ALPHA = 4.0, 0.5


def main() -> None:
    threads = setup(2)
    import torch

    from ptopt.compress.distill import count_parameters, distill
    from ptopt.compress.trainer import TrainConfig, evaluate_accuracy, train
    from ptopt.core.data import load_data
    from ptopt.core.modelref import load_model

    test = load_data(TEST)
    teacher = load_model(TEACHER).module
    teacher_acc = evaluate_accuracy(teacher, test)
    cfg = TrainConfig(epochs=EPOCHS, batch_size=BATCH_SIZE, lr=LR, keep_best=False, device="cpu")
    rows, data = [], {"teacher": TEACHER, "student": STUDENT, "teacher_accuracy": teacher_acc, "epochs": EPOCHS,
                      "batch_size": BATCH_SIZE, "lr": LR, "temperature": TEMPERATURE, "alpha": ALPHA, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in SEEDS:
            torch.manual_seed(seed)
            student = load_model(STUDENT).module
            t0 = time.perf_counter()
            train(student, load_data(TRAIN), cfg.replace(seed=seed), progress=False)
            labels_s = time.perf_counter() - t0
            labels_acc = evaluate_accuracy(student, test)

            t0 = time.perf_counter()
            art = distill(TEACHER, STUDENT, TRAIN, Path(tmp) / f"student{seed}.pt", eval_data=TEST,
                          temperature=TEMPERATURE, alpha=ALPHA, epochs=EPOCHS, lr=LR, batch_size=BATCH_SIZE,
                          device="cpu", seed=seed, train_config=cfg, progress=False)
            kd_s = time.perf_counter() - t0
            kd_acc = evaluate_accuracy(torch.jit.load(str(art.path)), test)
            params = count_parameters(student)
            data["runs"].append({"seed": seed, "labels_accuracy": labels_acc, "distilled_accuracy": kd_acc,
                                 "labels_seconds": labels_s, "distill_seconds": kd_s, "student_parameters": params,
                                 "distill_history": art.extra["history"]})
            rows.append([seed, f"{labels_acc:.2%}", f"{kd_acc:.2%}", f"{(kd_acc - labels_acc) * 100:+.2f}",
                         f"{labels_s:.0f} s", f"{kd_s:.0f} s"])
            print(rows[-1], flush=True)
    runs = data["runs"]
    mean_l = statistics.mean(r["labels_accuracy"] for r in runs)
    mean_k = statistics.mean(r["distilled_accuracy"] for r in runs)
    data.update(mean_labels_accuracy=mean_l, mean_distilled_accuracy=mean_k)
    rows.append(["**mean**", f"**{mean_l:.2%}**", f"**{mean_k:.2%}**", f"**{(mean_k - mean_l) * 100:+.2f}**", "", ""])
    t_params = count_parameters(teacher)
    s_params = runs[0]["student_parameters"]
    md = (f"Teacher `{TEACHER}`: {t_params:,} parameters, {teacher_acc:.2%} held-out. Student `{STUDENT}`: "
          f"{s_params:,} parameters (1/{t_params / s_params:.1f}), trained from scratch for {EPOCHS} epochs "
          f"(batch {BATCH_SIZE}, AdamW lr {LR}, warmup + cosine), once on labels alone and once distilled with "
          f"T = {TEMPERATURE}, alpha = {ALPHA}. Held-out accuracy on `{TEST}` ({len(test)} samples), final "
          "weights; the distilled student is scored from its TorchScript artifact.\n\n"
          + md_table(["seed", "labels only", "distilled", "gain (points)", "labels time", "distill time"], rows))
    write_result("distill", "Knowledge distillation (digits, 4 epochs from scratch)", md, data, threads)


if __name__ == "__main__":
    main()
