"""Channel spaces and how they are tied: the union-find under ``ptopt.compress.prune.channel_graph``.

A *space* is a set of channels a layer makes (its output rows), or a part of one (q, k and v of a
fused projection), or a concatenation of parts (``torch.cat``). Spaces are *linked* unit by unit
(residual adds join two spaces of one size; attention ties q heads to k and v heads, of other
widths), *blocked* (their channels go in whole blocks: heads, groups) or *frozen* (kept, with the
reason). A group's units are the finest blocks all its members can be cut in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from ptopt.compress.prune.layout import Digit


def _op_name(node: Any) -> str:
    """``add`` for ``operator.add``, ``x.add_``, ``torch.add`` and ATen's ``aten.add_.Tensor`` alike."""
    t = node.target
    if isinstance(t, str):
        return t.strip("_")
    if hasattr(t, "_opname"):  # an ATen OpOverload: the op without its overload name
        return t._opname.strip("_")
    return getattr(t, "__name__", str(t)).strip("_")


@dataclasses.dataclass
class _Space:
    size: int
    producers: list[str] = dataclasses.field(default_factory=list)
    frozen: list[str] = dataclasses.field(default_factory=list)
    parent: int = -1
    #: this member's channels go in multiples of this many (heads, groups)
    block: int = 1


@dataclasses.dataclass(frozen=True)
class _Info:
    """A tensor's channels: which space, and the digits that place them (``layout``)."""

    space: int
    digits: tuple[Digit, ...]


@dataclasses.dataclass(frozen=True)
class Use:
    """A dimension of ``module`` whose positions ``start .. start+n`` hold channels of ``space``
    (position p: channel ``layout.values(digits, n)[p]``)."""

    space: int
    module: str
    role: str  # out | in | norm | depthwise | grouped | param
    digits: tuple[Digit, ...]
    n: int
    start: int = 0
    attr: str = ""
    axis: int = 0

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (
            self.module,
            "rows" if self.role in ("out", "depthwise", "grouped") else self.role,
            self.attr,
            self.axis,
        )


@dataclasses.dataclass
class ChannelGroup:
    """Channels pruned together, ranked as one, removed in ``units`` equal units (heads, groups,
    single channels); ``members``: each space of the group and its channels per unit."""

    producers: list[str]
    units: int
    frozen: list[str]
    members: dict[int, int]
    #: a LayerNorm normalises over these channels: removing them changes the others' statistics
    inexact: bool = False
    #: channels of the first producer's space (the table's "channels")
    size: int = 0
    #: the norms over these channels: (leaf module run on the kept channels alone when checking, or
    #: None; the space at the norm; the positions of the dim it normalises; their channels, digits on dim 0)
    norms: list[tuple[str | None, int, int, tuple[Digit, ...]]] = dataclasses.field(default_factory=list)

    @property
    def prunable(self) -> bool:
        return not self.frozen and bool(self.producers) and self.units > 1


class Spaces:
    """The space algebra (a mixin of ``ChannelGraph``: ``self._spaces``, ``self._parts``,
    ``self._inexact`` are its state)."""

    _spaces: list[_Space]
    _parts: dict[int, list[tuple[int | None, int, int]]]
    _inexact: set[int]
    _norm_at: dict[int, list[tuple[str | None, int, int, tuple[Digit, ...]]]]

    # -- spaces, union-find ----------------------------------------------------------------------
    def _new(self, size: int, producer: str | None = None, frozen: str | None = None) -> int:
        self._spaces.append(_Space(size, [producer] if producer else [], [frozen] if frozen else []))
        return len(self._spaces) - 1

    def _find(self, i: int) -> int:
        while self._spaces[i].parent >= 0:
            i = self._spaces[i].parent
        return i

    def _union(self, a: int, b: int, where: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra == rb:
            return
        if a in self._parts or b in self._parts:
            # a concatenation meeting other channels: its parts keep every channel
            self._freeze(a, f"concatenated channels meet other channels at {where}")
            self._freeze(b, f"concatenated channels meet other channels at {where}")
            return
        sa, sb = self._spaces[ra], self._spaces[rb]
        sb.parent = ra
        sa.producers += sb.producers
        sa.frozen += sb.frozen

    def _freeze(self, i: int, reason: str) -> None:
        if i in self._parts:
            for part, _, _ in self._parts[i]:
                if part is not None:
                    self._freeze(part, reason)
            return
        self._spaces[self._find(i)].frozen.append(reason)

    def _normed(self, space: int, norm: tuple[str | None, int, int, tuple[Digit, ...]]) -> None:
        """A norm over every channel of ``space`` (``norm``: see ``ChannelGroup.norms``): the groups of its
        channels are checked with it run on their kept channels alone. A concatenation is no group's
        member: each of its parts carries the norm (Swin's patch merging normalises four copies of a
        stage's stream; without this the check compared against a norm over the removed channels too)."""
        for i in [p for p, _, _ in self._parts[space] if p is not None] if space in self._parts else [space]:
            self._inexact.add(i)
            if norm not in self._norm_at.setdefault(i, []):
                self._norm_at[i].append(norm)

    def _freeze_info(self, info: Any, reason: str) -> None:
        for i in info if isinstance(info, list) else [info]:
            if isinstance(i, _Info):
                self._freeze(i.space, reason)

    def _block(self, space: int, block: int, where: str, why: str = "") -> None:
        """The channels of ``space`` go in whole blocks of ``block`` (kept whole when it cannot; ``why``
        says what ties them, default: they are mixed at ``where``)."""
        if block <= 1:
            return
        if space in self._parts:
            self._freeze(space, why or f"concatenated channels are mixed at {where}")
            return
        sp = self._spaces[space]
        new = math.lcm(sp.block, block)
        if new >= sp.size or sp.size % new:
            self._freeze(space, why or f"its channels are mixed at {where}")
        else:
            sp.block = new

    def _link(self, a: int, da: Digit, b: int, db: Digit, n: int, where: str) -> None:
        """Tie ``a`` and ``b`` unit by unit: position p of one dim holds a's channel ``da(p)`` and
        b's ``db(p)`` (same space and digit: nothing to do; heads of different widths: fine)."""
        if (a, da) == (b, db):
            return
        ok = all(
            d.rep * d.count == n and s not in self._parts and d.span == self._spaces[s].size
            for s, d in ((a, da), (b, db))
        )
        if not ok:
            self._freeze(a, f"channels meet other channels differently laid out at {where}")
            self._freeze(b, f"channels meet other channels differently laid out at {where}")
            return
        lcm = math.lcm(da.rep, db.rep)
        self._block(a, da.stride * lcm // da.rep, where)
        self._block(b, db.stride * lcm // db.rep, where)
        self._union(a, b, where)

    def _drop(self, info: _Info, dims: Iterable[int], where: str) -> _Info:
        """``info`` without its digits on ``dims`` (an op mixes along them): whole blocks of their span."""
        dims = set(dims)
        for d in info.digits:
            if d.dim in dims:
                self._block(info.space, d.span, where)
        return _Info(info.space, tuple(d for d in info.digits if d.dim not in dims))

    def _same_layout(self, a: int, b: int) -> bool:
        return a not in self._parts and b not in self._parts and self._spaces[a].size == self._spaces[b].size

    def _cut_even(self, space: int, stride: int, count: int, where: str) -> None:
        """Cut ``space`` into ``count`` parts of ``stride`` channels, pruned alike: the code that
        splits them again (``reshape(B, N, 3, heads, -1)``, ``split(self.split_size)``) needs them
        equal."""
        parts = [self._cut(space, i * stride, (i + 1) * stride, where) for i in range(count)]
        if all(p is not None for p in parts):
            for p in parts[1:]:
                self._union(parts[0], p, where)

    def _size(self, space: int) -> int:
        return self._spaces[space].size

    def _cut(self, space: int, lo: int, hi: int, where: str) -> int | None:
        """The part of ``space`` holding channels ``lo .. hi`` (a concatenation's part, or a fresh
        split of a layer's output that nothing else is tied to); None (channels kept) otherwise."""
        if lo == 0 and hi == self._size(space):
            return space
        if space in self._parts:
            for part, at, size in self._parts[space]:
                if at <= lo and hi <= at + size and part is not None:
                    return self._cut(part, lo - at, hi - at, where)
            inside = [p for p in self._parts[space] if lo <= p[1] and p[1] + p[2] <= hi]
            if inside and sum(p[2] for p in inside) == hi - lo and all(p[0] is not None for p in inside):
                new = self._new(hi - lo)
                self._parts[new] = [(p, at - lo, n) for p, at, n in inside]
                return new
            self._freeze(space, f"part of concatenated channels taken at {where}")
            return None
        sp = self._spaces[space]
        alone = self._find(space) == space and not any(s.parent == space for s in self._spaces)
        if not alone or lo % sp.block or hi % sp.block:
            self._freeze(space, f"channels split at {where}")
            return None
        cuts = sorted({0, lo, hi, sp.size})
        parts = []
        for a, b in zip(cuts, cuts[1:], strict=False):
            p = self._new(b - a)
            self._spaces[p].producers = list(sp.producers)
            self._spaces[p].frozen = list(sp.frozen)
            self._spaces[p].block = sp.block
            if space in self._inexact:
                self._inexact.add(p)
                self._norm_at[p] = [(None, p, b - a, ())]  # a norm over a split space: not checked
            parts.append((p, a, b - a))
        self._parts[space] = parts
        return next(p for p, a, _ in parts if a == lo)
