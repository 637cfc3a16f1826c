"""The eager module of a pruned file, rebuilt from what its sidecar records.

``ptopt prune`` writes TorchScript (``.pt``) or an ExportedProgram (``.pt2``): files that run and deploy
with plain torch, but that no stage can train or rewrite. A pruned model is exactly what a user then
distills, quantizes or prunes again, so a stage that needs the ``nn.Module`` (``stage.load_eager``)
rebuilds it:

1. the model the sidecar names as its parent is loaded as it was given (its ``--weights`` too; a parent
   that is itself a pruned file is rebuilt the same way);
2. it is pruned again with the recorded options (structured pruning: the same channel counts; masks
   for the unstructured methods leave the shapes as they are);
3. the file's own tensors are loaded into it (fine-tuned ones included), strictly: every name and
   shape must match;
4. the rebuilt module must compute what the file computes on the file's example inputs.

Any step that fails is one clear refusal naming it. A parent the sidecar names as a Python factory
(``pkg.module:factory``) is imported and called only with ``--allow-pickle``: the file would otherwise
choose code to run (a module shipped beside it, found on the path), which no file a user hands ptopt
may do without consent. Files (checked by ``core.safety``), ``zoo:`` and ``hf:`` parents need none.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptopt.core.errors import PtoptError, UnsupportedModelError

#: the sidecar ``config.type`` of each pruning method
PRUNE_TYPES = {
    "prune-structured": "structured",
    "prune-l1-unstructured": "l1-unstructured",
    "prune-global": "global",
}
#: the recorded options structured pruning is run again with
_STRUCTURED = ("amount", "exclude", "steps", "criterion", "prune_first_last", "prune_hidden")
#: the files being rebuilt now, outermost first: a sidecar chain that comes back to one is refused
_REBUILDING: list[str] = []


def rebuildable(loaded: Any) -> bool:
    """A TorchScript / ExportedProgram file whose sidecar says it was pruned from a recorded parent."""
    art = loaded.artifact
    return (
        loaded.format in ("torchscript", "exported_program")
        and art is not None
        and bool((art.parent or {}).get("path"))
        and (art.config or {}).get("type") in PRUNE_TYPES
    )


def consent_missing(loaded: Any, allow_pickle: bool) -> str | None:
    """Why a rebuildable file is not rebuilt without ``allow_pickle`` (its parent is a Python factory the
    file names), as a clause for the refusal; None when nothing stops it."""
    source = _beside(loaded, loaded.artifact.parent["path"])
    if allow_pickle or not _runs_code(source):
        return None
    return (
        f"its eager model can be rebuilt from the model its sidecar names ({source}), a Python factory "
        "the file chooses, which is imported and called only with --allow-pickle: pass it if you trust the file"
    )


def rebuild(loaded: Any, allow_pickle: bool, for_what: str, load: Callable[..., Any]) -> Any:
    """A LoadedModel holding the eager module of the pruned file ``loaded`` (module docstring); its
    ``info["rebuilt_from"]`` names the file. ``load``: ``stage.load_eager``, for the parent (passed in:
    the stage helpers call this module). UnsupportedModelError when a step fails."""
    import dataclasses

    art = loaded.artifact
    method = PRUNE_TYPES[art.config["type"]]
    source = _beside(loaded, art.parent["path"])
    weights = art.parent.get("weights")
    weights = _beside(loaded, weights) if weights else None
    key = str(Path(loaded.path).resolve()) if loaded.path is not None else loaded.ref
    if key in _REBUILDING:  # b.pt pruned from a.pt, then a.pt overwritten by a pruning of b.pt
        raise UnsupportedModelError(_why(loaded, source, "its sidecars' parents lead back to this file"))
    _REBUILDING.append(key)
    try:
        parent = load(source, weights, allow_pickle, for_what)
    except PtoptError as e:
        raise UnsupportedModelError(_why(loaded, source, f"its parent does not load: {e}")) from None
    finally:
        _REBUILDING.pop()
    if not parent.input_specs:
        parent.input_specs, parent.input_style = list(loaded.input_specs), loaded.input_style
    try:
        module = _pruned_again(parent, method, art.config, loaded, source)
        _load_tensors(module, loaded, source)
        _same_outputs(module, loaded, source)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{e}{_changed(art.parent, source)}") from None
    info = {**loaded.info, "rebuilt_from": str(loaded.path)}
    return dataclasses.replace(loaded, format="eager", module=module, info=info)


def _beside(loaded: Any, ref: str) -> str:
    """A relative path the sidecar records (relative to where the file was made), found from here or
    beside the file (``ptopt prune model.pt -o p.pt`` in a folder, then used from another)."""
    path = Path(ref)
    if path.is_absolute() or path.exists() or loaded.path is None:
        return ref
    there = Path(loaded.path).parent / path
    return str(there) if there.exists() else ref


def _runs_code(ref: str) -> bool:
    """A parent reference that imports Python to build the model (``pkg.module:factory``), as opposed to
    a file or folder (loaded by the safe loaders) or a registered scheme (``zoo:``, ``hf:``)."""
    from ptopt.core.modelref import HF_SCHEME
    from ptopt.core.schemes import model_scheme

    if ref.startswith(HF_SCHEME):  # from_pretrained, local files only, never trust_remote_code
        return False
    return ":" in ref and model_scheme(ref) is None and not Path(ref).exists()


def _pruned_again(parent: Any, method: str, config: dict[str, Any], loaded: Any, source: str) -> Any:
    """The parent pruned as the file was: ``steps`` rounds to ``amount`` of its channels (the rounds'
    fine-tuning changes which channels go, not how many: the file's tensors come next)."""
    if method != "structured":
        return parent.module  # masks only: the shapes are the parent's
    from ptopt.compress.prune.config import PruneWarning, StructuredPruneConfig
    from ptopt.compress.prune.techniques.structured import StructuredPruner

    options = {k: config[k] for k in _STRUCTURED if config.get(k) is not None}
    options["exclude"] = tuple(options.get("exclude") or ())
    try:
        cfg = StructuredPruneConfig(**options)
        example = parent.example_inputs("opt", batch=2)
        pruner, model = StructuredPruner(cfg, parent.module, example), parent.module
        with warnings.catch_warnings():  # its notes were shown when it was pruned
            warnings.simplefilter("ignore", PruneWarning)
            for k in range(1, cfg.steps + 1):
                model = pruner.step(model, cfg.amount * k / cfg.steps)
        return model
    except PtoptError as e:
        raise UnsupportedModelError(_why(loaded, source, f"pruning it again fails: {e}")) from None


def _load_tensors(module: Any, loaded: Any, source: str) -> None:
    """The file's tensors into ``module``, strictly. TorchScript keeps the buffers a module marks
    non-persistent (BERT's ``position_ids``) in its state dict: those are the module's own already."""
    own = set(module.state_dict())
    transient = {name for name, _ in module.named_buffers()} - own
    state = {k: v for k, v in loaded.module.state_dict().items() if k not in transient}
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise UnsupportedModelError(
            _why(loaded, source, f"pruning it again does not give the file's tensors ({detail})")
        ) from None


def _same_outputs(module: Any, loaded: Any, source: str) -> None:
    """The rebuilt module against the file on the file's example inputs, by export's fp32 parity rule
    (``compress.fidelity.measure_fidelity``: each output within its tolerance, cosine 1)."""
    from ptopt.compress.fidelity import fidelity_data, measure_fidelity

    module.eval()
    fid = measure_fidelity(
        loaded.module, module, fidelity_data(example=loaded.example_inputs(batch=2)), precision="fp32"
    )
    if not fid["passed"]:
        raise UnsupportedModelError(
            _why(loaded, source, "the rebuilt model does not compute what the file computes")
        )


def _changed(parent: dict[str, Any], source: str) -> str:
    """Why a rebuild may fail, when it does: the parent file is not the one the sidecar recorded."""
    from ptopt.core.artifact import sha256_file

    path = Path(source)
    if not parent.get("sha256") or not path.is_file() or sha256_file(path) == parent["sha256"]:
        return ""
    return f"; {source} is not the file it was pruned from (its sha256 differs from the one recorded)"


def _why(loaded: Any, source: str, what: str) -> str:
    return (
        f"{loaded.ref} is a pruned {loaded.format} file: its eager model is rebuilt from the model its "
        f"sidecar names ({source}), and {what}"
    )
