"""Pruning: ``prune(model, method, amount, output)`` and its configs.

Three methods, one config each (frozen, registered, round-tripping through dicts):

- ``l1-unstructured`` (``prune_unstructured.py``): every conv/linear weight to ``amount`` sparsity;
- ``global`` (``prune_unstructured.py``): one magnitude ranking across those weights;
- ``structured`` (``prune_structured.py``): whole output channels removed, the model rewritten smaller.

Recovery: ``fine_tune_data`` + ``epochs`` fine-tunes with the shared trainer after pruning (with
``teacher``: distillation from it; ``"self"`` means the unpruned model); ``steps=K`` prunes gradually,
round k reaching ``amount * k / K``, each round followed by ``epochs`` of fine-tuning.

The artifact is a dense model that loads with plain torch: TorchScript for ``.pt``, an
ExportedProgram for ``.pt2``. Its sidecar records the config, the per-layer sparsity or channels
before → after, parameter counts, raw and gzip bytes, and the parent model.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import gzip
import io
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Literal

from ptopt.core.config import Config, register_config
from ptopt.core.errors import UnsupportedModelError, UsageError

METHODS = ("l1-unstructured", "structured", "global")
CRITERIA = ("l1", "l2")
#: the unpruned model as distillation teacher
TEACHER_SELF = "self"


class PruneWarning(UserWarning):
    """Something the user should know that does not stop pruning (an --exclude matching nothing)."""


@dataclasses.dataclass(frozen=True)
class PruneConfig(Config):
    """What every pruning method shares. ``amount`` is the fraction pruned, strictly between 0 and 1."""

    amount: float = 0.5
    #: fnmatch patterns of module names left alone (a parent name covers its children)
    exclude: tuple[str, ...] = ()
    #: gradual pruning in this many rounds (fine-tuning between rounds when data is given)
    steps: int = 1

    def __post_init__(self) -> None:
        if (
            isinstance(self.amount, bool)
            or not isinstance(self.amount, (int, float))
            or not 0 < self.amount < 1
        ):
            raise UsageError(f"--amount must be a fraction strictly between 0 and 1, got {self.amount!r}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise UsageError(f"--steps must be an integer >= 1, got {self.steps!r}")
        object.__setattr__(self, "exclude", tuple(self.exclude))


@register_config
@dataclasses.dataclass(frozen=True)
class L1UnstructuredConfig(PruneConfig):
    """Per-layer L1 magnitude pruning of conv and linear weights to exactly ``amount`` sparsity."""

    type_name = "prune-l1-unstructured"


@register_config
@dataclasses.dataclass(frozen=True)
class GlobalPruneConfig(PruneConfig):
    """One L1 magnitude ranking across all conv and linear weights to a global sparsity of ``amount``."""

    type_name = "prune-global"


@register_config
@dataclasses.dataclass(frozen=True)
class StructuredPruneConfig(PruneConfig):
    """Remove ``amount`` of each layer's output channels (lowest L1/L2 filter norm), rewriting the model."""

    type_name = "prune-structured"
    criterion: Literal["l1", "l2"] = "l1"
    #: also prune the first layer and the last linear (excluded by default: cheap and sensitive)
    prune_first_last: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.criterion not in CRITERIA:
            raise UsageError(f"--criterion must be one of {', '.join(CRITERIA)}, got {self.criterion!r}")


CONFIGS: dict[str, type[PruneConfig]] = {
    "l1-unstructured": L1UnstructuredConfig,
    "global": GlobalPruneConfig,
    "structured": StructuredPruneConfig,
}
#: config class -> pruner class (filled by the technique modules with ``register_pruner``)
_PRUNERS: dict[type, type] = {}
_TECHNIQUE_MODULES = ("ptopt.compress.prune_unstructured", "ptopt.compress.prune_structured")


def register_pruner(config_cls: type) -> Callable[[type], type]:
    """Class decorator: the pruner for ``config_cls``. A pruner is built as ``cls(config, model,
    example_inputs)`` and has ``step(model, amount) -> model`` (masks may stay trainable) and
    ``finish(model) -> (model, report)``, plus ``precision``."""

    def deco(cls: type) -> type:
        _PRUNERS[config_cls] = cls
        return cls

    return deco


def make_pruner(config: PruneConfig, model: Any, example_inputs: Any) -> Any:
    import importlib

    for name in _TECHNIQUE_MODULES:
        importlib.import_module(name)
    return _PRUNERS[type(config)](config, model, example_inputs)


def make_config(
    method: str,
    amount: float,
    *,
    exclude: Iterable[str] = (),
    steps: int = 1,
    criterion: str = "l1",
    prune_first_last: bool = False,
) -> PruneConfig:
    if method not in CONFIGS:
        raise UsageError(f"unknown pruning method {method!r} (choose from {', '.join(METHODS)})")
    if method != "structured":
        if criterion != "l1":
            raise UsageError(
                "--criterion applies to structured pruning; unstructured pruning ranks by magnitude"
            )
        if prune_first_last:
            raise UsageError(
                "--prune-first-last applies to structured pruning (unstructured prunes every layer)"
            )
        return CONFIGS[method](amount=amount, exclude=tuple(exclude), steps=steps)
    return StructuredPruneConfig(
        amount=amount,
        exclude=tuple(exclude),
        steps=steps,
        criterion=criterion,
        prune_first_last=prune_first_last,
    )


def matches(name: str, patterns: Iterable[str]) -> bool:
    """fnmatch of a module name, or of one of its parents (``layers.0`` covers ``layers.0.conv1``)."""
    parts = name.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(p, pat) for pat in patterns for p in prefixes)


def unmatched_patterns(model: Any, patterns: Iterable[str]) -> list[str]:
    names = [n for n, _ in model.named_modules() if n]
    return [p for p in patterns if not any(matches(n, [p]) for n in names)]


# -- measuring ---------------------------------------------------------------------------------------


def count_parameters(model: Any) -> tuple[int, int]:
    """(all parameters, non-zero parameters)."""
    total = nonzero = 0
    for p in model.parameters():
        total += p.numel()
        nonzero += int((p.detach() != 0).sum())
    return total, nonzero


def state_dict_bytes(model: Any) -> tuple[int, int]:
    """(raw, gzip) bytes of the model's weights as ``torch.save(state_dict)``: zeros only help gzip."""
    import torch

    buf = io.BytesIO()
    torch.save({k: v.detach().contiguous() for k, v in model.state_dict().items()}, buf)
    raw = buf.getvalue()
    return len(raw), len(gzip.compress(raw, compresslevel=6, mtime=0))


# -- saving ----------------------------------------------------------------------------------------


def output_format(output: str | os.PathLike) -> str:
    suffix = os.path.splitext(str(output))[1].lower()
    if suffix == ".pt":
        return "torchscript"
    if suffix == ".pt2":
        return "exported_program"
    raise UsageError(
        f"output {output}: use .pt (TorchScript) or .pt2 (ExportedProgram); the pruned model is "
        "saved so that plain torch loads it"
    )


def save_dense(model: Any, example_inputs: Any, path: str | os.PathLike, fmt: str, specs: list[Any]) -> None:
    """Write ``model`` as TorchScript (trace) or an ExportedProgram with a dynamic batch dimension."""
    import torch

    from ptopt.core.inputspec import call_args

    args, kwargs = call_args(example_inputs)
    model = model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if fmt == "torchscript":
            with torch.no_grad():
                if kwargs:
                    traced = torch.jit.trace(model, example_kwarg_inputs=kwargs)
                else:
                    traced = torch.jit.trace(model, args if len(args) > 1 else args[0])
            torch.jit.save(traced, str(path))
            return
        dyn = _dynamic_shapes(specs, args, kwargs)
        ep = torch.export.export(model, args, kwargs or None, dynamic_shapes=dyn)
        buf = io.BytesIO()  # torch.export.save insists on a .pt2 name; the atomic temp file has another
        torch.export.save(ep, buf)
        with open(path, "wb") as fh:
            fh.write(buf.getvalue())


def _dynamic_shapes(specs: list[Any], args: tuple, kwargs: dict) -> Any:
    from torch.export import Dim

    dynamic = [s for s in specs if s.min_shape and s.min_shape[0] != s.max_shape[0]]
    if not dynamic:
        return None
    batch = Dim("batch", min=1, max=max(s.max_shape[0] for s in dynamic))
    if kwargs:
        return {k: {0: batch} for k in kwargs}
    return tuple({0: batch} for _ in args)


# -- the Python twin -------------------------------------------------------------------------------


def prune(
    model: Any,
    method: str,
    amount: float,
    output: str | os.PathLike,
    *,
    fine_tune_data: Any = None,
    eval_data: Any = None,
    epochs: int = 0,
    teacher: Any = None,
    steps: int = 1,
    exclude: Iterable[str] = (),
    criterion: str = "l1",
    prune_first_last: bool = False,
    temperature: float = 4.0,
    alpha: float = 0.5,
    lr: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
    input_shapes: Iterable[str] = (),
    weights: Any = None,
    allow_pickle: bool = False,
    progress: bool = False,
) -> Any:
    """Prune ``model`` with ``method`` ("l1-unstructured" | "structured" | "global") and write ``output``.

    ``exclude`` patterns that match no layer raise a ``UserWarning`` (not an error). Returns the
    ``Artifact``; its ``metrics`` hold parameter counts, sparsity, raw/gzip bytes and accuracy
    before/after (with ``eval_data``), its ``extra["layers"]`` the per-layer table.
    """
    import torch

    from ptopt.compress.trainer import TrainConfig, evaluate_accuracy, train
    from ptopt.core.artifact import Artifact, atomic_path
    from ptopt.core.data import load_data
    from ptopt.core.inputspec import parse_named_shapes
    from ptopt.core.modelref import as_loaded, resolve_inputs, run_checked

    # validate everything before any long work
    config = make_config(
        method, amount, exclude=exclude, steps=steps, criterion=criterion, prune_first_last=prune_first_last
    )
    fmt = output_format(output)
    if not isinstance(epochs, int) or epochs < 0:
        raise UsageError(f"--epochs must be an integer >= 0, got {epochs!r}")
    if epochs and fine_tune_data is None:
        raise UsageError("--epochs needs --fine-tune-data (the data to fine-tune on)")
    if fine_tune_data is not None and not epochs:
        raise UsageError("--fine-tune-data needs --epochs N (N >= 1)")
    if teacher is not None and fine_tune_data is None:
        raise UsageError("--teacher distills while fine-tuning: give --fine-tune-data and --epochs too")
    train_config = TrainConfig(epochs=max(epochs, 1), lr=lr, batch_size=batch_size, seed=seed)

    loaded = as_loaded(model, weights=weights, allow_pickle=allow_pickle)
    module = loaded.require_module("pruning")
    if loaded.format not in ("eager", "pickle") or isinstance(module, torch.jit.ScriptModule):
        raise UnsupportedModelError(
            f"{loaded.ref}: pruning rewrites an eager nn.Module, and a {loaded.format} model cannot be rewritten; "
            "give the model as pkg.module:factory --weights W, zoo:NAME, or a pickled module (--allow-pickle)"
        )
    ft = load_data(fine_tune_data) if fine_tune_data is not None else None
    ev = load_data(eval_data) if eval_data is not None else None
    if ft is not None and teacher is None:
        ft.require_labels("fine-tuning with cross-entropy (or give --teacher to distill)")
    if ev is not None:
        ev.require_labels("measuring accuracy before and after pruning")
    shapes = parse_named_shapes(input_shapes) if input_shapes else ()
    if shapes or not loaded.input_specs:
        resolve_inputs(loaded, data=ft or ev, input_shapes=shapes)
    for ds, what in ((ft, "fine-tune data"), (ev, "eval data")):
        if ds is not None:
            run_checked(loaded, ds.first_batch(2).x, what)
    example = loaded.example_inputs("opt", batch=2)
    for pattern in unmatched_patterns(module, config.exclude):
        warnings.warn(f"--exclude {pattern!r} matches no layer of the model", PruneWarning, stacklevel=2)
    teacher_module = _teacher(teacher, module)

    pruner = make_pruner(config, module, example)
    original = module
    work = copy.deepcopy(module).eval()
    params_before, _ = count_parameters(original)
    history: list[dict[str, Any]] = []
    acc_before = evaluate_accuracy(original, ev) if ev is not None else None
    for k in range(1, config.steps + 1):
        work = pruner.step(work, config.amount * k / config.steps)
        if ft is not None:
            loss_fn = None
            if teacher_module is not None:
                from ptopt.compress.distill import make_distill_loss

                loss_fn = make_distill_loss(teacher_module, temperature=temperature, alpha=alpha)
            desc = f"fine-tune round {k}/{config.steps}" if config.steps > 1 else "fine-tune"
            result = train(
                work, ft, train_config, eval_data=ev, loss_fn=loss_fn, progress=progress, description=desc
            )
            if hasattr(loss_fn, "remove_hooks"):
                loss_fn.remove_hooks()
            history += [dict(h, round=k) for h in result.history]
    work, report = pruner.finish(work)
    work.eval()
    params_after, nonzero_after = count_parameters(work)
    acc_after = evaluate_accuracy(work, ev) if ev is not None else None
    raw_before, gz_before = state_dict_bytes(original)
    raw_after, gz_after = state_dict_bytes(work)

    with atomic_path(output) as tmp:
        save_dense(work, example, tmp, fmt, loaded.input_specs)
    metrics: dict[str, Any] = {
        "parameters_before": params_before,
        "parameters_after": params_after,
        "parameter_ratio": params_after / max(params_before, 1),
        "nonzero_parameters_after": nonzero_after,
        "weights_bytes_before": raw_before,
        "weights_bytes_after": raw_after,
        "weights_gzip_bytes_before": gz_before,
        "weights_gzip_bytes_after": gz_after,
    }
    if "sparsity" in report:
        metrics["sparsity"] = report["sparsity"]
    if ev is not None:
        metrics.update(
            accuracy_before=acc_before,
            accuracy_after=acc_after,
            accuracy_drop_points=100 * (acc_before - acc_after),
        )
    record = config.to_dict()
    record.update(
        fine_tune_data=_ref(fine_tune_data),
        eval_data=_ref(eval_data),
        epochs=epochs,
        teacher=_ref(teacher),
        temperature=temperature if teacher is not None else None,
        alpha=alpha if teacher is not None else None,
        train=train_config.to_dict() if epochs else None,
    )
    extra = {k: v for k, v in report.items() if k != "sparsity"}
    extra.update(method=method, fine_tune_history=history)
    art = Artifact(
        path=_path(output),
        format=fmt,
        inputs=list(loaded.input_specs),
        input_style=loaded.input_style,
        config=record,
        parent=loaded.parent_record(),
        precision=pruner.precision,
        metrics=metrics,
        extra=extra,
    )
    return art.finalize()


def _teacher(teacher: Any, module: Any) -> Any:
    if teacher is None:
        return None
    try:
        from ptopt.compress.distill import make_distill_loss  # noqa: F401
    except ImportError:
        raise UsageError(
            "--teacher needs ptopt.compress.distill.make_distill_loss, which this installation lacks"
        ) from None
    if isinstance(teacher, str) and teacher == TEACHER_SELF:
        return copy.deepcopy(module).eval()
    from ptopt.core.modelref import as_loaded

    return as_loaded(teacher).require_module("a distillation teacher").eval()


def _ref(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    return f"<{type(value).__name__}>"


def _path(output: str | os.PathLike) -> Any:
    from pathlib import Path

    return Path(output)
