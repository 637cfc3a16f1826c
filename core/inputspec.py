"""InputSpec: the one description of a model input that every backend's dynamic shapes come from.

``InputSpec(name, min_shape, opt_shape, max_shape, dtype)`` becomes ONNX symbolic dims,
``torch.export.Dim``s and TensorRT ``Input(min_shape, opt_shape, max_shape)``. A model takes either
positional tensors (``model(x)`` / ``model(*xs)``) or keyword tensors (``model(**{"input_ids": ...})``);
``input_style`` says which. Torch is imported lazily: the CLI parses shapes without it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ptopt.core.errors import ShapeMismatchError, UsageError

Shape = tuple[int, ...]

#: Default upper bound of an inferred dynamic batch dimension.
DEFAULT_MAX_BATCH = 64

_FLOAT_DTYPES = {"float32", "float16", "bfloat16", "float64"}
_INT_DTYPES = {"int64", "int32", "int8", "uint8", "bool"}


#: what a user may write after ``:`` in a shape → the dtype name InputSpec uses
DTYPE_ALIASES = {
    **{d: d for d in sorted(_FLOAT_DTYPES | _INT_DTYPES)},
    "float": "float32",
    "half": "float16",
    "double": "float64",
    "long": "int64",
    "int": "int32",
}


class TypedShape(tuple):
    """A shape that also says its dtype (``1x32:int64``); equal to, and used as, the plain tuple.

    ``dtype`` is None when the text gave none: the model's declared dtype, or inference (an input
    whose first consumer is an ``nn.Embedding`` is integer), decides.
    """

    dtype: str | None

    def __new__(cls, dims: Iterable[int], dtype: str | None = None) -> TypedShape:
        obj = super().__new__(cls, dims)
        obj.dtype = dtype
        return obj

    def __getnewargs__(self) -> tuple:
        return (tuple(self), self.dtype)


def batch_list(value: Any) -> tuple[int, ...]:
    """``"1,32"`` / ``[1, 32]`` / ``()`` as a sorted tuple of positive batch sizes (UsageError otherwise)."""
    if isinstance(value, int):
        value = [value]
    items = value.split(",") if isinstance(value, str) else list(value or ())
    try:
        batches = sorted({int(str(b).strip()) for b in items if str(b).strip()})
    except (TypeError, ValueError):
        raise UsageError(f"--static-batch {value!r}: give batch sizes as integers, e.g. 1,32") from None
    if any(b <= 0 for b in batches):
        raise UsageError(f"--static-batch {value!r}: batch sizes must be positive")
    return tuple(batches)


def dtype_of(shape: Sequence[int]) -> str | None:
    """The dtype a shape was given with (``1x32:int64`` → ``"int64"``), None for a plain one."""
    return getattr(shape, "dtype", None)


def parse_dtype(text: str, where: str = "") -> str:
    """``"int64"`` (or ``long``, ``half``...) → the InputSpec dtype name; UsageError naming the choices."""
    name = str(text).strip().lower().removeprefix("torch.")
    if name not in DTYPE_ALIASES:
        ctx = f" in {where!r}" if where else ""
        raise UsageError(
            f"bad dtype {text!r}{ctx}: use one of {', '.join(sorted(_FLOAT_DTYPES | _INT_DTYPES))}, "
            f"e.g. input_ids=1x128:int64"
        )
    return DTYPE_ALIASES[name]


def parse_shape(text: str) -> TypedShape:
    """``"1x1x32x32"`` (or ``"1,1,32,32"``) → ``(1, 1, 32, 32)``; ``"1x32:int64"`` also sets ``.dtype``."""
    dims, sep, dtype = str(text).strip().partition(":")
    parts = [p for p in re.split(r"[x,×]", dims.strip().lower()) if p != ""]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(
            f"bad shape {text!r}: write dimensions separated by 'x', e.g. 1x3x224x224 (or 1x128:int64)"
        ) from None
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"bad shape {text!r}: dimensions must be positive integers, e.g. 1x3x224x224")
    return TypedShape(shape, parse_dtype(dtype, text) if sep else None)


def format_shape(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def parse_named_shapes(values: Iterable[str]) -> list[tuple[str | None, TypedShape]]:
    """``["1x3x32x32"]`` or ``["input_ids=1x128:int64", "attention_mask=1x128"]`` → [(name|None, shape)].

    Each shape is a :class:`TypedShape`: ``dtype_of(shape)`` is the dtype written after ``:``, or None.
    """
    out = []
    for v in values:
        name, sep, shape = str(v).rpartition("=")
        out.append((name.strip() if sep else None, parse_shape(shape)))
    return out


@dataclasses.dataclass(frozen=True)
class InputSpec:
    name: str
    min_shape: Shape
    opt_shape: Shape
    max_shape: Shape
    dtype: str = "float32"
    #: [low, high) of values for integer inputs (token ids), used to make sample inputs.
    value_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for field in ("min_shape", "opt_shape", "max_shape"):
            object.__setattr__(self, field, tuple(int(d) for d in getattr(self, field)))
        if self.value_range is not None:
            object.__setattr__(self, "value_range", tuple(self.value_range))
        if self.dtype not in _FLOAT_DTYPES | _INT_DTYPES:
            raise UsageError(f"input {self.name!r}: unsupported dtype {self.dtype!r}")
        ranks = {len(self.min_shape), len(self.opt_shape), len(self.max_shape)}
        if len(ranks) != 1:
            raise UsageError(
                f"input {self.name!r}: min/opt/max shapes must have the same rank, got "
                f"{format_shape(self.min_shape)}, {format_shape(self.opt_shape)}, {format_shape(self.max_shape)}"
            )
        for i, (lo, mid, hi) in enumerate(zip(self.min_shape, self.opt_shape, self.max_shape, strict=False)):
            if lo <= 0:
                raise UsageError(f"input {self.name!r}: dimension {i} must be positive, got {lo}")
            if lo > mid:
                raise UsageError(f"input {self.name!r}: min > opt at dimension {i} ({lo} > {mid})")
            if mid > hi:
                raise UsageError(f"input {self.name!r}: opt > max at dimension {i} ({mid} > {hi})")

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def static(cls, name: str, shape: Sequence[int], dtype: str = "float32", **kw: Any) -> InputSpec:
        return cls(name, tuple(shape), tuple(shape), tuple(shape), dtype, **kw)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InputSpec:
        vr = data.get("value_range")
        return cls(
            data["name"],
            tuple(data["min_shape"]),
            tuple(data["opt_shape"]),
            tuple(data["max_shape"]),
            data.get("dtype", "float32"),
            tuple(vr) if vr is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("min_shape", "opt_shape", "max_shape"):
            d[k] = list(d[k])
        if d["value_range"] is not None:
            d["value_range"] = list(d["value_range"])
        return d

    def with_batch(self, min_batch: int, opt_batch: int, max_batch: int) -> InputSpec:
        """The same spec with dimension 0 dynamic over [min_batch, max_batch]."""
        return dataclasses.replace(
            self,
            min_shape=(min_batch, *self.min_shape[1:]),
            opt_shape=(opt_batch, *self.opt_shape[1:]),
            max_shape=(max_batch, *self.max_shape[1:]),
        )

    # -- queries ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.opt_shape)

    @property
    def dynamic_dims(self) -> list[int]:
        return [i for i, (a, b) in enumerate(zip(self.min_shape, self.max_shape, strict=False)) if a != b]

    @property
    def is_float(self) -> bool:
        return self.dtype in _FLOAT_DTYPES

    def shape(self, which: str) -> Shape:
        if which not in ("min", "opt", "max"):
            raise ValueError(f"which must be min, opt or max, not {which!r}")
        return getattr(self, f"{which}_shape")

    def describe(self) -> str:
        if self.min_shape == self.max_shape:
            dims = format_shape(self.opt_shape)
        else:
            dims = "x".join(
                str(o) if lo == hi else f"[{lo}..{hi}]"
                for lo, o, hi in zip(self.min_shape, self.opt_shape, self.max_shape, strict=False)
            )
        return f"{self.name}: {dims} {self.dtype}"

    def accepts(self, shape: Sequence[int]) -> bool:
        return len(shape) == self.rank and all(
            lo <= d <= hi for d, lo, hi in zip(shape, self.min_shape, self.max_shape, strict=False)
        )

    def example(self, which: str = "opt", seed: int = 0, shape: Sequence[int] | None = None):
        """A deterministic sample tensor of this spec's min/opt/max shape."""
        import torch

        g = torch.Generator().manual_seed(seed)
        shape = tuple(shape) if shape is not None else self.shape(which)
        dtype = getattr(torch, self.dtype)
        if self.is_float:
            return torch.randn(shape, generator=g).to(dtype)
        if self.dtype == "bool":
            return torch.ones(shape, dtype=torch.bool)
        lo, hi = self.value_range or (0, 2)
        if self.name.endswith("attention_mask") and len(shape) == 2 and (int(lo), int(hi)) == (0, 2):
            # a padding mask, as a tokenizer writes it: each row's real tokens, then its padding
            kept = torch.randint(1, shape[1] + 1, (shape[0], 1), generator=g)
            return (torch.arange(shape[1]).unsqueeze(0) < kept).to(dtype)
        return torch.randint(int(lo), int(hi), shape, generator=g, dtype=dtype)


# -- model inputs: tensor, tuple of tensors, or dict of tensors -------------------------------


def input_style(x: Any) -> str:
    return "keyword" if isinstance(x, dict) else "positional"


def flatten_inputs(x: Any) -> list[tuple[str, Any]]:
    """(name, tensor) pairs of a batch's inputs, in call order."""
    if isinstance(x, dict):
        return list(x.items())
    if isinstance(x, (tuple, list)):
        return [(f"input_{i}", t) for i, t in enumerate(x)] if len(x) > 1 else [("input", x[0])]
    return [("input", x)]


def call_args(x: Any) -> tuple[tuple, dict]:
    """How a batch is passed to a model: ``model(*args, **kwargs)``."""
    if isinstance(x, dict):
        return (), dict(x)
    if isinstance(x, (tuple, list)):
        return tuple(x), {}
    return (x,), {}


def bind_inputs(x: Any, specs: Sequence[InputSpec], style: str) -> Any:
    """A lone tensor for a model of one keyword input (``pixel_values``) as that keyword: an
    ExportedProgram or AOTInductor package captured with keywords refuses a positional call, where
    ONNX Runtime and OpenVINO take one input by position."""
    if style == "keyword" and len(specs) == 1 and not isinstance(x, (dict, tuple, list)):
        return {specs[0].name: x}
    return x


def call_model(model: Any, x: Any) -> Any:
    args, kwargs = call_args(x)
    return model(*args, **kwargs)


def batch_size_of(x: Any) -> int:
    return int(flatten_inputs(x)[0][1].shape[0])


def _dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def data_range(name: str, t: Any) -> tuple[int, int]:
    """``[low, high)`` of an integer input read from data: from 0 (or the lowest value, when negative)
    to past the highest seen, an ``attention_mask`` at least ``[0, 2)``. Data shows some token ids,
    never the lowest one a request may send (padding 0, special ids), so no low bound comes from it;
    where the model is at hand, ``ptopt.core.input_infer.token_ranges`` widens ids to its vocabulary."""
    lo, hi = min(0, int(t.min())), int(t.max()) + 1
    if name.endswith("attention_mask"):
        hi = max(hi, 2)
    return lo, hi


def specs_from_example(
    x: Any, max_batch: int = DEFAULT_MAX_BATCH, dynamic_batch: bool = True
) -> list[InputSpec]:
    """Infer specs from a batch: the batch dimension dynamic in [1, max(max_batch, batch)], the rest fixed."""
    specs = []
    for name, t in flatten_inputs(x):
        shape = tuple(t.shape)
        dtype = _dtype_name(t)
        vr = data_range(name, t) if dtype in _INT_DTYPES and dtype != "bool" and t.numel() else None
        spec = InputSpec.static(name, shape, dtype, value_range=vr)
        if dynamic_batch and shape:
            spec = spec.with_batch(1, shape[0], max(max_batch, shape[0]))
        specs.append(spec)
    return specs


def make_inputs(
    specs: Sequence[InputSpec],
    style: str = "positional",
    which: str = "opt",
    seed: int = 0,
    batch: int | None = None,
) -> Any:
    """Sample inputs for ``specs`` in the model's calling style (tensor, tuple or dict)."""
    tensors = []
    for i, s in enumerate(specs):
        shape = s.shape(which)
        if batch is not None and shape:
            shape = (batch, *shape[1:])
        tensors.append(s.example(shape=shape, seed=seed + i))
    if style == "keyword":
        return {s.name: t for s, t in zip(specs, tensors, strict=False)}
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def check_inputs(specs: Sequence[InputSpec], x: Any, what: str = "data") -> None:
    """Raise ShapeMismatchError when a batch doesn't fit the specs (count, names, rank, dims, dtype)."""
    got = flatten_inputs(x)
    if len(got) != len(specs):
        raise ShapeMismatchError(
            f"{what} has {len(got)} input(s) but the model takes {len(specs)}",
            expected=", ".join(s.describe() for s in specs),
            got=", ".join(n for n, _ in got),
        )
    if isinstance(x, dict):
        names = {s.name for s in specs}
        if set(x) != names:
            raise ShapeMismatchError(
                f"{what} input names don't match the model's", expected=sorted(names), got=sorted(x)
            )
        pairs = [(s, x[s.name]) for s in specs]
    else:
        pairs = [(s, t) for s, (_, t) in zip(specs, got, strict=False)]
    for spec, t in pairs:
        shape = tuple(t.shape)
        fixed_ok = len(shape) == spec.rank and all(
            lo <= d <= hi or i == 0
            for i, (d, lo, hi) in enumerate(zip(shape, spec.min_shape, spec.max_shape, strict=False))
        )
        if not fixed_ok:
            raise ShapeMismatchError(
                f"{what} does not fit the model's input {spec.name!r}",
                expected=spec.describe(),
                got=f"{format_shape(shape)} {_dtype_name(t)}",
            )
        dt = _dtype_name(t)
        if (dt in _FLOAT_DTYPES) != spec.is_float:
            raise ShapeMismatchError(
                f"{what} has the wrong dtype for input {spec.name!r}", expected=spec.dtype, got=dt
            )
