"""``ptopt distill --teacher MODEL --student MODEL --train-data D -o OUT``."""

from __future__ import annotations

import click

from ptopt.cli.options import guard_paths, maybe_save_recipe, output_option, save_recipe_option


@click.command("distill")
@click.option("--teacher", required=True, metavar="MODEL", help="The trained model to learn from.")
@click.option(
    "--teacher-weights", type=click.Path(dir_okay=False), help="State dict for a pkg.module:factory teacher."
)
@click.option(
    "--student",
    required=True,
    metavar="MODEL",
    help="The model to train: pkg.module:factory (fresh, or --student-weights) or zoo:NAME.",
)
@click.option(
    "--student-weights", type=click.Path(dir_okay=False), help="Initial state dict for the student."
)
@click.option(
    "--allow-pickle", is_flag=True, help="Allow loading pickled nn.Module files (runs code from them)."
)
@click.option(
    "--train-data", required=True, metavar="DATA", help="Training data (labels optional with --alpha 0)."
)
@click.option(
    "--eval-data", metavar="DATA", help="Labelled held-out data: accuracy each epoch, best weights kept."
)
@click.option(
    "--temperature",
    "-T",
    type=float,
    default=4.0,
    show_default=True,
    help="Softmax temperature T (the textbook default; benchmarks/bench_distill.py chose 1 with "
    "--alpha 0.1 for a 4-epoch budget, on a validation split).",
)
@click.option(
    "--alpha",
    type=float,
    default=0.5,
    show_default=True,
    help="Weight of the label loss; 1-alpha weighs the teacher's soft targets (0: soft targets only).",
)
@click.option(
    "--feature-pair",
    "feature_pairs",
    multiple=True,
    metavar="TEACHER_LAYER=STUDENT_LAYER",
    help="Also match an intermediate layer's output (a learned projection when widths differ). Repeatable.",
)
@click.option(
    "--feature-weight", type=float, default=1.0, show_default=True, help="Weight of each feature loss."
)
@click.option("--epochs", type=int, default=4, show_default=True)
@click.option(
    "--lr", type=float, default=3e-3, show_default=True, help="Peak learning rate (AdamW, warmup + cosine)."
)
@click.option("--batch-size", type=int, default=32, show_default=True, help="Per process under torchrun.")
@click.option("--weight-decay", type=float, default=0.01, show_default=True)
@click.option("--grad-accum-steps", type=int, default=1, show_default=True)
@click.option("--grad-clip", type=float, default=1.0, show_default=True, help="Max gradient norm (0: off).")
@click.option(
    "--precision",
    type=click.Choice(["fp32", "bf16", "fp16"]),
    default="fp32",
    show_default=True,
    help="Mixed precision: bf16 autocast (CPU or CUDA), fp16 with a GradScaler (CUDA).",
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--checkpoint-dir", type=click.Path(file_okay=False), help="Write a checkpoint after every epoch here."
)
@click.option("--resume", is_flag=True, help="Continue the run whose checkpoint is in --checkpoint-dir.")
@click.option("--log-dir", type=click.Path(file_okay=False), help="TensorBoard logs and metrics.jsonl.")
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False),
    help="One JSON line per epoch (default: LOG_DIR/metrics.jsonl).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@output_option()
@save_recipe_option
@guard_paths(
    {
        "teacher": "--teacher",
        "teacher_weights": "--teacher-weights",
        "student": "--student",
        "student_weights": "--student-weights",
        "train_data": "--train-data",
        "eval_data": "--eval-data",
    },
    {"output": "-o", "save_recipe": "--save-recipe", "metrics_file": "--metrics-file"},
)
def command(
    teacher: str,
    teacher_weights: str | None,
    student: str,
    student_weights: str | None,
    allow_pickle: bool,
    train_data: str,
    eval_data: str | None,
    temperature: float,
    alpha: float,
    feature_pairs: tuple[str, ...],
    feature_weight: float,
    epochs: int,
    lr: float,
    batch_size: int,
    weight_decay: float,
    grad_accum_steps: int,
    grad_clip: float,
    precision: str,
    device: str,
    seed: int,
    checkpoint_dir: str | None,
    resume: bool,
    log_dir: str | None,
    metrics_file: str | None,
    no_progress: bool,
    output: str,
    save_recipe: str | None,
) -> None:
    """Train a small STUDENT to imitate a TEACHER (knowledge distillation) and write it to OUT.

    \b
    loss = alpha * CE(student, labels) + (1 - alpha) * T^2 * KL(teacher/T || student/T)
    OUT ending in .pt is TorchScript, .pt2 an ExportedProgram; both load with plain torch.
    Data-parallel: torchrun --nproc_per_node N --no-python ptopt distill ...
    """
    from ptopt.compress.distill import distill
    from ptopt.compress.trainer import TrainConfig

    tcfg = TrainConfig(
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        precision=precision,
        device=device,
        seed=seed,
        weight_decay=weight_decay,
        grad_accum_steps=grad_accum_steps,
        grad_clip=grad_clip if grad_clip > 0 else None,
    )
    res = distill(
        teacher,
        student,
        train_data,
        output,
        eval_data=eval_data,
        temperature=temperature,
        alpha=alpha,
        feature_pairs=feature_pairs,
        feature_weight=feature_weight,
        teacher_weights=teacher_weights,
        student_weights=student_weights,
        allow_pickle=allow_pickle,
        train_config=tcfg,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        log_dir=log_dir,
        metrics_file=metrics_file,
        progress=not no_progress,
    )
    if res is None:  # a torchrun rank other than 0: rank 0 reports
        return
    _print_report(res)
    recipe = dict(teacher=teacher, student=student, train_data=train_data, eval_data=eval_data)
    recipe |= dict(temperature=temperature, alpha=alpha, feature_pairs=list(feature_pairs), epochs=epochs)
    recipe |= dict(lr=lr, batch_size=batch_size, precision=precision, seed=seed, output=output)
    maybe_save_recipe(save_recipe, "distill", recipe)


def _print_report(art) -> None:
    """The saved student: parameters against the teacher's, the loss and accuracy of each epoch."""
    m = art.metrics
    ratio = m["teacher_parameters"] / max(m["student_parameters"], 1)
    click.echo(
        f"student: {art.path} ({art.format}, {m['student_parameters']:,} parameters, "
        f"1/{ratio:.1f} of the teacher's {m['teacher_parameters']:,})"
    )
    for r in art.extra["history"]:
        acc = f", eval accuracy {r['eval_accuracy']:.4f}" if r.get("eval_accuracy") is not None else ""
        click.echo(f"  epoch {r['epoch']}: loss {r['loss']:.4f}{acc}")
    if m.get("eval_accuracy") is not None:
        click.echo(
            f"eval accuracy: {m['eval_accuracy']:.4f} (best epoch {m['best_epoch']}; "
            f"teacher {m['teacher_eval_accuracy']:.4f})"
        )
    if m.get("vs_teacher"):
        from ptopt.compress.fidelity import describe

        click.echo(f"vs teacher: {describe(m['vs_teacher'])}")
