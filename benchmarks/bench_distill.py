"""Distillation on digits: zoo:resnet (teacher) → resnet_small (1/7 of its parameters), from scratch.

1. Selection, without the test split: the training split is cut into 1150 samples to train on and
   288 to validate on (seeded). For 3 seeds, the student is trained on labels alone and distilled
   with every (T, alpha) of GRID; the setting with the best mean validation accuracy is selected.
2. Report: for 3 seeds, the same student with the same budget (epochs, batches, learning-rate
   schedule, seed, initialization and batch order) trained on the full training split on labels
   alone (cross-entropy), and distilled from the teacher (`ptopt.distill`, which writes a
   TorchScript artifact) with the selected setting and with the textbook T=4, alpha=0.5. Accuracy
   is measured on the held-out split `builtin:digits32:test` from the final weights (no best-epoch
   selection on the test set); the distilled number is measured by loading the written artifact
   with plain `torch.jit.load`.
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
#: (T, alpha) candidates for the selection on the validation split
GRID = ((1.0, 0.1), (1.0, 0.25), (1.0, 0.5), (2.0, 0.5), (4.0, 0.5))
TEXTBOOK = (4.0, 0.5)
VAL_SAMPLES, SPLIT_SEED = 288, 123


def _run(seed, train_ds, eval_ds, settings, cfg, tmp):
    """Labels-only and one distillation per (T, alpha) for one seed; accuracies on ``eval_ds``."""
    import torch

    from ptopt.compress.distill import count_parameters, distill
    from ptopt.compress.trainer import evaluate_accuracy, train
    from ptopt.core.modelref import load_model

    torch.manual_seed(seed)
    student = load_model(STUDENT).module
    t0 = time.perf_counter()
    train(student, train_ds, cfg.replace(seed=seed), progress=False)
    run = {
        "seed": seed,
        "labels_accuracy": evaluate_accuracy(student, eval_ds),
        "labels_seconds": time.perf_counter() - t0,
        "student_parameters": count_parameters(student),
        "distilled": [],
    }
    for t, a in settings:
        t0 = time.perf_counter()
        art = distill(
            TEACHER,
            STUDENT,
            train_ds,
            Path(tmp) / f"student{seed}.pt",
            eval_data=eval_ds,
            temperature=t,
            alpha=a,
            epochs=EPOCHS,
            lr=LR,
            batch_size=BATCH_SIZE,
            device="cpu",
            seed=seed,
            train_config=cfg,
            progress=False,
        )
        run["distilled"].append(
            {
                "temperature": t,
                "alpha": a,
                "seconds": time.perf_counter() - t0,
                "accuracy": evaluate_accuracy(torch.jit.load(str(art.path)), eval_ds),
                "history": art.extra["history"],
            }
        )
    print(
        {k: v for k, v in run.items() if k != "distilled"},
        [(d["temperature"], d["alpha"], d["accuracy"]) for d in run["distilled"]],
        flush=True,
    )
    return run


def main() -> None:
    threads = setup(2)
    import torch

    from ptopt.compress.distill import count_parameters
    from ptopt.compress.trainer import TrainConfig, evaluate_accuracy
    from ptopt.core.data import load_data
    from ptopt.core.modelref import load_model

    test, full = load_data(TEST), load_data(TRAIN)
    teacher = load_model(TEACHER).module
    teacher_acc = evaluate_accuracy(teacher, test)
    cfg = TrainConfig(epochs=EPOCHS, batch_size=BATCH_SIZE, lr=LR, keep_best=False, device="cpu")
    perm = torch.randperm(len(full), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, fit = full.select(perm[:VAL_SAMPLES]), full.select(perm[VAL_SAMPLES:])
    with tempfile.TemporaryDirectory() as tmp:
        sel_runs = [_run(seed, fit, val, GRID, cfg, tmp) for seed in SEEDS]
        sel_labels = statistics.mean(r["labels_accuracy"] for r in sel_runs)
        sel_means = [
            statistics.mean(r["distilled"][i]["accuracy"] for r in sel_runs) for i in range(len(GRID))
        ]
        chosen = GRID[max(range(len(GRID)), key=lambda i: sel_means[i])]
        settings = (chosen, TEXTBOOK) if chosen != TEXTBOOK else (chosen,)
        runs = [_run(seed, full, test, settings, cfg, tmp) for seed in SEEDS]
    data: dict = {
        "teacher": TEACHER,
        "student": STUDENT,
        "teacher_accuracy": teacher_acc,
        "epochs": EPOCHS,
        "batch_size": BATCH_SIZE,
        "lr": LR,
        "kd_settings": settings,
        "runs": runs,
        "selection": {
            "grid": GRID,
            "val_samples": VAL_SAMPLES,
            "split_seed": SPLIT_SEED,
            "mean_labels_val_accuracy": sel_labels,
            "mean_distilled_val_accuracy": sel_means,
            "chosen": chosen,
            "runs": sel_runs,
        },
    }
    runs = data["runs"]
    rows = []
    for r in runs:
        rows.append(
            [r["seed"], f"{r['labels_accuracy']:.2%}"]
            + [
                f"{d['accuracy']:.2%} ({(d['accuracy'] - r['labels_accuracy']) * 100:+.2f})"
                for d in r["distilled"]
            ]
            + [f"{r['labels_seconds']:.0f} / " + " / ".join(f"{d['seconds']:.0f}" for d in r["distilled"])]
        )
    mean_l = statistics.mean(r["labels_accuracy"] for r in runs)
    means = [statistics.mean(r["distilled"][i]["accuracy"] for r in runs) for i in range(len(settings))]
    data.update(mean_labels_accuracy=mean_l, mean_distilled_accuracy=means)
    rows.append(
        ["**mean**", f"**{mean_l:.2%}**"] + [f"**{m:.2%} ({(m - mean_l) * 100:+.2f})**" for m in means] + [""]
    )
    t_params = count_parameters(teacher)
    s_params = runs[0]["student_parameters"]
    sel_md = md_table(
        ["", "labels only"] + [f"T={t:g}, alpha={a:g}" for t, a in GRID],
        [["mean validation accuracy (3 seeds)", f"{sel_labels:.2%}"] + [f"{m:.2%}" for m in sel_means]],
    )
    md = (
        f"Teacher `{TEACHER}`: {t_params:,} parameters, {teacher_acc:.2%} held-out. Student `{STUDENT}`: "
        f"{s_params:,} parameters (1/{t_params / s_params:.1f}), trained from scratch for {EPOCHS} epochs "
        f"(batch {BATCH_SIZE}, AdamW lr {LR}, warmup + cosine, same seed, initialization and batch order), "
        "once on labels alone and once distilled per (T, alpha). Held-out accuracy on "
        f"`{TEST}` ({len(test)} samples; one sample = {100 / len(test):.2f} points) from the final weights; "
        "distilled students are scored from their TorchScript artifacts.\n\n"
        f"Selection of (T, alpha) without the test split: {len(fit)} training samples, {len(val)} for validation "
        f"(seeded split), same budget; chosen: T={chosen[0]:g}, alpha={chosen[1]:g}.\n\n"
        + sel_md
        + "\n\nOn the test split, full training split:\n\n"
        + md_table(
            ["seed", "labels only"]
            + [f"distilled T={t:g}, alpha={a:g} (gain)" for t, a in settings]
            + ["seconds (labels / distill...)"],
            rows,
        )
    )
    write_result("distill", "Knowledge distillation (digits, 4 epochs from scratch)", md, data, threads)


if __name__ == "__main__":
    main()
