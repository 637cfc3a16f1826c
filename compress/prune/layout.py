"""Where a tensor's channels sit: *digits* that map positions along its dims to channels.

A layer's output channels start on one dim (``Digit(dim, stride=1, count=C)``: position p is channel
p). Ops move and reshape them, and the channel analysis (``ptopt.compress.prune.channel_graph``)
follows the digits instead of one "channel axis":

- ``view(B, T, C) -> (B, T, H, D)`` splits the channels in two digits: heads ``Digit(2, D, 1, H)``
  and the position in the head ``Digit(3, 1, 1, D)``; ``transpose`` only renumbers dims;
- ``flatten(C, H, W) -> C·H·W`` gives ``Digit(1, 1, rep=H·W, count=C)``: position f is channel
  f // (H·W), as a Linear after a conv reads it;
- ``repeat_kv`` (grouped-query attention) merges a kv-head digit with a repeat:
  ``Digit(1, D, rep=n_rep, count=KV)``;
- a channel shuffle (``view(B, g, C/g, ...)``, ``transpose``, ``view(B, C, ...)``) leaves two digits
  on one dim.

The channel at a position is ``sum(((index[d.dim] // d.rep) % d.count) * d.stride)`` over the digits.
A digit that an op mixes (attention contracting the head dim, a rotary slice of it) is dropped, and
the channel space must then be pruned in whole blocks of its span: that is how attention heads
go whole, found from the graph rather than from the module's class.

Reshapes are followed by computing the channel of every position of the dims that change and
decomposing the result again (:func:`reshape`), so any split, merge or shuffle that keeps a
mixed-radix layout is followed; anything else returns None (the caller keeps those channels).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

#: positions a reshape may enumerate to follow the channels (beyond: the channels are kept)
MAX_POSITIONS = 1 << 22


@dataclasses.dataclass(frozen=True)
class Digit:
    """Positions along ``dim`` contribute ``((p // rep) % count) * stride`` to the channel index."""

    dim: int
    stride: int = 1
    rep: int = 1
    count: int = 1

    @property
    def span(self) -> int:
        """Channels this digit ranges over (with the finer digits below it)."""
        return self.stride * self.count

    def moved(self, dim: int) -> Digit:
        return dataclasses.replace(self, dim=dim)


def plain(dim: int, size: int) -> tuple[Digit, ...]:
    """A layer's output: channel p at position p of ``dim``."""
    return (Digit(dim, 1, 1, size),)


def values(digits: Iterable[Digit], n: int) -> Any:
    """The channel offset each of ``n`` positions of one dim contributes (digits all on that dim)."""
    import torch

    p = torch.arange(n)
    out = torch.zeros(n, dtype=torch.long)
    for d in digits:
        out += ((p // d.rep) % d.count) * d.stride
    return out


def decompose(vals: Any) -> list[tuple[int, int, int]] | None:
    """``(stride, rep, count)`` digits whose sum gives ``vals`` (one dim's channel offsets), finest
    first; None when no such mixed-radix form exists."""
    import torch

    n = len(vals)
    rest = vals.clone()
    p = torch.arange(n)
    found: list[tuple[int, int, int]] = []
    while bool(rest.any()):
        if int(rest[0]) != 0 or len(found) > 8:
            return None
        rep = int(torch.nonzero(rest)[0])
        stride = int(rest[rep])
        count = 1
        while count * rep < n and int(rest[count * rep]) == count * stride:
            count += 1
        if stride <= 0:
            return None
        rest = rest - ((p // rep) % count) * stride
        found.append((stride, rep, count))
    return found


def groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """Dims of ``a`` and ``b`` (same number of elements) paired into the smallest runs with equal
    products, as a reshape regroups them; a size-1 dim joins the run after it."""
    out: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        ga: list[int] = []
        gb: list[int] = []
        pa = pb = 1
        while not (ga and gb and pa == pb) and (i < len(a) or j < len(b)):
            if (pa <= pb and i < len(a)) or j >= len(b):
                ga.append(i)
                pa *= a[i]
                i += 1
            else:
                gb.append(j)
                pb *= b[j]
                j += 1
        if pa != pb:
            return None
        out.append((ga, gb))
    return out


def reshape(
    digits: Sequence[Digit], in_shape: Sequence[int], out_shape: Sequence[int]
) -> tuple[Digit, ...] | None:
    """The digits after ``reshape(in_shape -> out_shape)``, or None when the channels do not land on
    a mixed-radix layout (or there are too many positions to follow)."""
    import torch

    if math.prod(in_shape) != math.prod(out_shape):
        return None
    runs = groups(list(in_shape), list(out_shape))
    if runs is None:
        return None
    out: list[Digit] = []
    for gin, gout in runs:
        mine = [d for d in digits if d.dim in gin]
        if not mine:
            continue
        if len(gin) == 1 and len(gout) == 1:
            out += [d.moved(gout[0]) for d in mine]
            continue
        sizes = [in_shape[k] for k in gin]
        if math.prod(sizes) > MAX_POSITIONS:
            return None
        grid = torch.zeros(sizes, dtype=torch.long)
        for d in mine:
            view = [1] * len(gin)
            view[gin.index(d.dim)] = sizes[gin.index(d.dim)]
            grid = grid + values([d], view[gin.index(d.dim)]).view(view)
        split = _split_grid(grid.reshape([out_shape[k] for k in gout]), gout)
        if split is None:
            return None
        out += split
    return tuple(out)


def _split_grid(grid: Any, dims: Sequence[int]) -> list[Digit] | None:
    """Digits for a grid of channels over ``dims``: it must be a sum of one function per dim, each
    a mixed-radix form."""
    found: list[Digit] = []
    total = grid.new_zeros(grid.shape)
    for axis, dim in enumerate(dims):
        index = [0] * grid.dim()
        index[axis] = slice(None)
        along = grid[tuple(index)]
        parts = decompose(along)
        if parts is None:
            return None
        found += [Digit(dim, s, r, c) for s, r, c in parts]
        view = [1] * grid.dim()
        view[axis] = grid.shape[axis]
        total = total + along.view(view)
    if not bool((total == grid).all()):
        return None
    return found


def channels_at(digits: Sequence[Digit], n: int) -> Any:
    """The channel of each of ``n`` positions of the one dim all ``digits`` are on."""
    return values(digits, n)
