"""Knowledge distillation: train a small student to match a large teacher (``ptopt.distill``).

The loss and its config are in ``distill_loss`` (re-exported here)::

    loss = α·CE(student, labels) + (1−α)·T²·KL(softmax(teacher/T) ‖ softmax(student/T))

``distill`` returns a :class:`~ptopt.core.result.Result`: ``.model`` is the trained student
``nn.Module`` in eval mode (a student given as an ``nn.Module`` is trained in place and is that same
object); ``.metrics`` (eval accuracy, best epoch, teacher accuracy, parameter counts) exist before
any save. ``.save(path)`` (or ``output=``) writes the student alone, loadable with plain torch:
TorchScript for ``.pt``, an ExportedProgram (dynamic batch) for ``.pt2``, reloaded and compared::

    res = ptopt.distill(teacher, student, (x, y), epochs=4)
    res.model(x); res.save("student.pt")

Defaults: T=4, α=0.5 are the textbook values, not tuned here; ``benchmarks/bench_distill.py``
chose T=1, α=0.1 on a validation split for a 4-epoch budget on digits (see docs/distill.md).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any

from ptopt.compress.distill_config import (  # noqa: F401 - re-exported: the config's public home stays here
    DEFAULT_ALPHA,
    DEFAULT_TEMPERATURE,
    DistillConfig,
    parse_feature_pair,
)
from ptopt.compress.stage import (
    UNSAVED,
    check_output,
    count_parameters,
    finish,
    input_files,
    load_dataset,
    load_eager,
)
from ptopt.core import progress as _progress
from ptopt.core.config import reconcile
from ptopt.core.errors import DataError, ShapeMismatchError, UsageError
from ptopt.core.options import Options, Selector, drop_without_partner, option

OUTPUT_SUFFIXES = {".pt": "torchscript", ".pt2": "exported_program"}

#: the loss's names, re-exported here (their public home) but imported on first use: the loss imports
#: torch, which ``ptopt distill --help`` must not (it read this module's options for 1.1 s more)
_FROM_LOSS = ("DistillLoss", "first_tensor", "make_distill_loss", "move_module", "set_eval",
              "unpack_teacher_logits", "with_teacher_logits")  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _FROM_LOSS:
        from ptopt.compress import distill_loss

        return getattr(distill_loss, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Where a distillation run keeps its state: checkpoints (and resuming from them) and logs."""

    checkpoint_dir: Any = option(
        None,
        help="Write a sharded checkpoint here after every epoch (each process its shard; resumable on "
        "another number of processes).",
        metavar="DIR",
    )
    resume: bool = option(
        False,
        help="Continue the run whose checkpoint is in --checkpoint-dir, with its options. A larger --max-steps "
        "or --epochs trains on from the checkpoint's step to the new total (the learning-rate schedule then "
        "spans it); one the run already reached trains nothing and writes the checkpoint's model (exit 0).",
    )
    log_dir: Any = option(None, help="TensorBoard logs and metrics.jsonl.", metavar="DIR")
    metrics_file: Any = option(
        None, help="One JSON line per epoch (default: LOG_DIR/metrics.jsonl).", path="out"
    )
    cache_teacher: bool = option(
        True,
        help="Compute the teacher's logits once for all samples instead of every epoch (not with feature pairs, "
        "which need the teacher's layers on every batch, nor under FSDP, which shards the teacher).",
        cli=False,
        applies=("classifier",),
    )
    nproc: int = option(
        1,
        help="Start this many processes on this machine (torchrun's launcher) and train across them "
        "(--strategy; under torchrun leave it out). Python: run the script under torchrun instead.",
        metavar="N",
    )

    def __post_init__(self) -> None:
        if self.resume and self.checkpoint_dir is None:  # refused, or left out where the environment set it
            drop_without_partner(
                "resume", "--resume needs --checkpoint-dir (where the killed run wrote its checkpoint)"
            )
            object.__setattr__(self, "resume", False)
        if self.nproc < 1:
            raise UsageError(f"--nproc must be >= 1, got {self.nproc}")


def _groups() -> tuple[type, ...]:
    from ptopt.compress.distill_config import LMOptions
    from ptopt.compress.trainer import TrainConfig

    return (DistillConfig, TrainConfig, RunOptions, LMOptions)


#: what is distilled, worked out from the teacher (a causal LM or not): the options that apply differ
_KINDS = {
    "classifier": "a model on tensor data (a classifier's logits)",
    "lm": "a causal language model on text (--teacher hf:DIR)",
}

#: the options of ``ptopt distill`` / ``ptopt.distill``: the loss's, the trainer's (with distill's own
#: defaults: 4 epochs, lr 3e-3, batch 32, device auto), the run's and a language model's
OPTIONS = Options(
    "distill",
    _groups,
    Selector("kind", "what is distilled", lambda: tuple(_KINDS), describe=_KINDS.__getitem__, cli=False),
    defaults={"epochs": 4, "lr": 3e-3, "batch_size": 32, "device": "auto"},
)


@_progress.reported
@OPTIONS.twin
def distill(
    teacher: Any,
    student: Any,
    train_data: Any,
    output: str | os.PathLike | None = None,
    *,
    config: DistillConfig | None = None,
    train_config: Any = None,
    eval_data: Any = None,
    teacher_weights: Any = None,
    student_weights: Any = None,
    allow_pickle: bool = False,
    epoch_hooks: Sequence[Any] = (),
    progress: bool = True,
    **options: Any,
) -> Any:
    """Distill ``teacher`` into ``student`` on ``train_data``; returns a Result (module doc).

    ``teacher`` / ``student``: nn.Modules, MODEL references or LoadedModels. ``train_data`` /
    ``eval_data``: DATA references or in-memory data (tensor, (x, y), Dataset, DataLoader, list of
    batches). ``options``: the fields of ``DistillConfig``, ``TrainConfig``, ``RunOptions`` and
    ``LMOptions`` (listed below). ``config`` (a DistillConfig) replaces the loss's options;
    ``train_config`` (a TrainConfig) the trainer's: a loose option contradicting the config given is a
    UsageError. Without configs the defaults are T=4, α=0.5, 4 epochs, lr 3e-3, batch 32 (the global
    batch), fp32, device auto, seed 0, strategy auto. ``cache_teacher``: compute the teacher's logits
    once for all samples instead of every epoch (not with feature pairs, which need the teacher's
    layers on every batch, nor under FSDP, which shards the teacher).

    A causal language model teacher (a Hugging Face folder, ``hf:DIR``, or a transformers model) with
    text data takes ``ptopt.compress.distill_lm``'s path: token-level distillation, an HF folder out.
    Under torchrun every process calls this (``strategy`` ddp or fsdp: ``ptopt.compress.distributed``);
    rank 0 returns the Result, the other ranks None.
    """
    from ptopt.compress import distributed as dist_util
    from ptopt.compress.distill_lm import distill_lm, is_lm_request

    kind = "lm" if is_lm_request(teacher) else "classifier"
    dcfg, tcfg, run, lm = resolve_config(config, train_config, options, kind)
    dist_util.check_launch(run.nproc, "ptopt distill")
    dist_util.resolve_strategy(tcfg.strategy)  # before any loading: one line saying how to launch
    dist_util.check_batch(tcfg.batch_size, dist_util.env_world_size())
    models = dict(teacher_weights=teacher_weights, student_weights=student_weights, allow_pickle=allow_pickle)
    if kind == "lm" and (teacher_weights is not None or student_weights is not None):
        raise UsageError("--teacher-weights/--student-weights go with pkg.module:factory models, not hf:DIR")
    hooks = dict(epoch_hooks=epoch_hooks, progress=progress)
    with dist_util.process_group(dist_util.resolve_device(tcfg.device)):
        if kind == "lm":
            return distill_lm(
                teacher, student, train_data, output, dcfg, tcfg, run, lm, eval_data=eval_data,
                allow_pickle=allow_pickle, **hooks,
            )  # fmt: skip
        return _distill(teacher, student, train_data, output, eval_data, dcfg, tcfg, models, run, hooks)


def _distill(
    teacher: Any,
    student: Any,
    train_data: Any,
    output: Any,
    eval_data: Any,
    dcfg: DistillConfig,
    tcfg: Any,
    models: dict[str, Any],
    run: RunOptions,
    hooks: dict[str, Any],
) -> Any:
    """A classifier's distillation (``distill``'s docstring), inside the process group."""
    from ptopt.compress import distributed as dist_util
    from ptopt.compress.teacher_check import check_factory_teacher

    check_output(output, OUTPUT_SUFFIXES)
    train_ds, eval_ds = _load_data(train_data, eval_data, dcfg.alpha, (teacher, student))
    t_loaded, s_loaded, probe = _load_models(
        teacher, student, models["teacher_weights"], models["student_weights"], models["allow_pickle"],
        tcfg.seed, train_ds,
    )  # fmt: skip
    check_factory_teacher(t_loaded, (eval_ds, train_ds))  # random weights from a factory: one warning
    trained = s_loaded.info.get("rebuilt_from") or s_loaded.info.get("weights")
    if (
        trained and tcfg.lr >= 1e-3
    ):  # the real all-MiniLM-L6-v2, pruned: 0.39 mean cosine at 3e-3, 0.93 at 1e-4
        _progress.note(
            f"note: the student starts from trained weights ({trained}); --lr {tcfg.lr:g} suits students trained "
            "from scratch and can undo them: fine-tuning usually wants about 1e-4 (docs/distill.md)"
        )
    chosen, result = _train(t_loaded, s_loaded, train_ds, eval_ds, probe, dcfg, tcfg, run, **hooks)
    measured = _measure(t_loaded, s_loaded, result, train_ds, eval_ds)  # collective under FSDP
    if not dist_util.is_main_process():
        return None
    refs = {"train_data": train_data, "eval_data": eval_data, "output_loss": chosen}
    built = _build_result(t_loaded, s_loaded, train_ds, eval_ds, dcfg, tcfg, result, refs, measured)
    return finish(built, output)


# -- the steps -------------------------------------------------------------------------------------------


def resolve_options(twin: dict[str, Any]) -> tuple[DistillConfig, Any, RunOptions, Any]:
    """``resolve_config`` of the twin's keywords ``twin`` (its models, data and options)."""
    from ptopt.compress.distill_lm import is_lm_request

    kind = "lm" if is_lm_request(twin["teacher"]) else "classifier"
    options = {k: v for k, v in twin.items() if OPTIONS.keyword(k) is not None}
    return resolve_config(twin.get("config"), twin.get("train_config"), options, kind)


def resolve_config(
    config: Any, train_config: Any, options: dict[str, Any], kind: str = "classifier"
) -> tuple[DistillConfig, Any, RunOptions, Any]:
    """The loss's config, the trainer's, the run's and the language model's (``kind``: ``_KINDS``) from
    the configs given or the loose ``options`` (a loose option contradicting a config given, or one
    that does not apply to ``kind``, is refused)."""
    from ptopt.compress.distill_config import LMOptions
    from ptopt.compress.trainer import TrainConfig

    given = OPTIONS.check(options, kind)
    loss = OPTIONS.of(DistillConfig, given)
    if config is None:
        config = OPTIONS.build(DistillConfig, loss)
    else:
        reconcile(config, loss)
        OPTIONS.refuse_inapplicable(config, kind)
    train = OPTIONS.of(TrainConfig, given)
    if train_config is None:
        train_config = OPTIONS.build(TrainConfig, train)
    else:
        reconcile(train_config, train)
    return config, train_config, OPTIONS.build(RunOptions, given), OPTIONS.build(LMOptions, given)


def _load_data(train_data: Any, eval_data: Any, alpha: float, models: tuple[Any, Any]) -> tuple[Any, Any]:
    """The training and evaluation Datasets; a text file is one sentence per line when the teacher (else
    the student) is a Hugging Face encoder's folder (``ptopt.core.sentences``)."""
    from ptopt.core.sentences import sentence_folder

    text_model = next((m for m in models if sentence_folder(m) is not None), None)
    train_ds = load_dataset(train_data, "training", model=text_model)
    if len(train_ds) == 0:
        raise DataError(f"{train_ds.name}: no samples to train on")
    if alpha > 0 and not train_ds.has_labels:
        raise DataError(
            f"{train_ds.name} has no labels but --alpha is {alpha}: the label term needs labels; "
            "use --alpha 0 to learn from the teacher's soft targets alone"
        )
    eval_ds = load_dataset(eval_data, "evaluation", finite=False, model=text_model)
    if eval_ds is not None and not eval_ds.has_labels:
        raise DataError(f"{eval_ds.name} has no labels: --eval-data needs labels to measure accuracy")
    return train_ds, eval_ds


def _load_models(
    teacher: Any,
    student: Any,
    teacher_weights: Any,
    student_weights: Any,
    allow_pickle: bool,
    seed: int,
    train_ds: Any,
) -> tuple[Any, Any, Any]:
    """(teacher, student, a probe batch both ran): outputs of one shape, labels within it."""
    import torch

    from ptopt.compress.distill_loss import first_tensor
    from ptopt.core.modelref import as_loaded, run_checked

    t_loaded = as_loaded(teacher, teacher_weights, allow_pickle)
    t_loaded.require_module("distillation")
    torch.manual_seed(seed)  # the student's fresh initialization is part of the run
    why = "a student must be trainable"
    s_loaded = load_eager(student, student_weights, allow_pickle, "distillation", role="student ", why=why)
    probe = train_ds.first_batch(min(len(train_ds), 8))
    t_out = first_tensor(run_checked(t_loaded, probe.x, what=f"train data {train_ds.name} (teacher)"))
    s_out = first_tensor(run_checked(s_loaded, probe.x, what=f"train data {train_ds.name} (student)"))
    if tuple(t_out.shape) != tuple(s_out.shape):
        raise ShapeMismatchError(
            "teacher and student outputs differ in shape, so the student cannot match the "
            "teacher's predictions",
            expected=f"teacher {_shape(t_out)}",
            got=f"student {_shape(s_out)}",
        )
    train_ds.check_labels(t_out, "the teacher")
    return t_loaded, s_loaded, probe


def _train(
    t_loaded: Any,
    s_loaded: Any,
    train_ds: Any,
    eval_ds: Any,
    probe: Any,
    dcfg: DistillConfig,
    tcfg: Any,
    run_options: RunOptions,
    **hooks: Any,
) -> Any:
    """The student trained in place with the distillation loss; returns (the output loss used, the
    TrainResult)."""
    from ptopt.compress import distributed as dist_util
    from ptopt.compress.checkpoint import tensor_digest
    from ptopt.compress.distill_loss import make_distill_loss, move_module, with_teacher_logits
    from ptopt.compress.trainer import train

    t_module, s_module = t_loaded.module, s_loaded.module
    loss = make_distill_loss(
        t_module,
        dcfg.temperature,
        dcfg.alpha,
        dcfg.feature_pairs,
        student=s_module,
        example_inputs=probe.x,
        feature_weight=dcfg.feature_weight,
        output_loss=dcfg.output_loss,
        labels=train_ds.has_labels,
    )
    # what the student's output was matched by (``--output-loss``; auto: cosine for features), for the sidecar
    chosen = {"loss": loss.output_loss, "asked": dcfg.output_loss, "why": loss.output_loss_why}
    # the loss used, not the one asked: auto and kl train alike where kl is chosen, and a checkpoint
    # written before --output-loss (kl, no such field) still resumes where kl is still the loss
    same = {k: v for k, v in dcfg.to_dict().items() if k != "output_loss"}
    fingerprint = {**same, "teacher": tensor_digest(t_module.state_dict().values())}
    if loss.output_loss != "kl":
        fingerprint["output_loss"] = loss.output_loss
    asked = run_options.cache_teacher and not dcfg.feature_pairs
    cached = asked and dist_util.resolve_strategy(tcfg.strategy) != "fsdp"
    # what was asked, not what the strategy chose (FSDP runs the teacher per batch: the same logits to
    # float rounding), so that a checkpoint resumes under another strategy, as the world size may change
    fingerprint["teacher_logits"] = "cached" if asked else "per batch"
    train_input = train_ds
    if cached:
        train_input = with_teacher_logits(train_ds, t_module, device=dist_util.resolve_device(tcfg.device))
    try:
        return chosen, train(
            s_module,
            train_input,
            tcfg,
            eval_data=eval_ds,
            loss_fn=loss,
            fingerprint_extra=fingerprint,
            checkpoint_dir=run_options.checkpoint_dir,
            resume=run_options.resume,
            log_dir=run_options.log_dir,
            metrics_file=run_options.metrics_file,
            epoch_hooks=hooks["epoch_hooks"],
            progress=hooks["progress"] and "distill",
        )
    finally:
        loss.remove_hooks()
        move_module(t_module, "cpu")  # the loss may have taken the teacher to the training device


def _measure(t_loaded: Any, s_loaded: Any, result: Any, train_ds: Any, eval_ds: Any) -> dict[str, Any]:
    """The teacher's eval accuracy and how closely the student follows it. Every rank runs this: under
    FSDP both models are sharded and each forward is collective."""
    from ptopt.compress.distill_loss import set_eval
    from ptopt.compress.trainer import evaluate_accuracy

    student = result.sharded if result.sharded is not None else s_loaded.module
    set_eval(t_loaded.module)
    student.eval()
    teacher_acc = evaluate_accuracy(t_loaded.module, eval_ds) if eval_ds is not None else None
    return {
        "teacher_eval_accuracy": teacher_acc,
        "vs_teacher": _vs_teacher(t_loaded.module, student, eval_ds or train_ds),
    }


def _build_result(
    t_loaded: Any,
    s_loaded: Any,
    train_ds: Any,
    eval_ds: Any,
    dcfg: DistillConfig,
    tcfg: Any,
    result: Any,
    refs: dict[str, Any],
    measured: dict[str, Any],
) -> Any:
    """Wrap the trained student (rank 0's: under FSDP the gathered copy) in an unsaved Result."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.input_infer import token_ranges
    from ptopt.core.inputspec import input_style, specs_from_example
    from ptopt.core.result import Result

    example = train_ds.first_batch(min(len(train_ds), 4)).x
    s_module = result.model.eval()
    t_params, s_params = count_parameters(t_loaded.module), count_parameters(s_module)
    config = {
        **dcfg.to_dict(),
        "train": tcfg.to_dict(),
        "teacher": str(t_loaded.ref),
        "student": str(s_loaded.ref),
        "train_data": refs["train_data"] if isinstance(refs["train_data"], str) else train_ds.name,
        "eval_data": eval_ds.name
        if eval_ds is not None and not isinstance(refs["eval_data"], str)
        else refs["eval_data"],
    }
    teacher_record = t_loaded.parent_record()
    template = Artifact(
        path=UNSAVED,
        format="torchscript",  # until saved: .pt2 makes it exported_program
        inputs=token_ranges(
            s_module, specs_from_example(train_ds.first_batch(min(len(train_ds), 32)).x), input_style(example)
        ),
        input_style=input_style(example),
        config=config,
        parent=teacher_record,
        precision="fp32",
        metrics={
            "eval_accuracy": result.best_accuracy,
            "best_epoch": result.best_epoch,
            "student_parameters": s_params,
            "teacher_parameters": t_params,
            **(
                {"eval_data": config["eval_data"], "eval_samples": len(eval_ds)}
                if eval_ds is not None
                else {}
            ),
            **measured,
        },
        extra={
            "teacher": teacher_record,
            "student": s_loaded.parent_record(),
            **result.summary(),
            "parameter_ratio": s_params / max(t_params, 1),
            "output_loss": refs["output_loss"],
        },
    )
    sources = input_files(t_loaded.path, s_loaded.path, refs["train_data"], refs["eval_data"])
    return Result(
        s_module,
        template,
        functools.partial(_write_student, s_module, example, template.inputs, template.input_style),
        inputs_paths=sources,
        suffixes=tuple(OUTPUT_SUFFIXES),
    )


def _vs_teacher(teacher: Any, student: Any, data: Any) -> dict[str, Any] | None:
    """How closely the student follows the teacher on ``data`` (``compress.fidelity.vs_source``)."""
    from ptopt.compress.distill_loss import set_eval
    from ptopt.compress.fidelity import fidelity_data, vs_source

    set_eval(teacher)
    return vs_source(teacher, student, fidelity_data(data))


def _shape(t: Any) -> str:
    return "x".join(str(d) for d in t.shape)


# -- saving ------------------------------------------------------------------------------------------


def _write_student(module: Any, example: Any, specs: list[Any], style: str, path: Any) -> dict[str, Any]:
    """The Result's writer: TorchScript (trace) for ``.pt``, an ExportedProgram (the specs' dynamic
    batch) for ``.pt2``, through the one writer (``ptopt.export.writers``), reloaded and compared."""
    from ptopt.export.writers import write_model

    fmt = check_output(path, OUTPUT_SUFFIXES)
    # unfrozen: the saved student keeps its layers and state_dict
    opts = {"freeze": False} if fmt == "torchscript" else {}
    return write_model(module, fmt, path, specs=specs, style=style, example=example, **opts) | {"format": fmt}
