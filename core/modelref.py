"""MODEL references: the one way every command turns its MODEL argument into something to run.

- a model file, in any format of the table ``ptopt.core.formats`` (``model.pt`` TorchScript or a
  pickled ``nn.Module``, ``model.pt2`` ExportedProgram or AOTInductor package, ``model.onnx``, ...):
  its trusted sidecar's ``format``, else the first format that recognizes the file, loads it. Formats
  whose loading runs code from the file (a pickled module, compiled native code) load only with
  ``allow_pickle=True``.
- ``package.module:factory`` with optional ``weights`` (state_dict ``.pt`` or ``.safetensors``);
  without weights the factory's fresh model is used (e.g. a student to train).
- ``SCHEME:NAME``: a scheme a stage registered (``ptopt.core.schemes``); ``zoo:NAME``, a model of
  the reference zoo trained on bundled data (shipped weights or trained on first use), cached, is
  registered at ``import ptopt``.

State dicts are always read with ``weights_only=True``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path
from typing import Any

from ptopt.core.artifact import Artifact
from ptopt.core.data import FACTORY_RE, import_user_module
from ptopt.core.errors import ModelLoadError, UnsupportedModelError, UsageError, WeightsMismatchError
from ptopt.core.formats import file_suffixes, find_format, formats, sniff_file
from ptopt.core.inputspec import InputSpec, specs_from_example
from ptopt.core.safety import check_model_file
from ptopt.core.schemes import ModelScheme, model_scheme, model_scheme_forms


@dataclasses.dataclass
class LoadedModel:
    """A loaded MODEL reference. ``module`` is None only for formats without one (ONNX)."""

    ref: str
    format: str  # eager | torchscript | exported_program | aoti_package | onnx | pickle
    module: Any = None
    path: Path | None = None
    artifact: Artifact | None = None
    input_specs: list[InputSpec] = dataclasses.field(default_factory=list)
    input_style: str = "positional"
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def require_module(self, for_what: str):
        if self.module is None:
            raise ModelLoadError(self._no_module(for_what))
        return self.module

    def _no_module(self, for_what: str) -> str:
        """Why a model of another runtime cannot be ``for_what``, and the command that does it: the
        PyTorch model it was made from (its sidecar's parent), and for quantization the export that
        writes an int8 file of that runtime."""
        from ptopt.core.formats import find_format, with_article

        row = find_format(self.format)
        label = row.label if row is not None else self.format
        made = ((self.artifact.parent if self.artifact else None) or {}).get("path")
        source = f"the PyTorch model it was made from ({made})" if made else "the PyTorch model it came from"
        msg = f"{self.ref}: {with_article(label)} model cannot be used for {for_what}; give {source}"
        if for_what == "quantization" and row is not None and row.target and "int8" in row.converts:
            msg += (
                f"; an int8 {label} file is written by ptopt export {made or 'MODEL'} --target {row.target} "
                "--precision int8 --data CALIB"
            )
        return msg

    @property
    def size_bytes(self) -> int | None:
        if self.artifact is not None:
            return self.artifact.size_bytes
        if self.path is not None and self.path.is_file():
            from ptopt.core.formats import find_format

            row = find_format(self.format)  # all of its files: an IR's .bin, ONNX external data
            files = row.files(self.path) if row is not None else [self.path]
            return sum(f.stat().st_size for f in files if f.is_file())
        return None

    def parent_record(self) -> dict[str, Any]:
        """What an artifact made from this model records as its parent (reloadable with load_model)."""
        from ptopt.core.artifact import sha256_file

        # a pruned file whose eager module was rebuilt (``compress.rebuild``) is recorded as the file it is
        fmt = self.artifact.format if self.info.get("rebuilt_from") and self.artifact else self.format
        rec: dict[str, Any] = {"path": str(self.path) if self.path else self.ref, "format": fmt}
        if self.path is not None and self.path.is_file():
            # a sidecar that was trusted at load time was checked against these very bytes
            trusted = self.artifact.sha256 if self.artifact is not None else ""
            rec["sha256"] = trusted or sha256_file(self.path)
        if self.info.get("weights"):
            rec["weights"] = self.info["weights"]
        return rec

    def example_inputs(self, which: str = "opt", batch: int | None = None):
        from ptopt.core.inputspec import make_inputs

        require_input_specs(self)
        return make_inputs(self.input_specs, self.input_style, which=which, batch=batch)


def as_loaded(
    model: Any, weights: str | os.PathLike | None = None, allow_pickle: bool = False
) -> LoadedModel:
    """Accept what a Python twin is given: a MODEL reference, an nn.Module, a LoadedModel, or another
    stage's Result (its model in memory, its artifact's facts, the model it was made from)."""
    from ptopt.core.result import Result

    if weights is not None and not isinstance(model, (str, os.PathLike)):  # they were dropped unsaid
        raise UsageError(
            f"weights {weights} go with a MODEL reference (pkg.module:factory); a built "
            f"{type(model).__name__} takes them itself: model.load_state_dict(torch.load(path))"
        )
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, Result):
        return _from_result(model)
    import torch

    if isinstance(model, torch.nn.Module):
        specs, style = _declared_inputs(model)
        return LoadedModel(
            f"<{type(model).__name__}>", "eager", model.eval(), input_specs=specs, input_style=style
        )
    return load_model(model, weights=weights, allow_pickle=allow_pickle)


def _from_result(res: Any) -> LoadedModel:
    """A stage's Result as a loaded model: ``res.model`` as it runs here, the saved artifact's (else the
    template's) format, specs and precision, and ``info["source"]``: the model it was made from."""
    art = res.artifact or res.template
    return LoadedModel(
        str(art.path) if res.artifact is not None else f"<{art.precision} {art.format} Result, not saved>",
        art.format,
        res.model,
        path=art.path if res.artifact is not None else None,
        artifact=art,
        input_specs=list(art.inputs),
        input_style=art.input_style,
        info={"source": res.source} if res.source is not None else {},
    )


#: ``rebuilder(loaded, allow_pickle, for_what) -> (LoadedModel | None, why_not)``: the eager module of a
#: file that runs as it is but was made from a model ptopt can make again (a pruned TorchScript / .pt2:
#: ``compress.rebuild``); registered at ``import ptopt`` (``ptopt/_schemes.py``): core imports no stage
_EAGER_REBUILDERS: list[Any] = []


def register_eager_rebuilder(rebuilder: Any) -> None:
    """Let :func:`rebuilt_eager` ask ``rebuilder`` (see ``_EAGER_REBUILDERS``); registering it twice is once."""
    if rebuilder not in _EAGER_REBUILDERS:
        _EAGER_REBUILDERS.append(rebuilder)


def rebuilt_eager(loaded: LoadedModel, allow_pickle: bool, for_what: str) -> tuple[LoadedModel, str]:
    """``loaded`` with its eager module where a registered rebuilder makes one, and ``""``; else ``loaded``
    as it is and why it was not rebuilt (a clause; ``""`` when no rebuilder takes it). A rebuild that fails
    (``PtoptError``) is such a why: the file itself still runs."""
    from ptopt.core.errors import PtoptError

    for rebuilder in _EAGER_REBUILDERS:
        try:
            eager, why = rebuilder(loaded, allow_pickle, for_what)
        except PtoptError as e:
            return loaded, str(e)
        if eager is not None or why:
            return (eager if eager is not None else loaded), why
    return loaded, ""


#: ``hf:DIR``: a Hugging Face model folder (a folder with config.json loads the same without it)
HF_SCHEME = "hf:"


def load_model(
    ref: str | os.PathLike, weights: str | os.PathLike | None = None, allow_pickle: bool = False
) -> LoadedModel:
    """Load a MODEL reference (see the module docstring)."""
    from ptopt.core import progress

    with progress.step(f"loading {ref}", announce=False):  # a line only when it takes long (a large LM)
        return _load_model(ref, weights, allow_pickle)


def _load_model(ref: str | os.PathLike, weights: str | os.PathLike | None, allow_pickle: bool) -> LoadedModel:
    text = str(ref)
    if text.startswith(HF_SCHEME):
        return _load_hf(Path(text[len(HF_SCHEME) :]), weights, allow_pickle)
    found = model_scheme(text)
    if found is not None:
        return _load_scheme(text, *found, weights)
    path = Path(text)
    if path.exists():
        if weights is not None:
            raise ModelLoadError(
                f"--weights goes with a pkg.module:factory model; {path} is already a model file"
            )
        return _load_file(path, allow_pickle)
    if FACTORY_RE.match(text):
        return _load_factory(text, weights)
    files = [f"model{s}" for s in file_suffixes()]
    forms = ", ".join([*files, "pkg.module:factory", *model_scheme_forms(), f"{HF_SCHEME}DIR"])
    raise ModelLoadError(f"model {text!r}: no such file (forms: {forms})")


def _load_scheme(text: str, scheme: ModelScheme, name: str, weights: Any) -> LoadedModel:
    """``SCHEME:NAME`` through the loader a stage registered for SCHEME (see ``ptopt.core.schemes``)."""
    if weights is not None:
        raise ModelLoadError(f"--weights goes with a pkg.module:factory model, not with {scheme.scheme}:NAME")
    module, specs, style = scheme.loader(name)
    return LoadedModel(
        text, "eager", module.eval(), input_specs=specs, input_style=style, info={scheme.scheme: name}
    )


def _load_hf(path: Path, weights: Any, allow_pickle: bool) -> LoadedModel:
    """``hf:DIR``: a Hugging Face model folder (``ptopt.core.hf``), or ptopt's weight-only one."""
    from ptopt.core.hf import is_hf_dir

    if weights is not None:
        raise ModelLoadError(f"--weights goes with a pkg.module:factory model, not with {HF_SCHEME}DIR")
    if not is_hf_dir(path):
        raise ModelLoadError(f"{HF_SCHEME}{path}: not a Hugging Face model folder (no {path}/config.json)")
    return _load_file(path, allow_pickle, f"{HF_SCHEME}{path}")


def _load_hf_module(ref: str, path: Path, allow_pickle: bool) -> LoadedModel:
    """A Hugging Face folder holding no causal language model (an encoder, a classifier, a vision or
    audio model: ``core.hf.is_lm_folder``): its module, in memory, as a factory's would be (format
    ``eager``; inputs implied by its config unless data or shapes say more)."""
    from ptopt.core.hf import load_hf_module

    model = load_hf_module(path, allow_pickle)
    specs, style = _declared_inputs(model)
    return LoadedModel(ref, "eager", model, None, None, specs, style, {"hf_model": str(path)})


def _load_file(path: Path, allow_pickle: bool, ref: str | None = None) -> LoadedModel:
    """A model file through its format's row (``ptopt.core.formats``): the trusted sidecar's format,
    else the first format whose ``sniff`` recognizes the file. A folder is a model only as a format
    that is a folder (a Hugging Face model folder), or as the module of a Hugging Face folder that
    holds no language model (:func:`_load_hf_module`)."""
    if path.is_dir():
        from ptopt.core.hf import is_hf_dir, is_lm_folder

        art = Artifact.maybe_load(path)
        if art is None and is_hf_dir(path) and not is_lm_folder(path):
            return _load_hf_module(ref or str(path), path, allow_pickle)
        folders = [f for f in formats() if f.folder and f.sniff(path)]
        fmt = find_format(art.format) if art is not None else (folders[0] if folders else None)
        if fmt is None:
            raise ModelLoadError(
                f"{path} is a folder, not a model file (nor a Hugging Face folder with config.json)"
            )
        return _checked_on_this_cpu(path, art, fmt.load(path, art, allow_pickle))
    check_model_file(path, allow_pickle)  # before torch reads it: a .pt2 may ask torch to run code
    art = Artifact.maybe_load(path)
    fmt = find_format(art.format) if art is not None else sniff_file(path)
    if fmt is None:
        raise ModelLoadError(
            f"{path}: not a PyTorch model file (neither a TorchScript archive nor torch.save output) nor "
            f"another model file ptopt knows ({', '.join(file_suffixes())})"
        )
    return _checked_on_this_cpu(path, art, fmt.load(path, art, allow_pickle))


def _checked_on_this_cpu(path: Path, art: Any, loaded: LoadedModel) -> LoadedModel:
    """An artifact checked on a CPU whose int8-relevant flags differ from this one's: one line on stderr
    (once per file) naming the difference and the ``ptopt validate --isa`` command that re-checks it;
    ``loaded.info["cpu_note"]`` keeps it."""
    from ptopt.core.isa import announce, check_moved

    line = check_moved(path, art)
    if line:
        loaded.info["cpu_note"] = line
        announce(path, line)
    return loaded


def _declared_inputs(module: Any) -> tuple[list[InputSpec], str]:
    """Specs from the model's own ``example_inputs()`` method, when it has one."""
    from ptopt.core.input_infer import declared_inputs

    return declared_inputs(module)


def require_input_specs(
    loaded: LoadedModel, data_hint: str = "--data", flag: str = "--input-shape"
) -> list[InputSpec]:
    """``loaded.input_specs``; when none is known, the ones the model implies (a Hugging Face
    model's config, see ``ptopt.core.input_infer.implied_inputs``); else a UsageError that ends in
    a shape to paste, built from the first layer (``flag``: the command's shape option)."""
    from ptopt.core.input_infer import implied_inputs, input_shape_unknown

    if not loaded.input_specs and loaded.module is not None:
        specs, style = implied_inputs(loaded.module)
        if specs:
            loaded.input_specs, loaded.input_style = specs, style
    if not loaded.input_specs:
        raise input_shape_unknown(loaded.ref, loaded.module, data_hint, flag)
    return loaded.input_specs


def _load_factory(ref: str, weights: str | os.PathLike | None) -> LoadedModel:
    import torch

    from ptopt.core.quiet import quiet_imports

    module_name, _, attr = ref.partition(":")
    try:
        with quiet_imports():  # a transformers model imports torchao as it is built: its notices
            mod = import_user_module(module_name)
    except Exception as e:  # noqa: BLE001 - any failure inside the user's module
        raise ModelLoadError(
            f"model {ref!r}: cannot import {module_name!r}: {type(e).__name__}: {e}"
        ) from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise ModelLoadError(f"model {ref!r}: {module_name!r} has no callable {attr!r}")
    try:
        with quiet_imports():
            model = factory()
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"model {ref!r}: the factory failed: {type(e).__name__}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            f"model {ref!r}: the factory returned a {type(model).__name__}, not an nn.Module"
        )
    info: dict[str, Any] = {"factory": ref}
    if weights is not None:
        load_weights(model, weights)
        info["weights"] = str(weights)
    specs, style = _declared_inputs(model)
    return LoadedModel(ref, "eager", model.eval(), None, None, specs, style, info)


def read_state_dict(path: str | os.PathLike) -> dict[str, Any]:
    """A state_dict from ``.safetensors`` or a torch ``.pt``, never unpickling code."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"weights {path}: no such file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as e:  # noqa: BLE001
            raise ModelLoadError(f"weights {path}: not a readable safetensors file: {e}") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ModelLoadError(
            f"weights {path}: holds more than tensors (a pickled module?); save model.state_dict()"
        ) from None
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"weights {path}: not a torch.save file: {str(e).splitlines()[0]}") from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ModelLoadError(f"weights {path}: expected a state_dict, got {type(obj).__name__}")
    return obj


def load_weights(model: Any, weights: str | os.PathLike) -> None:
    """Load a state_dict strictly, naming mismatching keys and shapes when it doesn't fit."""
    state = read_state_dict(weights)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shape_bad = [
        f"{k} {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(set(own) & set(state))
        if hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shape_bad:
        parts = []
        if missing:
            parts.append("missing keys: " + _few(missing))
        if unexpected:
            parts.append("unexpected keys: " + _few(unexpected))
        if shape_bad:
            parts.append("shape mismatch: " + _few(shape_bad))
        raise WeightsMismatchError(f"weights {weights} don't fit the model: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def _few(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")


def resolve_inputs(loaded: LoadedModel, data: Any = None, input_shapes: Any = ()) -> LoadedModel:
    """Settle ``loaded.input_specs``: ``--input-shape`` first, then the data, then what the model declares.

    ``input_shapes`` is ``[(name | None, shape), ...]`` (see ``parse_named_shapes``); a given shape's
    first dimension is the batch (dynamic from 1 to 64). Specs from data get the token inputs' ranges
    of the model (its vocabulary: ``token_ranges``), not the data's. A shape's dtype is the one written
    (``input_ids=1x32:int64``), else the model's declared one for that input, else int64 for an input
    that an ``nn.Embedding`` receives (with ids below its ``num_embeddings``) or is named
    ``attention_mask`` (0/1, as Hugging Face tokenizers make it), else float32. ``data`` is a Dataset.
    """
    from ptopt.core.inputspec import input_style

    if input_shapes:
        loaded.input_specs, untyped = _specs_from_shapes(loaded, list(input_shapes))
        if any(n for n, _ in input_shapes):
            loaded.input_style = "keyword"
        _infer_token_inputs(loaded, untyped)
    elif data is not None:
        from ptopt.core.input_infer import token_ranges

        x = data.first_batch(min(len(data), 32)).x
        loaded.input_style = input_style(x)
        loaded.input_specs = token_ranges(loaded.module, specs_from_example(x), loaded.input_style)
    return loaded


def _specs_from_shapes(loaded: LoadedModel, input_shapes: list) -> tuple[list[InputSpec], set[str]]:
    """One spec per given shape: its name and dtype, else the declared input's (by name, else by
    order); and the names whose dtype neither gave (float32 for now)."""
    from ptopt.core.inputspec import DEFAULT_MAX_BATCH, dtype_of

    known = loaded.input_specs
    by_name = {s.name: s for s in known}
    specs, untyped = [], set()
    for i, (name, shape) in enumerate(input_shapes):
        base = by_name.get(name) if name else (known[i] if i < len(known) else None)
        name = name or (base.name if base else ("input" if len(input_shapes) == 1 else f"input_{i}"))
        if dtype_of(shape) is None and base is None:
            untyped.add(name)
        dtype = dtype_of(shape) or (base.dtype if base else "float32")
        vr = base.value_range if base and base.dtype == dtype else None
        specs.append(
            InputSpec.static(name, shape, dtype, value_range=vr).with_batch(
                1, shape[0], max(DEFAULT_MAX_BATCH, shape[0])
            )
        )
    return specs, untyped


def _infer_token_inputs(loaded: LoadedModel, untyped: set[str]) -> None:
    """Integer dtype and id range for given shapes that nothing typed (see ``resolve_inputs``)."""
    loaded.input_specs = typed_token_inputs(loaded.module, loaded.input_specs, loaded.input_style, untyped)


def typed_token_inputs(module: Any, specs: list[InputSpec], style: str, untyped: set[str]) -> list[InputSpec]:
    """``specs`` with the token inputs typed: an input that an ``nn.Embedding`` receives becomes int64
    ids below its ``num_embeddings`` (when ``untyped``: no shape or declaration gave its dtype), an
    untyped ``attention_mask`` int64 0/1 (as Hugging Face tokenizers make it). Every stage that builds
    specs from shapes alone (``--input-shape``, ``--min/--opt/--max-shape``) types them this way."""
    from ptopt.core.input_infer import embedding_inputs

    unranged = {s.name for s in specs if s.dtype != "bool" and not s.is_float and not s.value_range}
    if not (untyped or unranged) or module is None:
        return list(specs)
    vocab = embedding_inputs(module, specs, style, untyped)
    out = []
    for s in specs:
        if s.name in vocab and (s.name in untyped or s.name in unranged):
            dtype = "int64" if s.name in untyped else s.dtype
            s = dataclasses.replace(s, dtype=dtype, value_range=(0, vocab[s.name]))
        elif s.name == "attention_mask" and s.name in untyped:
            s = dataclasses.replace(s, dtype="int64")  # random 0/1 masks: padding must not be traced away
        out.append(s)
    return out


def expected_input(loaded: LoadedModel) -> str | None:
    """What the model expects, for error messages: its specs, or what its first layer takes."""
    if loaded.input_specs:
        return ", ".join(s.describe() for s in loaded.input_specs)
    first = _first_layer(loaded.module)
    return None if first is None else f"{first[1]} input {first[0]} (first layer {first[2]})"


#: what a first layer takes, by its attribute: (the words for it, the input dimension that holds it)
_FIRST_LAYER = {
    "in_channels": ("channels", 1),
    "in_features": ("features", -1),
    "input_size": ("features", -1),
    "num_embeddings": ("token ids below", None),
}


def _first_layer(module: Any) -> tuple[str, int, str, int | None] | None:
    """(what, how many, layer type, input dimension) of the first layer that says what it takes."""
    if module is None:
        return None
    for _, m in module.named_modules():
        for attr, (what, dim) in _FIRST_LAYER.items():
            v = getattr(m, attr, None)
            if isinstance(v, int):
                return what, v, type(m).__name__, dim
    return None


def _first_layer_fed(loaded: LoadedModel, given: list) -> bool:
    """Whether the batch already gives the first layer what ``expected_input`` would name (16 channels
    at dimension 1 of a Conv1d's input): then naming it explains nothing about the failure."""
    first = _first_layer(loaded.module) if not loaded.input_specs else None
    if first is None or first[3] is None or len(given) != 1:
        return False
    shape = tuple(given[0][1].shape)
    return len(shape) > abs(first[3]) and shape[first[3]] == first[1]


#: how torchvision's error starts when a model calls its C++ ops and they could not load
TORCHVISION_OPS_MISSING = "Couldn't load custom C++ ops"


def run_checked(loaded: LoadedModel, x: Any, what: str = "data") -> Any:
    """Run one batch through the model; a failure becomes a ShapeMismatchError naming expected vs got."""
    import torch

    from ptopt.core.errors import ShapeMismatchError
    from ptopt.core.inputspec import bind_inputs, call_model, flatten_inputs, format_shape

    got = ", ".join(
        f"{n}: {format_shape(t.shape)} {str(t.dtype).replace('torch.', '')}" for n, t in flatten_inputs(x)
    )
    module = loaded.require_module("running a batch")
    try:  # not inference_mode: a lazy layer or cache built on this first call must stay a plain tensor
        with torch.no_grad():
            return call_model(module, bind_inputs(x, loaded.input_specs, loaded.input_style))
    except (RuntimeError, TypeError, ValueError, IndexError, AssertionError, AttributeError) as e:
        # AttributeError: an input the model needs came as None ('NoneType' object has no attribute 'shape')
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        reason += _not_given(module, x) if isinstance(e, AttributeError) else ""
        if reason.startswith(TORCHVISION_OPS_MISSING):
            raise UnsupportedModelError(
                f"model {loaded.ref} calls torchvision's C++ ops (nms, roi_align: detection models), which "
                "this torchvision cannot load beside this torch (PyPI's torchvision is a CUDA build; "
                "docs/compat.md): install the torchvision built for this torch; classification and "
                "segmentation models need none of them"
            ) from None
        expected = expected_input(loaded)
        # specs guessed from this very batch say nothing the model's own error does not ("expected
        # [1..64]x3x32x32, got 8x3x32x32" where the model needs 64x64): only what was given is named
        given = flatten_inputs(x)
        echo = (bool(loaded.input_specs) and _specs_echo(loaded.input_specs, given)) or _first_layer_fed(
            loaded, given
        )
        raise ShapeMismatchError(
            f"{what} does not fit model {loaded.ref}: {reason[:300]}",
            expected=None if echo else expected,
            got=got,
        ) from None


def _not_given(module: Any, x: Any) -> str:
    """`` (its forward also takes a, b: not given)`` for a model that failed on an input it did not get."""
    import inspect

    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return ""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    given = set(x) if isinstance(x, dict) else set()
    rest = [p.name for p in params if p.kind in kinds and p.name not in given][:4]
    return f" (its forward also takes {', '.join(rest)}, ...: not given)" if given and rest else ""


def _specs_echo(specs: Any, given: list) -> bool:
    """Whether every spec's sample shape (past the batch) and dtype are those of the batch ``given``."""
    if len(specs) != len(given):
        return False
    return all(
        tuple(s.opt_shape[1:]) == tuple(t.shape[1:]) and str(t.dtype) == f"torch.{s.dtype}"
        for s, (_, t) in zip(specs, given, strict=True)
    )
