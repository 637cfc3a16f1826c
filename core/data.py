"""DATA references and the one place where batching, seeding and splitting happen.

Forms (``--calib-data``, ``--train-data``, ``--eval-data``, ``--data``):

- ``file.pt``: ``torch.save({"x": X, "y": Y})`` or ``(X, Y)``; X a tensor, a tuple of tensors or a
  dict of tensors (``input_ids`` + ``attention_mask``); loaded with ``weights_only=True``.
- ``file.npz``: ``x`` (and optional ``y``); multi-input as ``x.0``, ``x.1``... or ``x.<name>``.
- ``builtin:NAME[:SPLIT]``: bundled data (see ``ptopt.core.builtin_data``), SPLIT train|test|all.
- ``package.module:function``: returns data in any in-memory form below, read exactly as the same
  object given to the Python API is (a tensor is the inputs, ``(x, y)`` a labelled pair, a list the
  batches), or a ``Dataset``.

In memory (the Python API: ``ptopt.quantize(model, "static", calib_data=x)``), ``load_data`` also takes:

- a tensor (or numpy array): the inputs ``x``, first dimension the samples;
- a tuple: ``(x, y)`` when its second item is a 1-D integer tensor with one label per sample,
  else the inputs of a multi-input model (``(input_ids, attention_mask)``);
- a dict: ``{"x": ..., "y": ...}``, else the keyword inputs of a model (``{"input_ids": ...}``);
- a ``torch.utils.data.DataLoader``, a ``torch.utils.data.Dataset`` (items ``x`` or ``(x, y)``),
  a list of batches or any iterable of batches (each a tensor, ``(x, y)`` or ``{"x", "y"}``).

A *list* is always a list of batches (a tuple is one structured input): ``[b1, b2]`` concatenates.
Batches are materialized in memory once, so every technique sees the same samples in the same order.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptopt.core.errors import DataError
from ptopt.core.inputspec import InputSpec, flatten_inputs, specs_from_example

#: ``package.module:function``, the form shared by MODEL factories and DATA functions
FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass
class Batch:
    x: Any  # tensor, tuple of tensors or dict of tensors
    y: Any = None  # tensor of labels or None


class Dataset:
    """In-memory samples: ``x`` (tensor / tuple / dict, first dim N) and optional labels ``y``."""

    def __init__(self, x: Any, y: Any = None, name: str = "data"):
        import torch

        self.name = name
        if isinstance(x, list):
            x = tuple(x)
        self.x = x
        tensors = [t for _, t in flatten_inputs(x)]
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise DataError(f"{name}: x must be a tensor, a tuple of tensors or a dict of tensors")
        n = {int(t.shape[0]) if t.dim() else -1 for t in tensors}
        if len(n) != 1 or -1 in n:
            raise DataError(f"{name}: all inputs need the same first (sample) dimension, got {sorted(n)}")
        self._n = n.pop()
        if y is not None:
            y = torch.as_tensor(y)
            if y.dim() == 0 or y.shape[0] != self._n:
                raise DataError(f"{name}: {self._n} samples but {y.shape[0] if y.dim() else 0} labels")
        self.y = y

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(t.shape)}" for k, t in flatten_inputs(self.x))
        return f"Dataset({self.name!r}, n={self._n}, {shapes}, labels={'yes' if self.has_labels else 'no'})"

    @property
    def has_labels(self) -> bool:
        return self.y is not None

    def select(self, index: Any) -> Dataset:
        """Samples at ``index`` (a tensor of indices or a slice), as a new Dataset."""
        return Dataset(_index(self.x, index), None if self.y is None else self.y[index], self.name)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        """One sample ``(x_i, y_i)`` (y_i is None without labels); lets DataLoader/samplers use a Dataset."""
        return _index(self.x, i), None if self.y is None else self.y[i]

    def take(self, n: int) -> Dataset:
        return self.select(slice(0, min(n, self._n)))

    def split(self, fraction: float, seed: int = 0) -> tuple[Dataset, Dataset]:
        """Shuffle with ``seed`` and split: the first part holds ``fraction`` of the samples."""
        import torch

        if not 0 < fraction < 1:
            raise DataError(f"split fraction must be in (0, 1), got {fraction}")
        perm = torch.randperm(self._n, generator=torch.Generator().manual_seed(seed))
        k = int(round(self._n * fraction))
        return self.select(perm[:k]), self.select(perm[k:])

    def batches(
        self,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        indices: Any = None,
    ) -> Iterator[Batch]:
        """Yield batches; ``indices`` (e.g. from a DistributedSampler) restricts and orders the samples."""
        import torch

        if batch_size <= 0:
            raise DataError(f"batch size must be positive, got {batch_size}")
        if indices is not None:
            order = torch.as_tensor(list(indices), dtype=torch.long)
        elif shuffle:
            order = torch.randperm(self._n, generator=torch.Generator().manual_seed(seed))
        else:
            order = None
        n = self._n if order is None else len(order)
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            if drop_last and stop - start < batch_size:
                break
            idx = slice(start, stop) if order is None else order[start:stop]
            yield Batch(_index(self.x, idx), None if self.y is None else self.y[idx])

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        return self._n // batch_size if drop_last else -(-self._n // batch_size)

    def first_batch(self, batch_size: int = 32) -> Batch:
        return next(self.batches(batch_size))

    def input_specs(self, max_batch: int = 64) -> list[InputSpec]:
        return specs_from_example(self.first_batch(min(len(self), 32)).x, max_batch=max_batch)

    def check_finite(self) -> None:
        """Raise DataError when a float input holds NaN or Inf (calibration would silently break)."""
        import torch

        for name, t in flatten_inputs(self.x):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise DataError(f"{self.name}: input {name!r} holds {bad} NaN/Inf value(s)")

    def require_labels(self, why: str) -> None:
        if not self.has_labels:
            raise DataError(f"{self.name} has no labels (y), which {why} needs")

    def check_labels(self, output: Any, model: str = "the model") -> None:
        """DataError when class labels cannot index ``output``'s classes: a classifier's (batch,
        classes) output and integer labels in [0, classes). Other outputs are not checked."""
        import torch

        y = self.y
        if y is None or not isinstance(output, torch.Tensor) or output.dim() != 2:
            return
        if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.dtype.is_floating_point or y.numel() == 0:
            return
        lo, hi, width = int(y.min()), int(y.max()), int(output.shape[-1])
        if lo < 0 or hi >= width:
            raise DataError(
                f"{self.name}: labels run from {lo} to {hi}, but {model} has {width} outputs "
                f"(classes 0..{width - 1}); accuracy and training need labels in that range"
            )

    def save(self, path: str | os.PathLike) -> None:
        import torch

        from ptopt.core.artifact import atomic_path

        with atomic_path(path) as tmp:
            torch.save({"x": self.x, "y": self.y} if self.y is not None else {"x": self.x}, tmp)


def _index(x: Any, idx: Any) -> Any:
    if isinstance(x, dict):
        return {k: v[idx] for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(v[idx] for v in x)
    return x[idx]


def rebatch(x: Any, n: int) -> Any:
    """The inputs ``x`` (tensor / tuple / dict) with batch ``n``, repeating its samples."""
    import torch

    def r(t):
        reps = -(-n // t.shape[0])
        return torch.cat([t] * reps)[:n]

    if isinstance(x, dict):
        return {k: r(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return tuple(r(v) for v in x)
    return r(x)


def _concat(parts: list[Any]) -> Any:
    import torch

    first = parts[0]
    if isinstance(first, dict):
        return {k: torch.cat([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        return tuple(torch.cat([p[i] for p in parts]) for i in range(len(first)))
    return torch.cat(parts)


def _is_xy_pair(b: Any) -> bool:
    """``(x, y)``: y a 1-D integer tensor with one label per sample of x (not a second float input)."""
    import torch

    if not (isinstance(b, (tuple, list)) and len(b) == 2 and isinstance(b[1], torch.Tensor)):
        return False
    y = b[1]
    if y.dim() != 1 or y.is_floating_point():
        return False
    try:
        from ptopt.core.inputspec import batch_size_of

        return batch_size_of(b[0]) == y.shape[0]
    except (IndexError, AttributeError, TypeError):
        return False


def from_batches(batches: Any, name: str) -> Dataset:
    """Materialize an iterable of batches (tensor, (x, y), {"x", "y"} or Batch) into a Dataset."""
    import torch

    xs, ys = [], []
    for b in batches:
        if isinstance(b, Batch):
            x, y = b.x, b.y
        elif isinstance(b, dict) and "x" in b:
            x, y = b["x"], b.get("y")
        elif _is_xy_pair(b):
            x, y = b
        else:
            x, y = b, None
        xs.append(tuple(x) if isinstance(x, list) else x)
        ys.append(y)
    if not xs:
        raise DataError(f"{name}: yielded no batches")
    if any(y is None for y in ys) and not all(y is None for y in ys):
        raise DataError(f"{name}: some batches have labels and some don't")
    y = None if ys[0] is None else torch.cat([torch.as_tensor(v) for v in ys])
    return Dataset(_concat(xs), y, name)


def _from_mapping(obj: dict, name: str) -> Dataset:
    if "x" not in obj:
        raise DataError(f"{name}: expected a mapping with 'x' (and optional 'y'), got keys {sorted(obj)}")
    return Dataset(obj["x"], obj.get("y"), name)


def _load_pt(path: Path) -> Dataset:
    import pickle

    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise DataError(
            f"{path}: holds more than tensors; data files load with weights_only=True "
            f"({str(e).splitlines()[0][:200]})"
        ) from None
    except Exception as e:  # noqa: BLE001 - a non-torch file raises IndexError, EOFError, RuntimeError...
        raise DataError(f"{path}: not a torch.save file of tensors ({type(e).__name__})") from None
    if isinstance(obj, dict) and "x" not in obj and obj and all(torch.is_tensor(v) for v in obj.values()):
        return Dataset(obj, None, str(path))  # keyword inputs ({"input_ids", "attention_mask"}), as in memory
    if isinstance(obj, dict):
        return _from_mapping(obj, str(path))
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        return Dataset(obj[0], obj[1], str(path))
    if isinstance(obj, torch.Tensor):
        return Dataset(obj, None, str(path))
    raise DataError(f"{path}: expected {{'x': ..., 'y': ...}} or (x, y), got {type(obj).__name__}")


def _load_npz(path: Path) -> Dataset:
    import numpy as np
    import torch

    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: torch.from_numpy(np.ascontiguousarray(z[k])) for k in z.files}
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable .npz file ({e})") from None
    y = arrays.pop("y", None)
    if "x" in arrays:
        x: Any = arrays.pop("x")
    else:
        sub = {k[2:]: v for k, v in arrays.items() if k.startswith("x.")}
        if not sub:
            raise DataError(
                f"{path}: needs an array 'x' (or 'x.0', 'x.1'... / 'x.<name>'), has {sorted(arrays)}"
            )
        x = tuple(sub[k] for k in sorted(sub, key=int)) if all(k.isdigit() for k in sub) else sub
    for _name, t in flatten_inputs(x):
        if t.dtype == torch.float64:
            x = _cast_float64(x)
            break
    return Dataset(x, y, str(path))


def _cast_float64(x: Any) -> Any:
    import torch

    def c(t):
        return t.float() if t.dtype == torch.float64 else t

    if isinstance(x, dict):
        return {k: c(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(c(v) for v in x)
    return c(x)


def import_user_module(name: str) -> Any:
    """The module of a ``pkg.module:function`` reference (a model factory, data, a metric), imported as
    ``python -m`` finds it: from the current folder too (searched last, so an installed package of the
    same name wins), with torchvision importable (``core.hf.ensure_torchvision_ops``)."""
    from ptopt.core.hf import ensure_torchvision_ops

    ensure_torchvision_ops()
    search_current_folder()
    return importlib.import_module(name)


def search_current_folder() -> None:
    """Make the current folder importable, last (an installed package of the same name wins), as
    ``python -m`` and ``python -c`` have it: for the process, since a user's module may import more of
    its own later (a pickled module's classes, a factory's lazy imports)."""
    import sys

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def _load_factory(ref: str) -> Dataset:
    module_name, _, func_name = ref.partition(":")
    try:
        module = import_user_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's module
        raise DataError(f"data {ref!r}: cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise DataError(f"data {ref!r}: {module_name!r} has no function {func_name!r}")
    try:
        obj = fn()
    except Exception as e:  # noqa: BLE001 - the user's function can fail in any way
        raise DataError(
            f"data {ref!r}: the function raised {type(e).__name__}: {str(e).strip()[:200]}"
        ) from None
    if isinstance(obj, Dataset):
        return obj
    if obj is None or isinstance(obj, (str, bytes, os.PathLike, int, float, bool)):
        raise DataError(
            f"data {ref!r}: the function returned {'None' if obj is None else type(obj).__name__}; it returns {MEMORY_FORMS}"
        )
    return _from_memory(obj, ref)  # a function's value reads as the same object given in memory


#: what in-memory data may be (and a DATA function return), for error messages
MEMORY_FORMS = (
    "a tensor (the inputs), an (x, y) tuple, a tuple or dict of input tensors, a {'x': ..., 'y': ...} "
    "dict, a torch Dataset or DataLoader, or a list of batches"
)
#: what a DATA argument may be, for error messages
DATA_FORMS = f"a DATA reference (file.pt, file.npz, builtin:digits, pkg.module:function), {MEMORY_FORMS}"


def load_data(ref: Any, name: str | None = None, *, model: Any = None) -> Dataset:
    """A Dataset from a DATA reference or in-memory data (see the module docstring).

    ``name`` labels in-memory data in messages and sidecars (references are named by themselves).
    ``model`` (the MODEL reference or the loaded model the data is for) lets a text file be read as one
    sentence per line by a Hugging Face encoder's tokenizer (``ptopt.core.sentences``).
    Raises DataError for data that is empty or of a form ptopt does not read.
    """
    if isinstance(ref, Dataset):
        return ref
    if isinstance(ref, (str, os.PathLike)):
        ds = _load_reference(ref, model)
    else:
        ds = _from_memory(ref, name or f"in-memory {_kind(ref)}")
    if len(ds) == 0:
        raise DataError(f"data {ds.name!r} is empty")
    return ds


def _kind(obj: Any) -> str:
    return {"Tensor": "tensor", "ndarray": "array"}.get(type(obj).__name__, type(obj).__name__)


def _from_memory(obj: Any, name: str) -> Dataset:
    """Tensors, tuples, dicts, torch Datasets / DataLoaders and iterables of batches → Dataset."""
    import torch

    if obj is None or isinstance(obj, (bytes, int, float, bool)):
        raise DataError(f"data of type {type(obj).__name__}: expected {DATA_FORMS}")
    if type(obj).__module__ == "numpy" and hasattr(obj, "dtype"):
        obj = _cast_float64(torch.from_numpy(obj.copy()))
    if isinstance(obj, torch.Tensor):
        return Dataset(obj, None, name)
    if isinstance(obj, dict):
        return _from_mapping(obj, name) if "x" in obj else Dataset(obj, None, name)
    if isinstance(obj, tuple):
        if _is_xy_pair(obj):
            return Dataset(*obj, name)
        _refuse_unpaired_labels(obj, name)
        return Dataset(obj, None, name)
    if isinstance(obj, torch.utils.data.Dataset) and not isinstance(obj, torch.utils.data.IterableDataset):
        if not hasattr(obj, "__len__"):
            raise DataError(f"{name}: a map-style torch Dataset needs __len__")
        obj = torch.utils.data.DataLoader(obj, batch_size=256, shuffle=False)
    if not hasattr(obj, "__iter__"):
        raise DataError(f"data of type {type(obj).__name__}: expected {DATA_FORMS}")
    try:
        return from_batches(obj, name)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's iterable or collate can fail in any way
        hint = "; a list is a list of batches: give (x, y) as a tuple" if isinstance(obj, list) else ""
        raise DataError(
            f"{name}: cannot read batches from it ({type(e).__name__}: {str(e).strip()[:200]}){hint}"
        ) from None


def _refuse_unpaired_labels(obj: tuple, name: str) -> None:
    """``(x, y)`` with y integer labels (1-D) but not one per sample of x: neither a labelled pair nor
    two inputs of one model (their sample counts differ too), so one clear DataError."""
    import torch

    if (
        len(obj) != 2
        or not isinstance(obj[1], torch.Tensor)
        or obj[1].dim() != 1
        or obj[1].is_floating_point()
    ):
        return
    try:
        from ptopt.core.inputspec import batch_size_of

        n = batch_size_of(obj[0])
    except (IndexError, AttributeError, TypeError):
        return
    raise DataError(
        f"{name}: an (x, y) pair needs one label per sample: x holds {n} samples, y {obj[1].shape[0]} labels "
        f"(accepted: {MEMORY_FORMS})"
    )


#: suffixes of the files a DATA reference names (tensors, arrays, token ids, text)
DATA_SUFFIXES = (".pt", ".pth", ".npz", ".npy", ".txt", ".tsv", ".text", ".md")
_NO_FILE = "no such file (forms: file.pt, file.npz, builtin:digits, pkg.module:function)"


def refuse_missing_file(**refs: Any) -> None:
    """DATA references (``calib_data=...``) that look like files (a data suffix or a path separator)
    and are not there: one DataError now, before a stage loads its model (seconds for a Hugging Face
    factory) only to find the data missing. Names the option as the user gave it (flag or keyword)."""
    from ptopt.core.options import option_name

    for keyword, ref in refs.items():
        if not isinstance(ref, (str, os.PathLike)):
            continue
        text = os.fspath(ref)
        if text.startswith("builtin:") or FACTORY_RE.match(text) or Path(text).exists():
            continue
        if Path(text).suffix.lower() in DATA_SUFFIXES or "/" in text or os.sep in text:
            raise DataError(f"{option_name(keyword)} {text!r}: {_NO_FILE}")


def _load_reference(ref: str | os.PathLike, model: Any = None) -> Dataset:
    """A DATA reference: builtin:NAME, a .pt / .npz file, or pkg.module:function; a text file for a
    Hugging Face encoder ``model``: one sentence per line."""
    from ptopt.core.text import is_text_ref

    text = str(ref)
    if is_text_ref(text):
        from ptopt.core.sentences import read_sentences, sentence_folder

        folder = sentence_folder(model) if model is not None and not text.startswith("builtin:") else None
        if folder is not None:
            art = getattr(model, "artifact", None)
            takes = [s.name for s in art.inputs] if art is not None and art.inputs else None
            x, name = read_sentences(text, folder, getattr(model, "module", None), takes)
            return Dataset(x, name=name)
        raise DataError(
            f"data {text!r} is text: a language model reads it through its tokenizer (quantize --mode "
            "weight-only, validate's perplexity, distill), a Hugging Face encoder or classifier folder "
            "(hf:DIR, with its tokenizer) one sentence per line; this step takes tensors for this model: "
            "token ids in a .pt (int64), or another DATA form (file.pt, file.npz, builtin:digits, "
            "pkg.module:function)"
        )
    if text.startswith("builtin:"):
        from ptopt.core.builtin_data import load_builtin

        x, y, name = load_builtin(text)
        return Dataset(x, y, name)
    path = Path(text)
    if path.exists():
        if path.is_dir():
            raise DataError(f"{path} is a folder; give a .pt or .npz file")
        return _load_npz(path) if path.suffix == ".npz" else _load_pt(path)
    if FACTORY_RE.match(text):
        return _load_factory(text)
    raise DataError(f"data {text!r}: {_NO_FILE}")


# -- held-out data -----------------------------------------------------------------------------------

#: the share of the eval data kept aside (seeded split): what a search fits or chooses on the rest is
#: accepted, and reported, on these samples it never saw (optimize's candidates, quantize's search)
HELDOUT_FRACTION = 0.5
SPLIT_SEED = 0
#: fewer eval samples than this: no held-out split (said where the figures are reported)
MIN_SPLIT_SAMPLES = 32


def split_eval(evald: Any) -> tuple[Any, Any | None, dict[str, Any]]:
    """(samples the search chooses on, held-out samples it accepts on, the split's record): a seeded
    split of the eval data (``HELDOUT_FRACTION`` held out); too small a set is not split."""
    if len(evald) < MIN_SPLIT_SAMPLES:
        note = f"not split: {len(evald)} eval samples < {MIN_SPLIT_SAMPLES}; the figures are the search's own"
        return evald, None, {"search_samples": len(evald), "heldout_samples": 0, "note": note}
    select, heldout = evald.split(1 - HELDOUT_FRACTION, seed=SPLIT_SEED)
    return select, heldout, {
        "search_samples": len(select), "heldout_samples": len(heldout), "seed": SPLIT_SEED,
        "of": getattr(evald, "name", "eval data"),
    }  # fmt: skip
