"""The distillation loss and its config (the ``distill`` stage is ``ptopt.compress.distill``).

loss = α·CE(student, labels) + (1−α)·T²·KL(softmax(teacher/T) ‖ softmax(student/T))
       [+ β·Σ MSE(projection(student feature), teacher feature) for each feature pair]

The T² factor keeps the soft-target gradients at the scale of the hard-label ones as T grows
(Hinton et al., 2015). Without labels (or with α = 0) the loss is the soft term alone. The teacher
runs in eval mode under no_grad; only the student (and the feature projections) learn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ptopt.compress.distill_config import (  # noqa: F401 - re-exported: the config's names stay here too
    DEFAULT_ALPHA,
    DEFAULT_TEMPERATURE,
    OUTPUT_LOSSES,
    DistillConfig,
    parse_feature_pair,
)
from ptopt.core.data import Batch
from ptopt.core.errors import ShapeMismatchError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import call_model


def set_eval(module: Any) -> None:
    try:
        module.eval()
    except (NotImplementedError, RuntimeError):  # an ExportedProgram's module refuses train()/eval()
        pass


def first_tensor(out: Any) -> Any:
    """The output distillation compares: ``core.tensors.primary_output`` (the first of a tuple, a
    dict's or a Hugging Face output's ``logits``: a ``BertForSequenceClassification`` teacher returned
    its ``SequenceClassifierOutput`` here, an internal error); anything else as it is."""
    from ptopt.core.tensors import primary_output

    try:
        return primary_output(out)
    except TypeError:
        return out


def _samples(student: Any, teacher: Any) -> tuple[Any, Any]:
    """Both outputs as rows the cosine compares, as ``export.parity.sample_cosines`` takes them: one per
    sample, flattened ([N, T, H] too); a vector or one value per sample ([N], [N, 1]: a regression's)
    is one row (``flatten(1)`` of [N] was an IndexError, an internal error)."""
    s, t = student.float(), teacher.float()
    if s.dim() >= 2 and s[0].numel() > 1:
        return s.reshape(s.shape[0], -1), t.reshape(t.shape[0], -1)
    return s.reshape(1, -1), t.reshape(1, -1)


def _submodule(model: Any, name: str, which: str) -> Any:
    modules = dict(model.named_modules())
    if name not in modules or not name:
        names = [n for n in modules if n]
        hint = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
        raise UsageError(f"feature pair: the {which} has no layer {name!r} (layers: {hint})")
    return modules[name]


class DistillLoss(nn.Module):
    """A trainer ``loss_fn``: ``loss(model, batch) -> (loss, student_logits)``.

    An nn.Module so the trainer moves it to the training device and trains its feature
    projections with the student.
    """

    def __init__(
        self, teacher: Any, temperature: float, alpha: float, feature_weight: float, output_loss: str = "kl"
    ):
        super().__init__()
        #: ``kl`` or ``cosine`` (resolved: ``make_distill_loss``), and why cosine when ``auto`` chose it
        self.output_loss, self.output_loss_why = output_loss, None
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

    def frozen_modules(self) -> list[Any]:
        """What the trainer shards with FSDP besides the student: the teacher, when it is an eager
        module (a TorchScript or ExportedProgram teacher stays whole on every process)."""
        return frozen_teacher(self.teacher)

    def _run_teacher(self, x: Any) -> Any:
        from ptopt.compress.trainer import to_device

        teacher = self.teacher
        set_eval(teacher)
        device = next(t for t in _tensors(x)).device
        t_device = next((p.device for p in teacher.parameters()), device)
        if t_device != device:
            move_module(teacher, device)
            t_device = next((p.device for p in teacher.parameters()), device)
            x = to_device(x, t_device)  # a teacher that cannot move runs where it is
        with torch.no_grad():
            out = call_model(teacher, x)
        return to_device(first_tensor(out), device)

    def forward(self, model: Any, batch: Batch) -> tuple[Any, Any]:
        self._features.clear()
        x, teacher_logits = unpack_teacher_logits(batch.x)
        if teacher_logits is None:
            teacher_logits = self._run_teacher(x)
        logits = first_tensor(call_model(model, x))
        t = self.temperature
        if self.output_loss == "cosine":  # features: the direction ptopt's cosine figures judge
            soft = (1 - F.cosine_similarity(*_samples(logits, teacher_logits), dim=1)).mean()
        else:
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
            out = first_tensor(output)
            self._features[key] = out.detach() if detach else out

        return hook

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


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

    set_eval(teacher)
    if device is not None:
        move_module(teacher, device)
    parts = []
    with torch.inference_mode():
        for b in data.batches(batch_size):
            x = to_device(b.x, device) if device is not None else b.x
            parts.append(first_tensor(call_model(teacher, x)).float().cpu())
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
    output_loss: str = "auto",
    labels: bool = False,
) -> Any:
    """A loss for ``trainer.train(loss_fn=...)`` distilling ``teacher_module`` into the model being trained.

    ``feature_pairs`` [(teacher layer, student layer)] also need ``student`` (the module being trained)
    and ``example_inputs`` (one batch) to size the projections; the projections are the returned
    module's parameters, which ``train`` picks up. ``output_loss="auto"`` reads the teacher's outputs on
    ``example_inputs`` (``core.scores``; ``labels``: the data has labels, so class scores): ``kl`` for
    class scores, ``cosine`` for features (without ``example_inputs``: ``kl``). Call ``.remove_hooks()``
    after training.
    """
    from ptopt.core.modelref import LoadedModel

    DistillConfig(temperature, alpha, tuple(feature_pairs), feature_weight, output_loss)  # validates
    if isinstance(teacher_module, LoadedModel):
        teacher_module = teacher_module.require_module("distillation")
    loss = DistillLoss(teacher_module, temperature, alpha, feature_weight)
    loss.output_loss, loss.output_loss_why = _resolve_output_loss(
        teacher_module, output_loss, example_inputs, labels
    )
    if feature_pairs:
        if student is None or example_inputs is None:
            raise UsageError(
                "feature pairs need the student module and example inputs to size their projections"
            )
        for t_name, s_name in feature_pairs:
            loss.add_feature_pair(student, t_name, s_name, example_inputs)
    return loss


def _resolve_output_loss(teacher: Any, asked: str, x: Any, labels: bool) -> tuple[str, str | None]:
    """(``kl`` or ``cosine``, why cosine) for ``asked`` (``OUTPUT_LOSSES``)."""
    if asked != "auto" or x is None:
        return ("kl" if asked == "auto" else asked), None
    from ptopt.core.scores import model_class_scores

    set_eval(teacher)
    ok, why = model_class_scores(teacher, x, labels=labels)
    return ("kl", None) if ok else ("cosine", f"the teacher's outputs are not class scores: {why}")


def frozen_teacher(teacher: Any) -> list[Any]:
    """``[teacher]`` when FSDP can shard it (an eager nn.Module with parameters), else ``[]``."""
    eager = isinstance(teacher, nn.Module) and not isinstance(teacher, torch.jit.ScriptModule)
    return [teacher] if eager and any(True for _ in teacher.parameters()) else []


def move_module(module: Any, device: Any) -> None:
    try:
        module.to(device)
    except (RuntimeError, NotImplementedError, AttributeError):  # e.g. an ExportedProgram's module
        pass
