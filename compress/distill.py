"""Knowledge distillation: train a small student to match a large teacher.

loss = α·CE(student, labels) + (1−α)·T²·KL(softmax(teacher/T) ‖ softmax(student/T))
       [+ β·Σ MSE(projection(student feature), teacher feature) for each feature pair]

The T² factor keeps the soft-target gradients at the scale of the hard-label ones as T grows
(Hinton et al., 2015). Without labels (or with α = 0) the loss is the soft term alone. The teacher
runs in eval mode under no_grad; only the student (and the feature projections) learn.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ptopt.core.config import Config, register_config
from ptopt.core.data import Batch
from ptopt.core.errors import DataError, ShapeMismatchError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import call_model

#: defaults chosen on digits (benchmarks/bench_distill.py): soft targets at T=4 carry the teacher's
#: "dark knowledge" (which wrong digits look alike), and α=0.5 keeps the labels as an anchor
DEFAULT_TEMPERATURE = 4.0
DEFAULT_ALPHA = 0.5
DEFAULT_EPOCHS = 4
DEFAULT_LR = 3e-3
DEFAULT_BATCH_SIZE = 32
OUTPUT_SUFFIXES = {".pt": "torchscript", ".pt2": "exported_program"}


@register_config
@dataclasses.dataclass(frozen=True)
class DistillConfig(Config):
    """Options of the distillation loss."""

    type_name = "distill"
    temperature: float = DEFAULT_TEMPERATURE
    alpha: float = DEFAULT_ALPHA
    #: (teacher layer, student layer) pairs whose outputs the student learns to match
    feature_pairs: tuple[tuple[str, str], ...] = ()
    feature_weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise UsageError(f"temperature must be > 0, got {self.temperature}")
        if not 0 <= self.alpha <= 1:
            raise UsageError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.feature_weight < 0:
            raise UsageError(f"feature weight must be >= 0, got {self.feature_weight}")


def parse_feature_pair(text: str) -> tuple[str, str]:
    """``teacher.layer=student.layer`` → ("teacher.layer", "student.layer")."""
    t, sep, s = text.partition("=")
    if not sep or not t.strip() or not s.strip():
        raise UsageError(f"feature pair {text!r}: write TEACHER_LAYER=STUDENT_LAYER, e.g. layers.2=layers.2")
    return t.strip(), s.strip()


def _set_eval(module: Any) -> None:
    try:
        module.eval()
    except (NotImplementedError, RuntimeError):  # an ExportedProgram's module refuses train()/eval()
        pass


def _first_tensor(out: Any) -> Any:
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


def _submodule(model: Any, name: str, which: str) -> Any:
    modules = dict(model.named_modules())
    if name not in modules or not name:
        names = [n for n in modules if n]
        hint = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
        raise UsageError(f"feature pair: the {which} has no layer {name!r} (layers: {hint})")
    return modules[name]


@functools.cache
def _make_loss_class():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class DistillLoss(nn.Module):
        """A trainer ``loss_fn``: ``loss(model, batch) -> (loss, student_logits)``.

        An nn.Module so the trainer moves it to the training device and trains its feature
        projections with the student.
        """

        def __init__(self, teacher: Any, temperature: float, alpha: float, feature_weight: float):
            super().__init__()
            # a list hides the teacher from parameters()/state_dict(): it never trains
            self._teacher = [teacher]
            self.temperature, self.alpha, self.feature_weight = (
                float(temperature),
                float(alpha),
                float(feature_weight),
            )
            self.pairs: list[tuple[str, str, str]] = []  # (teacher layer, student layer, projection key)
            self.projections = nn.ModuleDict()
            self._features: dict[str, Any] = {}
            self._handles: list[Any] = []

        @property
        def teacher(self) -> Any:
            return self._teacher[0]

        def _run_teacher(self, x: Any) -> Any:
            from ptopt.compress.trainer import to_device

            teacher = self.teacher
            _set_eval(teacher)
            device = next(t for t in _tensors(x)).device
            t_device = next((p.device for p in teacher.parameters()), device)
            if t_device != device:
                _move(teacher, device)
                t_device = next((p.device for p in teacher.parameters()), device)
                x = to_device(x, t_device)  # a teacher that cannot move runs where it is
            with torch.no_grad():
                out = call_model(teacher, x)
            return to_device(_first_tensor(out), device)

        def forward(self, model: Any, batch: Batch) -> tuple[Any, Any]:
            self._features.clear()
            x, teacher_logits = unpack_teacher_logits(batch.x)
            if teacher_logits is None:
                teacher_logits = self._run_teacher(x)
            logits = _first_tensor(call_model(model, x))
            t = self.temperature
            soft = F.kl_div(
                F.log_softmax(logits.float() / t, dim=-1),
                F.log_softmax(teacher_logits.float() / t, dim=-1),
                reduction="batchmean",
                log_target=True,
            ) * (t * t)
            if batch.y is not None and self.alpha > 0:
                loss = self.alpha * F.cross_entropy(logits.float(), batch.y) + (1 - self.alpha) * soft
            else:
                loss = soft
            for t_name, s_name, key in self.pairs:
                s_feat = self.projections[key](self._features[f"s:{s_name}"].float())
                t_feat = self._features[f"t:{t_name}"].float()
                s_feat, t_feat = _match_spatial(s_feat, t_feat)
                loss = loss + self.feature_weight * F.mse_loss(s_feat, t_feat)
            self._features.clear()
            return loss, logits

        def add_feature_pair(self, student: Any, t_name: str, s_name: str, example_x: Any) -> None:
            t_mod = _submodule(self.teacher, t_name, "teacher")
            s_mod = _submodule(student, s_name, "student")
            key = f"p{len(self.pairs)}"
            try:
                self._handles.append(t_mod.register_forward_hook(self._capture(f"t:{t_name}", detach=True)))
            except (RuntimeError, AttributeError) as e:
                raise UnsupportedModelError(
                    f"feature distillation needs an eager teacher to hook layer {t_name!r} "
                    f"({type(e).__name__}: {str(e).splitlines()[0][:120]}); give it as zoo:NAME or "
                    "pkg.module:factory --teacher-weights W"
                ) from None
            self._handles.append(s_mod.register_forward_hook(self._capture(f"s:{s_name}", detach=False)))
            was_training = student.training
            student.eval()  # probing the widths must not move BatchNorm statistics
            with torch.no_grad():
                self._run_teacher(example_x)
                call_model(student, example_x)
            student.train(was_training)
            s_feat, t_feat = self._features[f"s:{s_name}"], self._features[f"t:{t_name}"]
            self._features.clear()
            self.projections[key] = _projection(s_feat, t_feat, t_name, s_name)
            self.pairs.append((t_name, s_name, key))

        def _capture(self, key: str, detach: bool):
            def hook(module, inputs, output):
                out = _first_tensor(output)
                self._features[key] = out.detach() if detach else out

            return hook

        def remove_hooks(self) -> None:
            for h in self._handles:
                h.remove()
            self._handles.clear()

    return DistillLoss


#: name of the input slot that carries precomputed teacher logits (see ``with_teacher_logits``)
_LOGITS_KEY = "__ptopt_derived:teacher_logits"  # not hashed into checkpoint fingerprints
_INPUT_PREFIX = "__ptopt_input:"


def with_teacher_logits(data: Any, teacher: Any, batch_size: int = 256, device: Any = None) -> Any:
    """``data`` with the teacher's logits for every sample riding along in ``x``.

    Without augmentation the teacher (eval mode, no dropout) gives each sample the same logits every
    epoch, so they are computed once instead of once per epoch: distillation then costs about what
    training on labels costs. The trainer indexes, shuffles, shards and moves ``x`` as one unit;
    the distillation loss splits it back (``unpack_teacher_logits``).
    """
    import torch

    from ptopt.compress.trainer import to_device
    from ptopt.core.data import Dataset
    from ptopt.core.inputspec import flatten_inputs

    _set_eval(teacher)
    if device is not None:
        _move(teacher, device)
    parts = []
    with torch.inference_mode():
        for b in data.batches(batch_size):
            x = to_device(b.x, device) if device is not None else b.x
            parts.append(_first_tensor(call_model(teacher, x)).float().cpu())
    style = "dict" if isinstance(data.x, dict) else "tuple" if isinstance(data.x, tuple) else "tensor"
    packed = {f"{_INPUT_PREFIX}{style}:{name}": t for name, t in flatten_inputs(data.x)}
    packed[_LOGITS_KEY] = torch.cat(parts)
    return Dataset(packed, data.y, data.name)


def unpack_teacher_logits(x: Any) -> tuple[Any, Any]:
    """(model inputs, precomputed teacher logits or None) from a batch's ``x``."""
    if not (isinstance(x, dict) and _LOGITS_KEY in x):
        return x, None
    items = [(k[len(_INPUT_PREFIX) :].split(":", 1), v) for k, v in x.items() if k.startswith(_INPUT_PREFIX)]
    style = items[0][0][0]
    if style == "dict":
        inputs: Any = {name: v for (_, name), v in items}
    elif style == "tuple":
        inputs = tuple(v for _, v in items)
    else:
        inputs = items[0][1]
    return inputs, x[_LOGITS_KEY]


def _tensors(x: Any):
    from ptopt.core.inputspec import flatten_inputs

    return (t for _, t in flatten_inputs(x))


def _projection(s_feat: Any, t_feat: Any, t_name: str, s_name: str) -> Any:
    """Identity when widths match; else a learned 1×1 conv (N×C×H×W) or linear map (N×…×D)."""
    from torch import nn

    if s_feat.dim() != t_feat.dim():
        raise ShapeMismatchError(
            f"feature pair {t_name}={s_name}: outputs of different rank",
            expected=f"teacher {tuple(t_feat.shape)}",
            got=f"student {tuple(s_feat.shape)}",
        )
    if s_feat.dim() == 4:
        cs, ct = s_feat.shape[1], t_feat.shape[1]
        return nn.Identity() if cs == ct else nn.Conv2d(cs, ct, 1, bias=False)
    if s_feat.dim() >= 2:
        if tuple(s_feat.shape[:-1]) != tuple(t_feat.shape[:-1]):
            raise ShapeMismatchError(
                f"feature pair {t_name}={s_name}: only the last (feature) dimension may differ",
                expected=f"teacher {tuple(t_feat.shape)}",
                got=f"student {tuple(s_feat.shape)}",
            )
        ds, dt = s_feat.shape[-1], t_feat.shape[-1]
        return nn.Identity() if ds == dt else nn.Linear(ds, dt, bias=False)
    raise ShapeMismatchError(
        f"feature pair {t_name}={s_name}: cannot match outputs of shape {tuple(s_feat.shape)}"
    )


def _match_spatial(s: Any, t: Any) -> tuple[Any, Any]:
    """Average-pool the larger of two N×C×H×W maps down to the smaller one's size."""
    import torch.nn.functional as F

    if s.dim() != 4 or s.shape[2:] == t.shape[2:]:
        return s, t
    size = (min(s.shape[2], t.shape[2]), min(s.shape[3], t.shape[3]))
    return F.adaptive_avg_pool2d(s, size), F.adaptive_avg_pool2d(t, size)


def make_distill_loss(
    teacher_module: Any,
    temperature: float = DEFAULT_TEMPERATURE,
    alpha: float = DEFAULT_ALPHA,
    feature_pairs: Sequence[tuple[str, str]] = (),
    student: Any = None,
    example_inputs: Any = None,
    feature_weight: float = 1.0,
) -> Any:
    """A loss for ``trainer.train(loss_fn=...)`` distilling ``teacher_module`` into the model being trained.

    ``feature_pairs`` [(teacher layer, student layer)] also need ``student`` (the module being trained)
    and ``example_inputs`` (one batch) to size the projections; the projections are the returned
    module's parameters, which ``train`` picks up. Call ``.remove_hooks()`` after training.
    """
    from ptopt.core.modelref import LoadedModel

    DistillConfig(temperature, alpha, tuple(feature_pairs), feature_weight)  # validates
    if isinstance(teacher_module, LoadedModel):
        teacher_module = teacher_module.require_module("distillation")
    loss = _make_loss_class()(teacher_module, temperature, alpha, feature_weight)
    if feature_pairs:
        if student is None or example_inputs is None:
            raise UsageError(
                "feature pairs need the student module and example inputs to size their projections"
            )
        for t_name, s_name in feature_pairs:
            loss.add_feature_pair(student, t_name, s_name, example_inputs)
    return loss


def count_parameters(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def distill(
    teacher: Any,
    student: Any,
    train_data: Any,
    output: str | os.PathLike,
    *,
    eval_data: Any = None,
    temperature: float = DEFAULT_TEMPERATURE,
    alpha: float = DEFAULT_ALPHA,
    epochs: int = DEFAULT_EPOCHS,
    feature_pairs: Sequence[tuple[str, str] | str] = (),
    feature_weight: float = 1.0,
    teacher_weights: Any = None,
    student_weights: Any = None,
    allow_pickle: bool = False,
    lr: float = DEFAULT_LR,
    batch_size: int = DEFAULT_BATCH_SIZE,
    precision: str = "fp32",
    device: str = "auto",
    seed: int = 0,
    train_config: Any = None,
    checkpoint_dir: Any = None,
    resume: bool = False,
    log_dir: Any = None,
    metrics_file: Any = None,
    epoch_hooks: Sequence[Any] = (),
    progress: bool = True,
    cache_teacher: bool = True,
) -> Any:
    """Distill ``teacher`` into ``student`` on ``train_data`` and write the student to ``output``.

    ``output`` ending in ``.pt`` is TorchScript, ``.pt2`` an ExportedProgram: both load with plain
    torch. ``train_config`` (a TrainConfig) sets the other trainer options; the named arguments win.
    ``cache_teacher``: compute the teacher's logits once for all samples instead of every epoch
    (not with feature pairs, which need the teacher's layers on every batch).
    Returns the Artifact (None on ranks other than 0 under torchrun).
    """
    import torch

    from ptopt.compress import distributed as dist_util
    from ptopt.compress.trainer import TrainConfig, train
    from ptopt.core.data import load_data
    from ptopt.core.modelref import as_loaded, run_checked

    # -- everything the user can get wrong is checked before training ---------------------------
    out_format = OUTPUT_SUFFIXES.get(os.path.splitext(str(output))[1].lower())
    if out_format is None:
        raise UsageError(f"output {output}: use .pt (TorchScript) or .pt2 (ExportedProgram)")
    pairs = tuple(parse_feature_pair(p) if isinstance(p, str) else tuple(p) for p in feature_pairs)
    dcfg = DistillConfig(temperature, alpha, pairs, feature_weight)  # type: ignore[arg-type]
    tcfg = (train_config or TrainConfig()).replace(
        epochs=epochs, lr=lr, batch_size=batch_size, precision=precision, device=device, seed=seed
    )
    if resume and checkpoint_dir is None:
        raise UsageError("--resume needs --checkpoint-dir (where the killed run wrote its checkpoint)")
    dist_util.resolve_device(device)
    train_ds = load_data(train_data)
    if len(train_ds) == 0:
        raise DataError(f"{train_ds.name}: no samples to train on")
    train_ds.check_finite()
    if alpha > 0 and not train_ds.has_labels:
        raise DataError(
            f"{train_ds.name} has no labels but --alpha is {alpha}: the label term needs labels; "
            "use --alpha 0 to learn from the teacher's soft targets alone"
        )
    eval_ds = load_data(eval_data) if eval_data is not None else None
    if eval_ds is not None and not eval_ds.has_labels:
        raise DataError(f"{eval_ds.name} has no labels: --eval-data needs labels to measure accuracy")

    t_loaded = as_loaded(teacher, teacher_weights, allow_pickle)
    t_loaded.require_module("distillation")
    torch.manual_seed(seed)  # the student's fresh initialization is part of the run
    s_loaded = as_loaded(student, student_weights, allow_pickle)
    if s_loaded.format not in ("eager", "pickle"):
        raise UnsupportedModelError(
            f"student {s_loaded.ref} is a {s_loaded.format} model; a student must be "
            "trainable: give pkg.module:factory [--student-weights W] or zoo:NAME"
        )
    s_module = s_loaded.module
    probe = train_ds.first_batch(min(len(train_ds), 8))
    t_out = _first_tensor(run_checked(t_loaded, probe.x, what=f"train data {train_ds.name} (teacher)"))
    s_out = _first_tensor(run_checked(s_loaded, probe.x, what=f"train data {train_ds.name} (student)"))
    if tuple(t_out.shape) != tuple(s_out.shape):
        raise ShapeMismatchError(
            "teacher and student outputs differ in shape, so the student cannot match the "
            "teacher's predictions",
            expected=f"teacher {_shape(t_out)}",
            got=f"student {_shape(s_out)}",
        )
    if train_ds.has_labels and int(train_ds.y.max()) >= t_out.shape[-1]:
        raise DataError(
            f"{train_ds.name}: label {int(train_ds.y.max())} but the models have {t_out.shape[-1]} outputs"
        )

    loss = make_distill_loss(
        t_loaded.module,
        temperature,
        alpha,
        pairs,
        student=s_module,
        example_inputs=probe.x,
        feature_weight=feature_weight,
    )
    teacher_record = t_loaded.parent_record()
    from ptopt.compress.checkpoint import tensor_digest

    fingerprint_extra = {**dcfg.to_dict(), "teacher": tensor_digest(t_loaded.module.state_dict().values())}
    cached = cache_teacher and not pairs
    fingerprint_extra["teacher_logits"] = "cached" if cached else "per batch"
    train_input = train_ds
    if cached:
        train_input = with_teacher_logits(train_ds, t_loaded.module, device=dist_util.resolve_device(device))
    try:
        result = train(
            s_module,
            train_input,
            tcfg,
            eval_data=eval_ds,
            loss_fn=loss,
            epoch_hooks=epoch_hooks,
            progress=progress,
            description="distill",
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            log_dir=log_dir,
            metrics_file=metrics_file,
            fingerprint_extra=fingerprint_extra,
        )
    finally:
        loss.remove_hooks()
        _move(t_loaded.module, "cpu")  # the loss may have taken the teacher to the training device
    if not dist_util.is_main_process():
        return None

    # -- the output: the student alone, loadable with plain torch ----------------------------------
    from ptopt.core.artifact import Artifact
    from ptopt.core.inputspec import input_style, specs_from_example

    example = train_ds.first_batch(min(len(train_ds), 4)).x
    s_module.eval()
    _save_student(s_module, example, output, out_format)
    teacher_acc = None
    if eval_ds is not None:
        from ptopt.compress.trainer import evaluate_accuracy

        _set_eval(t_loaded.module)
        teacher_acc = evaluate_accuracy(t_loaded.module, eval_ds)
    t_params, s_params = count_parameters(t_loaded.module), count_parameters(s_module)
    config = {
        **dcfg.to_dict(),
        "train": tcfg.to_dict(),
        "teacher": str(t_loaded.ref),
        "student": str(s_loaded.ref),
        "train_data": train_data if isinstance(train_data, str) else train_ds.name,
        "eval_data": eval_data if isinstance(eval_data, str) or eval_data is None else eval_ds.name,
    }  # type: ignore[union-attr]
    art = Artifact(
        path=Path(output),
        format=out_format,
        inputs=specs_from_example(train_ds.first_batch(min(len(train_ds), 32)).x),
        input_style=input_style(example),
        config=config,
        parent=teacher_record,
        precision="fp32",
        metrics={
            "eval_accuracy": result.best_accuracy,
            "best_epoch": result.best_epoch,
            "teacher_eval_accuracy": teacher_acc,
            "student_parameters": s_params,
            "teacher_parameters": t_params,
        },
        extra={
            "teacher": teacher_record,
            "student": s_loaded.parent_record(),
            "history": result.history,
            "world_size": result.world_size,
            "resumed_from_epoch": result.resumed_from_epoch,
            "parameter_ratio": s_params / max(t_params, 1),
        },
    )
    return art.finalize()


def _move(module: Any, device: Any) -> None:
    try:
        module.to(device)
    except (RuntimeError, NotImplementedError, AttributeError):  # e.g. an ExportedProgram's module
        pass


def _shape(t: Any) -> str:
    return "x".join(str(d) for d in t.shape)


def _save_student(module: Any, example: Any, output: Any, out_format: str) -> None:
    """TorchScript (trace) or ExportedProgram (dynamic batch), written atomically and checked on reload."""
    import warnings

    import torch

    from ptopt.core.artifact import atomic_path
    from ptopt.core.inputspec import call_args, flatten_inputs

    args, kwargs = call_args(example)
    with torch.no_grad():
        expected = _first_tensor(module(*args, **kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", DeprecationWarning
        )  # torch.jit.* is deprecated (still the portable format)
        with atomic_path(output) as tmp:
            if out_format == "torchscript":
                if kwargs:
                    traced = torch.jit.trace(module, example_kwarg_inputs=kwargs)
                else:
                    traced = torch.jit.trace(module, args)
                torch.jit.save(traced, str(tmp))
                reloaded = torch.jit.load(str(tmp))
            else:
                batch = torch.export.Dim("batch", min=1, max=1024)
                names = [n for n, _ in flatten_inputs(example)]
                if kwargs:
                    dyn: Any = {k: {0: batch} for k in kwargs}
                else:
                    dyn = tuple({0: batch} for _ in names)
                try:
                    ep = torch.export.export(module, args, kwargs, dynamic_shapes=dyn)
                except Exception as e:  # noqa: BLE001 - export failures are many types
                    raise UnsupportedModelError(
                        f"torch.export cannot export the student "
                        f"({str(e).strip().splitlines()[0][:200]}); write a .pt "
                        "(TorchScript) instead"
                    ) from None
                torch.export.save(ep, str(tmp))
                reloaded = torch.export.load(str(tmp)).module()
            with torch.no_grad():
                got = _first_tensor(reloaded(*args, **kwargs))
            if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
                raise UnsupportedModelError(
                    "the saved student does not reproduce the trained one "
                    f"(max diff {float((got - expected).abs().max()):.2e}); "
                    "try the other output format"
                )
