"""``ptopt distill --teacher MODEL --student MODEL --train-data D -o OUT``."""

from __future__ import annotations

from typing import Any

import click

from ptopt.cli.options import (
    allow_pickle_option,
    data_option,
    declared,
    given,
    guard_paths,
    maybe_save_recipe,
    output_option,
    progress_option,
    save_recipe_option,
    weights_option,
)
from ptopt.compress.distill import OPTIONS


@click.command("distill")
@data_option("--teacher", "The trained model to learn from.", required=True, metavar="MODEL")
@data_option(
    "--student",
    "The model to train: pkg.module:factory (fresh, or --student-weights), zoo:NAME, or hf:DIR for a "
    "language model (a folder with only config.json starts fresh).",
    required=True,
    metavar="MODEL",
)
@weights_option("--teacher-weights", "State dict for a pkg.module:factory teacher.")
@weights_option("--student-weights", "Initial state dict for the student.")
@allow_pickle_option
@data_option(
    "--train-data",
    "Training data (labels optional with --alpha 0); text for a language model.",
    required=True,
)
@data_option(
    "--eval-data",
    "Labelled held-out data: accuracy each epoch, best weights kept; text for a language model (perplexity).",
)
@declared(OPTIONS)
@progress_option
@output_option(
    folder_ok=True,
    help="Where to write the student (a .ptopt.json sidecar beside it): .pt TorchScript, .pt2 an "
    "ExportedProgram; a folder for a language model.",
)
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
    {"output": "-o", "save_recipe": "--save-recipe"},
    OPTIONS,
)
def command(
    teacher: str,
    student: str,
    teacher_weights: str | None,
    student_weights: str | None,
    allow_pickle: bool,
    train_data: str,
    eval_data: str | None,
    no_progress: bool,
    output: str,
    save_recipe: str | None,
    **params: Any,
) -> None:
    """Train a small STUDENT to imitate a TEACHER (knowledge distillation) and write it to OUT.

    \b
    loss = alpha * CE(student, labels) + (1 - alpha) * T^2 * KL(teacher/T || student/T)
    OUT ending in .pt is TorchScript, .pt2 an ExportedProgram; both load with plain torch.
    Language models (--teacher hf:DIR, text data): the same loss per token; OUT is a Hugging Face folder.
    Several processes: --nproc N, or torchrun --nproc-per-node N -m ptopt.cli.main distill ...
    """
    from ptopt.cli.launch import launched_here
    from ptopt.cli.options import warning_lines
    from ptopt.compress.distill import distill
    from ptopt.compress.teacher_check import UntrainedTeacherWarning

    common = dict(teacher_weights=teacher_weights, student_weights=student_weights, eval_data=eval_data)
    options = dict(teacher=teacher, student=student, train_data=train_data, output=output)
    options |= given(common | {"allow_pickle": allow_pickle or None}) | given(params)
    if launched_here(options):  # the processes did the work; rank 0 reported
        return
    with warning_lines(UntrainedTeacherWarning):  # a factory teacher that looks untrained: one line, first
        res = distill(**options, progress=not no_progress)
    if res is None:  # a torchrun rank other than 0: rank 0 reports
        return
    _print_report(res)
    maybe_save_recipe(save_recipe, "distill", options)


def _print_report(art) -> None:
    """The saved student: parameters against the teacher's, each epoch's loss (and accuracy, tokens/s,
    peak memory per process), then the held-out accuracy or perplexity against the teacher's."""
    m, x = art.metrics, art.extra
    ratio = m["teacher_parameters"] / max(m["student_parameters"], 1)
    # 1/4.2 for a small student; 0.996x for one about the teacher's size (a pruned copy: "1/1.0" said nothing)
    share = f"1/{ratio:.1f}" if ratio >= 2 else f"{1 / ratio:.3g}x"
    click.echo(
        f"student: {art.path} ({art.format}, {m['student_parameters']:,} parameters, "
        f"{share} of the teacher's {m['teacher_parameters']:,})"
    )
    loss = x.get("output_loss") or {}
    if loss.get("why"):
        click.echo(f"output loss: cosine, {loss['why']}")
    if x.get("world_size", 1) > 1:
        click.echo(f"trained on {x['world_size']} processes ({x['strategy']}), {x['steps']} optimizer steps")
    for r in x["history"]:
        acc = f", eval accuracy {r['eval_accuracy']:.4f}" if r.get("eval_accuracy") is not None else ""
        speed = f", {r['tokens_per_s']:.0f} tokens/s" if r.get("tokens_per_s") else ""
        mem = ", peak memory " + "/".join(f"{v:.0f}" for v in r.get("peak_rss_mb") or []) + " MiB"
        click.echo(f"  epoch {r['epoch']}: loss {r['loss']:.4f}{acc}{speed}{mem}")
    if m.get("eval_accuracy") is not None:
        on = f" on {m['eval_data']} ({m['eval_samples']} samples)" if m.get("eval_samples") else ""
        click.echo(
            f"eval accuracy{on}: {m['eval_accuracy']:.4f} (best epoch {m['best_epoch']}; "
            f"teacher {m['teacher_eval_accuracy']:.4f})"
        )
    if m.get("perplexity") is not None:
        from ptopt.core.lm import scored_tokens

        w = m["perplexity_window"]
        cached = ", cached" if x.get("teacher_perplexity_cached") else ""
        click.echo(
            f"held-out perplexity: {m['perplexity']:.3f} (teacher {m['teacher_perplexity']:.3f}{cached}; "
            f"{scored_tokens(w)} of {m['eval_data']}, context {w['context']}, stride {w['stride']})"
        )
    if m.get("vs_teacher"):
        from ptopt.compress.fidelity import describe

        click.echo(f"vs teacher: {describe(m['vs_teacher'])}")
