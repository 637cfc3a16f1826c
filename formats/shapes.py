"""One translation from ``InputSpec`` to every backend's notion of dynamic shapes.

``settle_specs`` turns ``--min-shape/--opt-shape/--max-shape`` (per input for multi-input models:
``input_ids=1x16``) or ``--dynamic-batch 1:8:64`` into InputSpecs; the functions below turn those
specs into:

- ``torch.export`` ``dynamic_shapes`` (``Dim``s; one ``Dim`` is shared by every input dimension with
  the same index and range, so ``input_ids`` and ``attention_mask`` get one batch and one sequence
  dimension, which is what a model that adds or masks them needs);
- ONNX symbolic dimension names (``batch``, ``dim1``...);
- ``torch_tensorrt.Input(min_shape, opt_shape, max_shape, dtype)``;
- the ``trtexec --minShapes/--optShapes/--maxShapes`` line.

Nothing here imports torch at module level; the CLI parses shapes without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ptopt.core.errors import ShapeMismatchError, UsageError
from ptopt.core.inputspec import InputSpec, Shape, dtype_of, format_shape, parse_named_shapes, parse_shape

ShapeArg = Any  # "1x3x32x32" | ["input_ids=1x16", ...] | (1, 3, 32, 32) | {"input_ids": (1, 16)}


def parse_dynamic_batch(value: Any) -> tuple[int, int, int] | None:
    """``"1:8:64"`` → ``(1, 8, 64)``; ``"1:64"`` → ``(1, 1, 64)`` (opt = min); a 3-tuple passes through."""
    if value is None:
        return None
    if isinstance(value, str):
        parts = value.strip().split(":")
        try:
            nums = tuple(int(p) for p in parts)
        except ValueError:
            nums = ()
        if len(nums) not in (2, 3):
            raise UsageError(f"bad --dynamic-batch {value!r}: write MIN:OPT:MAX, e.g. 1:8:64")
    else:
        nums = tuple(int(v) for v in value)
    if len(nums) == 2:
        nums = (nums[0], nums[0], nums[1])
    if len(nums) != 3:
        raise UsageError(f"bad dynamic batch {value!r}: give (min, opt, max), e.g. 1:8:64")
    lo, opt, hi = nums
    if lo <= 0:
        raise UsageError(f"dynamic batch: min must be positive, got {lo}")
    if lo > opt:
        raise UsageError(f"dynamic batch: min > opt ({lo} > {opt})")
    if opt > hi:
        raise UsageError(f"dynamic batch: opt > max ({opt} > {hi})")
    return lo, opt, hi


def _named_shapes(value: ShapeArg, option: str) -> list[tuple[str | None, Shape]]:
    """Normalize one of min/opt/max into ``[(name | None, shape)]``."""
    if value is None:
        return []
    if isinstance(value, str):
        return parse_named_shapes([value])
    if isinstance(value, Mapping):
        return [
            (str(k), parse_shape(v) if isinstance(v, str) else tuple(int(d) for d in v))
            for k, v in value.items()
        ]
    if isinstance(value, Sequence) and value and all(isinstance(v, int) for v in value):
        return [(None, tuple(int(d) for d in value))]
    if isinstance(value, Sequence):
        out: list[tuple[str | None, Shape]] = []
        for v in value:
            if isinstance(v, str):
                out += parse_named_shapes([v])
            else:
                out.append((None, tuple(int(d) for d in v)))
        return out
    raise UsageError(f"{option}: expected a shape like 1x3x32x32, got {value!r}")


def _assign(named: list[tuple[str | None, Shape]], base: list[InputSpec], option: str) -> dict[str, Shape]:
    """Match given shapes to the model's inputs: by name, or in order for unnamed shapes."""
    if not named:
        return {}
    names = [s.name for s in base]
    out: dict[str, Shape] = {}
    unnamed = [shape for n, shape in named if n is None]
    if unnamed and len(unnamed) != len(named):
        raise UsageError(f"{option}: name every shape (NAME=SHAPE) or none of them")
    if unnamed:
        if base and len(unnamed) != len(base):
            raise UsageError(
                f"{option}: the model takes {len(base)} input(s) ({', '.join(names)}); "
                f"give one shape per input as NAME=SHAPE"
            )
        keys = (
            names
            if base
            else (["input"] if len(unnamed) == 1 else [f"input_{i}" for i in range(len(unnamed))])
        )
        return dict(zip(keys, unnamed, strict=False))
    for n, shape in named:
        if base and n not in names:
            raise UsageError(f"{option}: the model has no input {n!r} (inputs: {', '.join(names)})")
        out[str(n)] = shape
    return out


def settle_specs(
    base: Sequence[InputSpec],
    *,
    min_shape: ShapeArg = None,
    opt_shape: ShapeArg = None,
    max_shape: ShapeArg = None,
    dynamic_batch: Any = None,
) -> list[InputSpec]:
    """The export's InputSpecs: ``base`` (what the model declares or the data shows) updated by the options.

    Per input, a missing shape is taken from the given ones: opt from max (else min), min and max
    from opt; so ``--opt-shape`` alone gives a static shape. An input no option names keeps its base
    spec. ``dynamic_batch`` then sets dimension 0 of every input to (min, opt, max). Raises
    UsageError for min > opt > max and ShapeMismatchError for a rank the model does not take.
    """
    base = list(base)
    given = {
        w: _assign(_named_shapes(v, f"--{w}-shape"), base, f"--{w}-shape")
        for w, v in (("min", min_shape), ("opt", opt_shape), ("max", max_shape))
    }
    names = list(dict.fromkeys([s.name for s in base] + [n for g in given.values() for n in g]))
    if not names:
        raise UsageError(
            "input shapes unknown: pass --min/--opt/--max-shape, or --data, or a model that "
            "declares example_inputs()"
        )
    by_name = {s.name: s for s in base}
    specs = []
    for name in names:
        spec = by_name.get(name)
        lo, opt, hi = (given[w].get(name) for w in ("min", "opt", "max"))
        if lo is not None or opt is not None or hi is not None:
            opt = opt or hi or lo
            lo, hi = lo or opt, hi or opt
            for which, shape in (("min", lo), ("opt", opt), ("max", hi)):
                if spec is not None and len(shape) != spec.rank:
                    raise ShapeMismatchError(
                        f"--{which}-shape {format_shape(shape)} for input {name!r} has rank {len(shape)}, "
                        f"but the model takes rank {spec.rank}",
                        expected=spec.describe(),
                        got=format_shape(shape),
                    )
            _check_order(name, lo, opt, hi, given_opt=given["opt"].get(name) is not None)
            dtype = dtype_of(opt) or dtype_of(lo) or dtype_of(hi) or (spec.dtype if spec else "float32")
            vr = spec.value_range if spec and spec.dtype == dtype else None
            spec = InputSpec(name, lo, opt, hi, dtype, vr)
        if spec is None:  # pragma: no cover - names come from base or given
            continue
        specs.append(spec)
    batch = parse_dynamic_batch(dynamic_batch)
    if batch is not None:
        specs = [s.with_batch(*batch) if s.rank else s for s in specs]
    return specs


def _check_order(name: str, lo: Any, opt: Any, hi: Any, given_opt: bool) -> None:
    """Without --opt-shape (filled from --max-shape), a --min-shape above --max-shape is named as the two
    shapes the user gave, not as an opt they never wrote (``min > opt``)."""
    if given_opt or len(lo) != len(hi):
        return
    for i, (a, b) in enumerate(zip(lo, hi, strict=True)):
        if a > b:
            raise UsageError(
                f"input {name!r}: --min-shape {format_shape(lo)} is larger than --max-shape {format_shape(hi)} "
                f"at dimension {i} ({a} > {b})"
            )


# -- translations ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SymbolicDim:
    """One dynamic dimension shared by every input dimension with the same index and range."""

    name: str
    min: int
    max: int


def symbolic_dims(specs: Sequence[InputSpec]) -> list[dict[int, SymbolicDim]]:
    """Per input, its dynamic dimensions → a shared symbolic dimension (``batch``, ``dim1``, ...)."""
    pool: dict[tuple[int, int, int], SymbolicDim] = {}
    used: set[str] = set()
    out = []
    for s in specs:
        dims = {}
        for i in s.dynamic_dims:
            key = (i, s.min_shape[i], s.max_shape[i])
            if key not in pool:
                base = "batch" if i == 0 else f"dim{i}"
                name, k = base, 1
                while name in used:
                    k += 1
                    name = f"{base}_{k}"
                used.add(name)
                pool[key] = SymbolicDim(name, s.min_shape[i], s.max_shape[i])
            dims[i] = pool[key]
        out.append(dims)
    return out


def onnx_dim_names(specs: Sequence[InputSpec]) -> dict[str, dict[int, str]]:
    """``{input: {dim: symbolic name}}``: the ONNX graph's symbolic dims (also ``dynamic_axes``)."""
    return {
        s.name: {i: d.name for i, d in dims.items()}
        for s, dims in zip(specs, symbolic_dims(specs), strict=False)
    }


def torch_export_dynamic_shapes(specs: Sequence[InputSpec], style: str = "positional") -> Any:
    """``dynamic_shapes`` for ``torch.export.export``: a dict per keyword input or a tuple per positional one.

    None when every input is static. The ``Dim`` ranges are the specs' [min, max].
    """
    import torch

    sym = symbolic_dims(specs)
    if not any(sym):
        return None
    made: dict[str, Any] = {}

    def dim(d: SymbolicDim):
        if d.name not in made:
            made[d.name] = torch.export.Dim(d.name, min=d.min, max=d.max)
        return made[d.name]

    per_input = [{i: dim(d) for i, d in dims.items()} or None for dims in sym]
    if style == "keyword":
        return {s.name: p for s, p in zip(specs, per_input, strict=False)}
    return tuple(per_input)


def tensorrt_input_kwargs(specs: Sequence[InputSpec]) -> list[dict[str, Any]]:
    """Keyword arguments of one ``torch_tensorrt.Input`` per input (plain data, testable without TensorRT)."""
    return [
        {
            "min_shape": list(s.min_shape),
            "opt_shape": list(s.opt_shape),
            "max_shape": list(s.max_shape),
            "dtype": s.dtype,
            "name": s.name,
        }
        for s in specs
    ]


def tensorrt_inputs(specs: Sequence[InputSpec]) -> list[Any]:
    """``torch_tensorrt.Input(min_shape, opt_shape, max_shape, dtype=, name=)`` per input."""
    import torch
    import torch_tensorrt  # noqa: PLC0415 - optional backend, checked by the caller

    return [
        torch_tensorrt.Input(
            min_shape=k["min_shape"],
            opt_shape=k["opt_shape"],
            max_shape=k["max_shape"],
            dtype=getattr(torch, k["dtype"]),
            name=k["name"],
        )
        for k in tensorrt_input_kwargs(specs)
    ]


def trtexec_shapes(specs: Sequence[InputSpec], names: Sequence[str] | None = None) -> str:
    """``--minShapes=x:1x1x32x32 --optShapes=... --maxShapes=...`` for ``trtexec --onnx=...``.

    ``names``: the ONNX graph's input names, in the specs' order (default: the spec names).
    """
    names = list(names) if names is not None else [s.name for s in specs]
    parts = []
    for flag, which in (("--minShapes", "min"), ("--optShapes", "opt"), ("--maxShapes", "max")):
        parts.append(
            flag
            + "="
            + ",".join(f"{n}:{format_shape(s.shape(which))}" for n, s in zip(names, specs, strict=False))
        )
    return " ".join(parts)
