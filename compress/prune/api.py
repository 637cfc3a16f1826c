"""Pruning: ``prune(model, method, amount)``, the Python twin of ``ptopt prune``.

Three methods, one config each (frozen, registered, round-tripping through dicts):

- ``l1-unstructured`` (``techniques/unstructured.py``): every conv/linear weight to ``amount`` sparsity;
- ``global`` (``techniques/unstructured.py``): one magnitude ranking across those weights;
- ``structured`` (``techniques/structured.py``): whole output channels removed, the model rewritten smaller.

Recovery: ``fine_tune_data`` + ``epochs`` fine-tunes with the shared trainer after pruning (with
``teacher``: distillation from it; ``"self"`` means the unpruned model); ``steps=K`` prunes gradually,
round k reaching ``amount * k / K``, each round followed by ``epochs`` of fine-tuning.

``prune`` returns a :class:`~ptopt.core.result.Result`: ``.model`` is the pruned dense
``nn.Module`` (masks folded into the weights; for structured pruning a smaller model of the same
class, or its rewritten graph), in eval mode; the model given is never modified. ``.metrics``
(parameter counts, sparsity, raw/gzip weight bytes, accuracy before/after) exist before any save.
``.save(path)`` (or ``output=``) writes a dense model that loads with plain torch: TorchScript for
``.pt``, an ExportedProgram for ``.pt2``, and a sidecar with the config, the per-layer sparsity or
channels before → after, and the parent model::

    pr = ptopt.prune(model, "structured", 0.5, input_shapes=("1x3x224x224",))
    pr.model(x); pr.save("model.pruned.pt")
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import os
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from ptopt.compress.prune.config import (
    OUTPUT_FORMATS,
    TEACHER_SELF,
    FineTuneOptions,
    PruneConfig,
    PruneWarning,
    unmatched_patterns,
)
from ptopt.compress.prune.hf_config import is_hf_model, no_cache
from ptopt.compress.prune.table import config_class, make_pruner
from ptopt.compress.prune.table import options as _options
from ptopt.compress.stage import (
    UNSAVED,
    check_output,
    count_nonzero_parameters,
    count_parameters,
    finish,
    input_files,
    load_dataset,
    load_eager,
    ref_name,
)
from ptopt.core import progress as _progress
from ptopt.core.config import reconcile
from ptopt.core.data import refuse_missing_file
from ptopt.core.errors import UsageError
from ptopt.core.options import drop_without_partner
from ptopt.core.result import Result

#: the options of ``ptopt prune`` (``ptopt.compress.prune.table.options``)
OPTIONS = _options()


# -- measuring ---------------------------------------------------------------------------------------


def state_dict_bytes(model: Any) -> tuple[int, int]:
    """(raw, gzip) bytes of the model's weights as ``torch.save(state_dict)``: zeros only help gzip."""
    import torch

    from ptopt.core.artifact import gzip_bytes

    buf = io.BytesIO()
    torch.save({k: v.detach().contiguous() for k, v in model.state_dict().items()}, buf)
    raw = buf.getvalue()
    return len(raw), gzip_bytes(raw)


# -- saving ----------------------------------------------------------------------------------------


def output_format(output: str | os.PathLike) -> str:
    """``torchscript`` for ``.pt``, ``exported_program`` for ``.pt2``; else a UsageError."""
    return check_output(output, OUTPUT_FORMATS)


def save_dense(
    model: Any,
    example_inputs: Any,
    path: str | os.PathLike,
    fmt: str,
    specs: list[Any],
    style: str | None = None,
) -> dict[str, Any]:
    """Write ``model`` as TorchScript (trace) or an ExportedProgram (the specs' dynamic dims) through
    the one writer (``ptopt.export.writers``), reloaded and compared; returns the sidecar facts."""
    from ptopt.export.writers import write_model

    # unfrozen: the saved model keeps its layers and state_dict (per-layer sparsity stays readable)
    opts = {"freeze": False} if fmt == "torchscript" else {}
    facts = write_model(model, fmt, path, specs=specs or None, style=style, example=example_inputs, **opts)
    return facts | {"format": fmt}


# -- the Python twin -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FineTune:
    """Recovery after each pruning round: ``epochs`` on ``data`` (with ``teacher``: distillation)."""

    epochs: int
    data: Any
    teacher: Any
    temperature: float
    alpha: float
    train: Any  # TrainConfig


@_progress.reported
@OPTIONS.twin
def prune(
    model: Any,
    method: str | None = None,
    amount: float | None = None,
    output: str | os.PathLike | None = None,
    *,
    config: PruneConfig | None = None,
    fine_tune_data: Any = None,
    eval_data: Any = None,
    input_shapes: Iterable[str] = (),
    weights: Any = None,
    allow_pickle: bool = False,
    progress: bool = False,
    **options: Any,
) -> Any:
    """Prune ``model`` with ``method`` ("l1-unstructured" | "structured" | "global"); returns a Result.

    ``model``: an nn.Module (never modified), a MODEL reference or a LoadedModel. ``fine_tune_data``
    / ``eval_data``: DATA references or in-memory data (tensor, (x, y), Dataset, DataLoader, list of
    batches). ``config`` (an ``L1UnstructuredConfig`` / ``GlobalPruneConfig`` /
    ``StructuredPruneConfig``) replaces ``method``, ``amount`` and the method's options (``steps``,
    ``exclude``, ``criterion``, ``prune_first_last``); one of them contradicting it is a UsageError.
    ``exclude`` patterns that match no layer raise a ``PruneWarning`` (not an error). ``.metrics``
    hold parameter counts, sparsity, raw/gzip bytes and accuracy before/after (with ``eval_data``),
    ``.extra["layers"]`` the per-layer table. ``output``: also save there (.pt or .pt2).
    """
    config, tune = resolve_config(method, config, {"amount": amount, **options})
    folder = _check_output(output)
    plan = _fine_tune_plan(fine_tune_data, tune)
    teacher, epochs, fine_tune_data = plan.teacher, plan.epochs, plan.data  # less any left out
    why = "pruning rewrites an eager nn.Module, and a {format} model cannot be rewritten"
    refuse_missing_file(fine_tune_data=fine_tune_data, eval_data=eval_data)  # before the model loads
    loaded = load_eager(model, weights, allow_pickle, "pruning", why=why)
    if folder and not is_hf_model(loaded.module):
        raise UsageError(_NOT_HF.format(output=output, ref=loaded.ref))
    use_cache = getattr(getattr(loaded.module, "config", None), "use_cache", None)
    text = _eval_text(loaded, eval_data)  # a causal LM's --eval-data: text, judged by perplexity
    with no_cache(loaded.module):
        ft, ev, example = _prepare_data(loaded, plan, None if text is not None else eval_data, input_shapes)
        teaching = _teacher(teacher, loaded.module, tune.options.teacher_weights, (ev, ft))
        plan = dataclasses.replace(plan, data=ft, teacher=teaching)
        for pattern in unmatched_patterns(loaded.module, config.exclude):
            warnings.warn(f"--exclude {pattern!r} matches no layer of the model", PruneWarning, stacklevel=2)
        config, pruner, (work, report, history) = _pruned(
            config, loaded.module, example, folder, plan, ev, progress
        )
        if use_cache:  # a causal LM generates with its cache again (pruning ran without it)
            work.config.use_cache = use_cache
        with no_cache(work):
            metrics = _measure(loaded.module, work, report, ev) | _perplexities(
                loaded.module, work, text, eval_data
            )
            judged_on = ev or _text_windows(text, eval_data) or plan.data
            metrics["vs_source"] = _vs_source(loaded.module, work, judged_on, example)
    record = config.to_dict() | {
        "fine_tune_data": ref_name(fine_tune_data),
        "eval_data": ref_name(eval_data),
        "epochs": epochs,
        "teacher": ref_name(teacher),
        "teacher_weights": ref_name(tune.options.teacher_weights),
        "temperature": plan.temperature if teacher is not None else None,
        "alpha": plan.alpha if teacher is not None else None,
        "train": plan.train.to_dict() if epochs else None,
    }
    extra = {k: v for k, v in report.items() if k != "sparsity"}
    extra.update(method=config_method(config), fine_tune_history=history)
    result = _build_result(loaded, work, example, pruner.precision, record, metrics, extra)
    return finish(result, output)


_NOT_HF = (
    "output {output}: a folder is written for Hugging Face models (save_pretrained); "
    "{ref} is not one: use .pt (TorchScript) or .pt2 (ExportedProgram)"
)


def _check_output(output: Any) -> bool:
    """Refuse a bad output before any work; True when it names a folder (a Hugging Face model's)."""
    from pathlib import Path

    from ptopt.core.result import check_folder_output

    if output is None or Path(output).suffix.lower() in OUTPUT_FORMATS:
        check_output(output, OUTPUT_FORMATS)
        return False
    if Path(output).suffix:
        check_output(output, OUTPUT_FORMATS)  # refuses the unknown suffix, naming .pt and .pt2
    check_folder_output(Path(output), "hf")
    return True


# -- the steps -------------------------------------------------------------------------------------------


def config_method(config: PruneConfig) -> str:
    """The method name of a config (``l1-unstructured`` | ``global`` | ``structured``)."""
    return type(config).method


@dataclasses.dataclass(frozen=True)
class Tune:
    """The recovery options resolved: the fine-tuning's, and the trainer's and loss's it uses."""

    options: FineTuneOptions
    train: Any  # TrainConfig
    loss: Any  # DistillConfig


def resolve_config(
    method: str | None, config: PruneConfig | None, options: dict[str, Any]
) -> tuple[PruneConfig, Tune]:
    """One config from ``config`` or the loose ``options`` (keywords of ``table.options()``, refused
    where they do not apply to the method; a contradiction with ``config`` is refused), and the
    recovery options."""
    if config is not None and method is not None and method != config_method(config):
        raise UsageError(
            f"method {method!r} contradicts the given {type(config).__name__} (method {config_method(config)!r})"
        )
    chosen = config_method(config) if config is not None else method
    if chosen is None:
        raise UsageError("pruning needs a method and an amount (or a config=)")
    config_class(chosen)  # an unknown method: its one line first
    given = OPTIONS.check(options, chosen)
    if config is None:
        if given.get("amount") is None:
            raise UsageError("pruning needs a method and an amount (or a config=)")
        config = OPTIONS.build(config_class(chosen), given)
    else:
        reconcile(config, OPTIONS.of(type(config), given))
    from ptopt.compress.distill_config import DistillConfig
    from ptopt.compress.trainer import TrainConfig

    tune = OPTIONS.build(FineTuneOptions, given)
    train = OPTIONS.build(
        TrainConfig, given, epochs=max(tune.epochs, 1) if isinstance(tune.epochs, int) else 1
    )
    return config, Tune(tune, train, OPTIONS.build(DistillConfig, given))


def make_config(method: str, amount: float, **options: Any) -> PruneConfig:
    """The config of ``method`` from its options, as ``prune`` resolves them."""
    return resolve_config(method, None, {"amount": amount, **options})[0]


def _fine_tune_plan(data: Any, tune: Tune) -> FineTune:
    """Validate the recovery options before any long work."""
    epochs, teacher = tune.options.epochs, tune.options.teacher
    if not isinstance(epochs, int) or epochs < 0:
        raise UsageError(f"--epochs must be an integer >= 0, got {epochs!r}")
    # each rule refuses the option given alone, or leaves it out with a note where the environment set
    # it (a CI runner's PTOPT_PRUNE_EPOCHS for the jobs that fine-tune: core.options.drop_without_partner)
    if epochs and data is None:
        drop_without_partner("epochs", "--epochs needs --fine-tune-data (the data to fine-tune on)")
        epochs = 0
    if data is not None and not epochs:
        drop_without_partner("fine_tune_data", "--fine-tune-data needs --epochs N (N >= 1)")
        data = None
    if teacher is not None and data is None:
        drop_without_partner(
            "teacher", "--teacher distills while fine-tuning: give --fine-tune-data and --epochs too"
        )
        teacher = None
    if tune.options.teacher_weights is not None and (teacher is None or teacher == TEACHER_SELF):
        raise UsageError("--teacher-weights go with a pkg.module:factory --teacher (not 'self' or none)")
    return FineTune(epochs, data, teacher, tune.loss.temperature, tune.loss.alpha, tune.train)


def _prepare_data(loaded: Any, plan: FineTune, eval_data: Any, input_shapes: Any) -> tuple[Any, Any, Any]:
    """(fine-tune Dataset, eval Dataset, example batch): labels and fit checked, input specs settled."""
    from ptopt.core.inputspec import parse_named_shapes
    from ptopt.core.modelref import require_input_specs, resolve_inputs, run_checked

    ft = load_dataset(plan.data, "fine-tuning", model=loaded)
    ev = load_dataset(eval_data, "evaluation", model=loaded)
    if ft is not None and plan.teacher is None:
        ft.require_labels("fine-tuning with cross-entropy (or give --teacher to distill)")
    shapes = parse_named_shapes(input_shapes) if input_shapes else ()
    if shapes or not loaded.input_specs:
        resolve_inputs(loaded, data=ft or ev, input_shapes=shapes)
    for ds, what in ((ft, "fine-tune data"), (ev, "eval data")):
        if ds is not None:
            ds.check_labels(run_checked(loaded, ds.first_batch(2).x, what), str(loaded.ref))
    # prune has no --data: name the options it has; the shape to paste comes from the first layer
    require_input_specs(loaded, data_hint="labelled data with --eval-data DATA (e.g. builtin:digits:test)")
    example = loaded.example_inputs("opt", batch=2)
    run_checked(loaded, example, "sample input")
    return ft, ev, example


def _eval_text(loaded: Any, eval_data: Any) -> Any:
    """A causal language model's ``--eval-data`` as token ids (text, a .txt, ids .pt/.npy), or None."""
    from ptopt.core.hf import is_causal_lm

    if eval_data is None or not is_causal_lm(loaded.module):
        return None
    from ptopt.core.lm import token_ids

    vocab = getattr(loaded.module.config, "vocab_size", None)
    ids = token_ids(eval_data, vocab, loaded.info.get("hf_dir"), "--eval-data")
    if ids.numel() < 2:
        raise UsageError(f"--eval-data holds {ids.numel()} token(s): perplexity needs at least 2")
    return ids


def _perplexities(original: Any, work: Any, ids: Any, ref: Any) -> dict[str, Any]:
    """Perplexity before and after pruning on ``ids`` (``core.lm.perplexity_change``), or nothing."""
    if ids is None:
        return {}
    from ptopt.core.lm import eval_window, perplexity_change

    ids, of = eval_window(ids)
    ppl = perplexity_change(original, work, ids, ("perplexity before pruning", "perplexity after pruning"))
    return {
        "eval_data": ref_name(ref),
        "perplexity_window": ppl["window"] | ({"of_tokens": of} if of else {}),
        "perplexity_before": ppl["before"],
        "perplexity_after": ppl["after"],
        "perplexity_increase_pct": ppl["increase_pct"],
    }


def _pruned(config: Any, original: Any, example: Any, folder: bool, plan: FineTune, ev: Any, progress: bool):
    """(the config used, its pruner, ``_run_rounds``'s result). Distilling from a teacher needs the
    pruned model's output as wide as the teacher's: a base model whose hidden size (its output's width)
    was pruned is pruned again with the hidden size kept, with a warning (the dropped attempt's
    ``PruneWarning`` notes are not shown; every other warning passes as it comes)."""
    retry = plan.teacher is not None and getattr(config, "prune_hidden", False)
    while True:
        pruner = make_pruner(config, original, example)
        if folder and hasattr(pruner, "describable"):
            pruner.describable = True  # the config must say the new sizes: from_pretrained rebuilds from it
        if not retry:
            return config, pruner, _run_rounds(pruner, config, original, plan, ev, progress, example)
        try:
            with _held_notes() as notes:
                done = _run_rounds(pruner, config, original, plan, ev, progress, example)
        except _NarrowerThanTeacher as e:
            warnings.warn(
                f"the hidden size kept: distilling from the teacher needs its output width ({e}); "
                "--no-prune-hidden says so",
                PruneWarning,
                stacklevel=3,
            )
            config, retry = dataclasses.replace(config, prune_hidden=False), False
            continue
        for note in notes:
            warnings.warn(note, stacklevel=3)
        return config, pruner, done


@contextlib.contextmanager
def _held_notes() -> Iterator[list[Warning]]:
    """The ``PruneWarning`` notes raised inside, held back (yielded: the list they go to); every other
    warning is shown as it would have been."""
    shown = warnings.showwarning
    held: list[Warning] = []

    def hold(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if issubclass(category, PruneWarning):
            held.append(message if isinstance(message, Warning) else category(message))
        else:
            shown(message, category, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.showwarning = hold
        yield held


class _NarrowerThanTeacher(Exception):
    """The pruned model's output is narrower than the teacher's (the message: their shapes)."""


def _check_teacher_width(teacher: Any, work: Any, example: Any) -> None:
    """``_NarrowerThanTeacher`` when ``work``'s output on ``example`` differs in shape from the teacher's:
    the first tensor of each, the one distillation compares (``distill_loss.first_tensor``)."""
    import torch

    from ptopt.compress.distill_loss import first_tensor
    from ptopt.core.inputspec import call_model

    with torch.no_grad():
        mine, theirs = (first_tensor(call_model(m, example)) for m in (work, teacher))
    shape = lambda t: tuple(getattr(t, "shape", ()))  # noqa: E731
    if shape(mine) != shape(theirs):
        raise _NarrowerThanTeacher(f"{shape(theirs)}, pruned {shape(mine)}")


def _run_rounds(
    pruner: Any, config: PruneConfig, original: Any, plan: FineTune, ev: Any, progress: bool, example: Any
) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """``config.steps`` rounds of pruning, each followed by fine-tuning when planned; returns
    (pruned dense model in eval mode, the pruner's report, the fine-tuning history). ``example``: a
    batch the teacher's and the pruned model's output widths are compared on."""
    from ptopt.compress.trainer import train

    work = copy.deepcopy(original).eval()
    history: list[dict[str, Any]] = []
    for k in range(1, config.steps + 1):
        work = pruner.step(work, config.amount * k / config.steps)
        if plan.data is None:
            continue
        if plan.teacher is not None and getattr(config, "prune_hidden", False):
            _check_teacher_width(plan.teacher, work.eval(), example)
        loss_fn = None
        if plan.teacher is not None:
            from ptopt.compress.distill import make_distill_loss

            # the output loss is auto: cosine for features (a sentence encoder's), kl for class scores
            loss_fn = make_distill_loss(
                plan.teacher,
                temperature=plan.temperature,
                alpha=plan.alpha,
                example_inputs=example,
                labels=plan.data.has_labels,
            )
        desc = f"fine-tune round {k}/{config.steps}" if config.steps > 1 else "fine-tune"
        try:
            result = train(
                work, plan.data, plan.train, eval_data=ev, loss_fn=loss_fn, progress=progress and desc
            )
        finally:
            if hasattr(loss_fn, "remove_hooks"):
                loss_fn.remove_hooks()
            _teacher_home(plan.teacher)  # the loss may have taken it to the training device: the next
            # round's width check and output-loss probe run it on the CPU example, as distill does
        history += [dict(h, round=k) for h in result.history]
    work, report = pruner.finish(work)
    return work.eval(), report, history


def _teacher_home(teacher: Any) -> None:
    """A distillation teacher back on the CPU after a round trained elsewhere (a GPU)."""
    if teacher is None:
        return
    from ptopt.compress.distill_loss import move_module

    move_module(getattr(teacher, "module", teacher), "cpu")


def _measure(original: Any, work: Any, report: dict[str, Any], ev: Any) -> dict[str, Any]:
    """Parameters, raw/gzip weight bytes and (with ``ev``) accuracy, before and after."""
    from ptopt.compress.trainer import evaluate_accuracy
    from ptopt.core.lm import expert_tensors
    from ptopt.core.scores import model_labels_on_features

    params_before, params_after = count_parameters(original), count_parameters(work)
    raw_before, gz_before = state_dict_bytes(original)
    raw_after, gz_after = state_dict_bytes(work)
    metrics: dict[str, Any] = {
        "parameters_before": params_before,
        "parameters_after": params_after,
        "parameter_ratio": params_after / max(params_before, 1),
        "nonzero_parameters_after": count_nonzero_parameters(work),
        "weights_bytes_before": raw_before,
        "weights_bytes_after": raw_after,
        "weights_gzip_bytes_before": gz_before,
        "weights_gzip_bytes_after": gz_after,
    }
    if "sparsity" in report:
        metrics["sparsity"] = report["sparsity"]
    experts = expert_tensors(original)
    if experts:  # a mixture of experts: its fused 3-D expert tensors are no layer pruning can take
        metrics["unpruned_experts"] = {"tensors": list(experts), "parameters": sum(experts.values())}
    if ev is not None and ev.has_labels:  # unlabelled: the cosine to the unpruned model alone (_vs_source)
        before, after = evaluate_accuracy(original, ev), evaluate_accuracy(work, ev)
        metrics.update(
            accuracy_before=before,
            accuracy_after=after,
            accuracy_drop_points=100 * (before - after),
            accuracy_samples=len(ev),
            accuracy_data=ev.name,
        )
        note = model_labels_on_features(original, ev.take(min(2, len(ev))).x)
        if note:  # measured as asked, but the outputs look like features
            metrics["labels_note"] = note
    return metrics


def _text_windows(ids: Any, ref: Any, length: int = 128, most: int = 8) -> Any:
    """A causal LM's evaluation token ids as up to ``most`` windows of ``length`` tokens (``input_ids``),
    what 'vs unpruned' is measured on (it was the 2-sample random example batch); None without text."""
    if ids is None:
        return None
    from ptopt.core.data import Dataset

    length = min(length, int(ids.numel()))
    n = max(1, min(most, int(ids.numel()) // length))
    x = ids[: n * length].reshape(n, length)
    return Dataset({"input_ids": x}, name=f"{ref_name(ref)} ({n} windows of {length} tokens)")


def _vs_source(original: Any, work: Any, data: Any, example: Any) -> dict[str, Any] | None:
    """How closely the pruned model follows the unpruned one (``compress.fidelity.vs_source``) on the
    eval data, else the fine-tuning data, else the example batch: recorded, not gated (pruning
    changes the function on purpose; ``accuracy_*`` says what it cost)."""
    from ptopt.compress.fidelity import fidelity_data, vs_source

    return vs_source(original, work, fidelity_data(data, example=example))


def _build_result(
    loaded: Any,
    work: Any,
    example: Any,
    precision: str,
    record: dict[str, Any],
    metrics: dict[str, Any],
    extra: dict[str, Any],
) -> Any:
    import functools

    from ptopt.core.artifact import Artifact

    template = Artifact(
        path=UNSAVED,
        format="torchscript",  # until saved: .pt2 makes it exported_program
        inputs=list(loaded.input_specs),
        input_style=loaded.input_style,
        config=record,
        parent=loaded.parent_record(),
        precision=precision,
        metrics=metrics,
        extra=extra,
    )
    writer = functools.partial(
        _write, work, example, list(loaded.input_specs), loaded.input_style, loaded.info.get("hf_dir")
    )
    sources = input_files(
        loaded.path, loaded.info.get("weights"), record["fine_tune_data"], record["eval_data"]
    )
    return _PruneResult(work, template, writer, inputs_paths=sources, suffixes=tuple(OUTPUT_FORMATS))


class _PruneResult(Result):
    """A pruned model: a file (``.pt`` / ``.pt2``) or, for a Hugging Face model, a folder."""

    def save(self, path: Any) -> Any:
        self.folder = _check_output(path)
        if self.folder and not is_hf_model(self.model):
            raise UsageError(_NOT_HF.format(output=path, ref=type(self.model).__name__))
        self.template = dataclasses.replace(
            self.template, format="hf" if self.folder else output_format(path)
        )
        return super().save(path)


def _write(model: Any, example: Any, specs: list[Any], style: str, hf_dir: Any, path: Any) -> dict[str, Any]:
    """The Result's writer: the format follows ``path``'s suffix (none: a Hugging Face folder)."""
    from ptopt.compress.prune.hf_config import write_folder

    if path.suffix.lower() not in OUTPUT_FORMATS:
        return write_folder(model, path, hf_dir, example)  # config.json keeps the model's use_cache
    with no_cache(model):
        return save_dense(model, example, path, output_format(path), specs, style)


def _teacher(teacher: Any, module: Any, weights: Any = None, datasets: tuple = ()) -> Any:
    """The distillation teacher as an eval-mode module (``"self"``: a copy of the unpruned model;
    ``weights``: a factory teacher's state dict), run on a batch of the fine-tune data (``datasets``:
    eval, fine-tune): one that does not take it is a ShapeMismatchError here, not an internal error
    inside the fine-tune. A factory teacher with no weights that scores chance on the labelled
    ``datasets`` warns (``compress.teacher_check``)."""
    if teacher is None:
        return None
    if isinstance(teacher, str) and teacher == TEACHER_SELF:
        return copy.deepcopy(module).eval()
    from ptopt.compress.teacher_check import check_factory_teacher
    from ptopt.core.modelref import as_loaded, run_checked

    loaded = as_loaded(teacher, weights)
    teaching = loaded.require_module("a distillation teacher").eval()
    tuned = datasets[-1] if datasets else None
    if tuned is not None:
        run_checked(loaded, tuned.first_batch(2).x, f"fine-tune data {tuned.name} (teacher)")
    check_factory_teacher(loaded, datasets)
    return teaching
