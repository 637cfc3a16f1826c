"""The per-op rules of the channel analysis (``ops.HANDLERS`` names them): how channels move
through elementwise ops, reshapes, transposes, slices, splits, concatenations, reductions,
matmuls and attention, and how a parameter met along the channels (a position bias table per
head, a layer scale) is cut with them. A mixin of ``ChannelGraph`` (its ``_info``, ``_shape``,
``_owner`` and the space algebra of ``ptopt.compress.prune.spaces``).
"""

from __future__ import annotations

import math
from typing import Any

from ptopt.compress.prune import layers as L
from ptopt.compress.prune import ops as O
from ptopt.compress.prune.layout import Digit, plain
from ptopt.compress.prune.spaces import Use, _Info, _op_name


class Rules:
    """Op rules (see the module docstring)."""

    _info: dict[Any, Any]
    modules: dict[str, Any]

    # -- function rules (``ops.HANDLERS``) ----------------------------------------------------------
    def _h_size(self, node: Any) -> None:
        return None  # sizes are recomputed when the pruned model runs; new tensors hold no channels

    def _h_embedding(self, node: Any) -> _Info | None:
        """A lookup in an embedding table (``aten.embedding(weight, ids)``, ``F.embedding(ids, weight)``):
        with the hidden size pruned its columns are the output channels of a layer (the residual stream
        starts here); else the result holds channels no layer made."""
        if not self.hidden:
            return None
        for arg in node.args[:2]:
            found = self._param_module(arg)
            if found is not None and L.kind(found[1]) != "embedding":
                found = self._tied_layer(node, found[1], ("embedding",))  # the graph names the head
            if found is not None and L.kind(found[1]) == "embedding" and self._owner(arg)[1] == "weight":
                return self._produce(found[0], L.out_size(found[1]), len(self._out_shape(node)) - 1)
        return None

    def _aligned(self, node: Any) -> list[tuple[Any, Any, int]]:
        """(input node, its info or None, dims it is shifted by) for each tensor input, broadcast
        against the node's output from the right."""
        rank = len(self._out_shape(node))
        return [(n, self._info.get(n), rank - len(self._shape(n))) for n in self._tensor_inputs(node)
                if self._shape(n) is not None]  # fmt: skip

    def _out_shape(self, node: Any) -> tuple[int, ...]:
        """The node's shape, or its first output's (ops returning values and indices)."""
        shape = self._shape(node)
        if shape is None:
            vals = node.meta.get("val", node.meta.get("tensor_meta"))
            first = vals[0] if isinstance(vals, (list, tuple)) and vals else None
            shape = tuple(int(d) for d in first.shape) if hasattr(first, "shape") else ()
        return shape

    def _h_elementwise(self, node: Any) -> _Info | None:
        """Broadcasting ops: the inputs' channels meet position by position (residual adds, gates,
        masks); a tensor no layer made that varies along channels is a parameter to cut with them
        (a position bias, a layer scale) or keeps them."""
        shape = self._out_shape(node)
        entries = self._aligned(node)
        tracked = [(n, _Info(i.space, tuple(d.moved(d.dim + k) for d in i.digits)), k)
                   for n, i, k in entries if isinstance(i, _Info)]  # fmt: skip
        if not tracked:
            return None
        primary = max(tracked, key=lambda t: len(t[1].digits))[1]
        keep = [d for d in primary.digits]
        for dim, n in enumerate(shape):
            if not self._tie(node, dim, n, entries, tracked):
                keep = [d for d in keep if d.dim != dim]
        return _Info(primary.space, tuple(keep))

    def _tie(self, node: Any, dim: int, n: int, entries: list, tracked: list) -> bool:
        """The inputs meet along output ``dim`` (``n`` positions): link channels that meet there, cut a
        parameter with them, or (within a unit: a head's own positions) take whole blocks. Returns
        whether the digits on ``dim`` still say which unit a position is."""
        where = node.name
        here = [(i, [d for d in i.digits if d.dim == dim]) for _, i, _ in tracked]
        here = [(i, ds) for i, ds in here if ds]
        if not here:
            return True
        varying = [(src, info, k) for src, info, k in entries
                   if 0 <= dim - k and self._shape(src)[dim - k] > 1]  # fmt: skip
        loose = [(src, k) for src, info, k in varying if not isinstance(info, _Info)]
        flat = [
            i for _, i, k in varying if isinstance(i, _Info) and not any(d.dim + k == dim for d in i.digits)
        ]
        outer = all(len(ds) == 1 and ds[0].span == self._spaces[i.space].size and i.space not in self._parts
                    for i, ds in here)  # fmt: skip
        if outer and not flat:
            first, (d0,) = here[0]
            for info, (d,) in here[1:]:
                self._link(first.space, d0, info.space, d, n, where)
            if all(self._cut_param(src, dim - k, n, first.space, d0, where) for src, k in loose):
                return True
        why = (
            f"added to a tensor no layer made (an embedding, a position or bias table) at {where}"
            if loose
            else ""
        )
        for info, ds in here:
            for d in ds:
                self._block(info.space, d.span, where, why)
        return False

    def _cut_param(self, src: Any, dim: int, n: int, space: int, digit: Digit, where: str) -> bool:
        """``src`` (no layer's output) meets channels along its ``dim``: when it is a parameter seen
        through shape ops (a bias table indexed per head, a layer scale), cut it with them."""
        found = self._param_source(src, dim, tables=digit.stride > 1)
        if found is None:
            return False
        module, attr, axis = found
        key = (module, attr, axis)
        if key not in self._param_spaces:
            pspace = self._new(n)
            self._param_spaces[key] = pspace
            self.uses.append(Use(pspace, module, "param", plain(0, n), n, attr=attr, axis=axis))
        self._link(space, digit, self._param_spaces[key], Digit(digit.dim, 1, 1, n), n, where)
        return True

    def _param_source(self, node: Any, dim: int, tables: bool = False) -> tuple[str, str, int] | None:
        """(module, attribute, dim) of the parameter ``node``'s ``dim`` comes from, position for
        position, through shape-only ops; None when it does not (or is not a parameter). Through an
        embedding lookup only with ``tables`` (a bias table per head: token and position embeddings
        make the hidden size, which stays)."""
        import torch

        for _ in range(24):
            owner = self._owner(node)
            if owner is not None:
                mod = self.modules.get(owner[0])
                t = getattr(mod, owner[1], None) if mod is not None else None
                ok = isinstance(t, torch.Tensor) and t.dim() > dim and t.shape[dim] == self._shape(node)[dim]
                return (*owner, dim) if ok else None
            if not tables and getattr(node, "op", None) == "call_function" and _op_name(node) == "embedding":
                return None
            step = self._trace_step(node, dim)
            if step is None:
                return None
            node, dim = step
        return None

    def _h_same_rank(self, node: Any) -> _Info | None:
        """Pooling, interpolation, padding: channels stay where their dim keeps its size."""
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        shape, s = self._out_shape(node), self._shape(src)
        if len(shape) != len(s):
            return self._unknown(node, _op_name(node))
        changed = {d.dim for d in info.digits if s[d.dim] != shape[d.dim]}
        if changed:
            return self._unknown(node, _op_name(node))
        return info

    def _h_mix(self, node: Any) -> _Info | None:
        """Softmax, cumsum, flip... along one dim: channels on it are mixed (whole blocks)."""
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        rank = len(self._shape(src))
        if _op_name(node) == "roll":  # roll(x, shifts, dims): arg 1 is the shifts; no dims rolls it flat
            dim = self._arg(node, 2, "dims", None)
            dim = list(range(rank)) if dim is None or dim == [] or dim == () else dim  # dims=0 is dim 0
        else:
            dim = self._arg(node, 1, "dim", self._arg(node, 1, "dims", None))
        dims = dim if isinstance(dim, (list, tuple)) else [dim]
        if any(not isinstance(d, int) for d in dims):
            return self._unknown(node, _op_name(node))
        return self._drop(info, [d % rank for d in dims], node.name)

    def _h_reduce(self, node: Any) -> Any:
        """mean / sum / max ... over dims: channels on them are mixed; the rest move up."""
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s, shape = self._shape(src), self._out_shape(node)
        at = 2 if _op_name(node) in ("norm", "linalg_vector_norm") else 1  # norm(x, p, dim): p comes first
        dims = self._arg(node, at, "dim", None)
        if dims is None and _op_name(node) in ("var", "std", "var_mean", "std_mean"):
            dims = node.kwargs.get("correction_dims")
        dims = list(range(len(s))) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
        if any(not isinstance(d, int) for d in dims):
            return self._unknown(node, _op_name(node))
        dims = sorted({d % len(s) for d in dims})
        if self._statistic(node, info, dims, len(s)):
            self._inexact.add(info.space)  # a norm written in Python: the others' statistic changes
            norm = (self._norm_module(node), info.space, s[-1], plain(0, s[-1]))
            self._norm_at.setdefault(info.space, []).append(norm)
            out = _Info(info.space, tuple(d for d in info.digits if d.dim not in dims))
        else:
            out = self._drop(info, dims, node.name)
        if len(shape) != len(s):  # keepdim=False: later dims move up
            out = _Info(out.space, tuple(d.moved(d.dim - sum(x < d.dim for x in dims)) for d in out.digits))
        return out

    def _norm_module(self, node: Any) -> str | None:
        """The module a statistic node ran inside when it is a norm alone (a leaf whose parameters are
        per channel: T5's and Llama's RMSNorm), else None."""
        stack = self._stack(node)
        mod = self.modules.get(stack[-1]) if stack else None
        if mod is None or not stack[-1] or any(True for _ in mod.children()):
            return None
        return stack[-1] if all(p.dim() == 1 for p in mod.parameters(recurse=False)) else None

    def _statistic(self, node: Any, info: _Info, dims: list[int], rank: int) -> bool:
        """With the hidden size pruned: a mean / variance / norm over the last dim holding every channel
        of the residual stream (RMSNorm and LayerNorm written in Python): a per-token statistic, not a
        mix of units."""
        if dims != [rank - 1] or not self._hidden_stream(info):
            return False
        on = [d for d in info.digits if d.dim == rank - 1]
        stat = _op_name(node) in ("mean", "var", "std", "norm", "linalg_vector_norm", "var_mean", "std_mean")
        return stat and len(on) == 1 and on[0].rep == 1 and on[0].span == self._size(info.space)

    def _trace_step(self, node: Any, dim: int) -> tuple[Any, int] | None:
        """One op back from ``node`` toward the parameter it reads: (its input, the input's dim that
        ``dim`` is), or None when the op is not shape-only along ``dim``."""
        from ptopt.compress.prune.layout import reshape

        if getattr(node, "op", None) not in ("call_function", "call_method"):
            return None
        name = _op_name(node)
        args = node.args
        src = args[0] if args and hasattr(args[0], "op") else None
        out = self._shape(node)
        if name == "embedding":  # (weight, ids): the last dim is the weight's dim 1
            return (args[0], 1) if dim == len(out) - 1 else None
        if name == "where" and len(args) == 3:
            src = next((a for a in args[1:] if hasattr(a, "op") and self._shape(a) and
                        len(self._shape(a)) > dim - (len(out) - len(self._shape(a))) >= 0 and
                        self._shape(a)[dim - (len(out) - len(self._shape(a)))] > 1), None)  # fmt: skip
            return (src, dim - (len(out) - len(self._shape(src)))) if src is not None else None
        if src is None or self._shape(src) is None:
            return None
        s = self._shape(src)
        if name in O.HANDLERS and O.HANDLERS[name] == "elementwise":
            others = [a for a in self._tensor_inputs(node) if a is not src]
            k = dim - (len(out) - len(s))
            ok = 0 <= k and s[k] == out[dim] and not any(self._varies(a, dim, len(out)) for a in others)
            return (src, k) if ok else None
        if name in ("reshape", "view", "unsafe_view", "reshape_as", "view_as", "flatten", "unflatten"):
            back = reshape((Digit(dim, 1, 1, out[dim]),), out, s)
            ok = back is not None and len(back) == 1 and back[0].rep == 1 and back[0].count == out[dim]
            return (src, back[0].dim) if ok else None
        moved = self._move_dims(node, name, s, out)
        if moved is None:
            return None
        back = {v: k for k, v in moved.items()}
        return (src, back[dim]) if dim in back and s[back[dim]] == out[dim] else None

    def _varies(self, node: Any, dim: int, rank: int) -> bool:
        """Whether ``node`` (broadcast to ``rank`` dims) has more than one position along ``dim``."""
        s = self._shape(node) or ()
        k = dim - (rank - len(s))
        return 0 <= k < len(s) and s[k] > 1

    def _move_dims(self, node: Any, name: str, s: tuple, out: tuple) -> dict[int, int] | None:
        """Input dim -> output dim of a transpose / permute / (un)squeeze / expand / select / slice /
        index (None for an op that is none of them, or an index along more than one dim)."""
        r, args = len(s), node.args
        if name in ("transpose", "swapaxes", "swapdims", "t"):
            a, b = (args[1] % r, args[2] % r) if len(args) >= 3 else (0, 1)
            return {k: (b if k == a else a if k == b else k) for k in range(r)}
        if name == "permute":
            dims = args[1] if isinstance(args[1], (list, tuple)) else args[1:]
            return {d % r: i for i, d in enumerate(dims)}
        if name in ("movedim", "moveaxis"):
            import torch

            return {k: int(v) for k, v in enumerate(torch.arange(r).movedim(args[1], args[2]).argsort())}
        if name == "unsqueeze":
            d = args[1] % (r + 1)
            return {k: k + (k >= d) for k in range(r)}
        if name == "squeeze":
            dims = [k for k in range(r) if s[k] == 1 and len(out) < r]
            if len(args) > 1:
                given = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
                dims = [d % r for d in given if s[d % r] == 1]
            return {k: k - sum(d < k for d in dims) for k in range(r) if k not in dims}
        if name in ("expand", "expand_as", "contiguous", "clone"):
            lead = len(out) - r
            return {k: k + lead for k in range(r)}
        if name == "select":
            d = args[1] % r
            return {k: k - (k > d) for k in range(r) if k != d}
        if name in ("slice", "narrow"):
            return {k: k for k in range(r)}
        if name == "getitem" and not any(hasattr(i, "op") for i in _as_tuple(args[1])):
            return _basic_index_dims(args[1], r)
        if name in ("index", "getitem") and isinstance(args[1], (list, tuple)):
            return self._index_dims(args[1], s, out)
        return None

    def _index_dims(self, indices: Any, s: tuple, out: tuple) -> dict[int, int] | None:
        """Input dim -> output dim of ``x[idx0, idx1, ...]`` (None for the dims taken whole), when one
        index tensor (or several adjacent ones) replaces the dims it indexes."""
        taken = [k for k, ix in enumerate(indices) if ix is not None and hasattr(ix, "op")]
        if not taken or taken != list(range(taken[0], taken[-1] + 1)):
            return None
        first = taken[0]
        added = len(out) - (len(s) - len(taken))
        mapping = {k: k for k in range(first)}
        mapping |= {k: k - len(taken) + added for k in range(taken[-1] + 1, len(s))}
        return mapping

    def _h_move(self, node: Any) -> _Info | None:
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s, out = self._shape(src), self._out_shape(node)
        moved = self._move_dims(node, _op_name(node), s, out)
        if moved is None or any(d.dim not in moved or out[moved[d.dim]] != s[d.dim] for d in info.digits):
            return self._unknown(node, _op_name(node))
        return _Info(info.space, tuple(d.moved(moved[d.dim]) for d in info.digits))

    def _block_split(self, node: Any, info: _Info, s: tuple, out: tuple) -> None:
        """A view that splits channels (``(B, T, C) -> (B, T, -1, head_dim)``, ``(B, N, 3, H, D)``) is
        written with the size of its innermost dim: channels then go in whole blocks of it. A size-1
        dim beside the channels is such a split (one head) where the code wrote the sizes (``view``,
        ``reshape``), not where it only matched another tensor (``reshape_as``)."""
        from ptopt.compress.prune.layout import groups

        sizes = (
            node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
        )
        sizes = list(sizes) if len(sizes) == len(out) else []
        for gin, gout in groups(list(s), list(out)) or []:
            mine = [d for d in info.digits if d.dim in gin]
            if len(gin) != 1 or not mine or any(d.stride != 1 or d.rep != 1 for d in mine):
                continue
            big = [k for k in gout if out[k] > 1]
            one_head = bool(sizes) and any(out[k] == 1 for k in gout)
            if len(big) > 1 or (big and one_head):
                self._block(info.space, out[big[-1]], node.name)

    def _h_reshape(self, node: Any) -> _Info | None:
        """view / reshape / flatten: the digits follow (``layout.reshape``): heads split off and merged
        back, channels folded into a linear's features, a channel shuffle."""
        from ptopt.compress.prune.layout import reshape

        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s, out = self._shape(src), self._out_shape(node)
        digits = reshape(info.digits, s, out)
        if digits is None:
            return self._unknown(node, _op_name(node))
        a = len(out) - 1
        folded = [d for d in digits if d.dim == a and d.rep > 1]
        if folded and node.op != "call_module" and tuple(out) == (*s[:a], math.prod(s[a:])):
            self.flatten_nodes[node.name] = a  # may hold hard-coded sizes: see rewrite_flattens
        self._block_split(node, info, s, out)
        stack = self._stack(node)
        for d in digits:
            split = (stack[-1] if stack else "", info.space, d.stride, d.count)
            if d.stride > 1 and d.rep == 1 and split not in self.head_splits:
                self.head_splits.append(split)
        return _Info(info.space, digits)

    # -- parts: select / slice / split / getitem / cat -------------------------------------------
    def _take(self, info: _Info, dim: int, lo: int, hi: int, drop_dim: bool, where: str) -> _Info | None:
        """Positions ``lo .. hi`` of ``dim``: the same channels (the whole range), a part of the
        space (the outer digit: q, k, v of a fused projection), or positions within a unit."""
        on = [d for d in info.digits if d.dim == dim]
        rest = tuple(
            d if not drop_dim or d.dim < dim else d.moved(d.dim - 1) for d in info.digits if d.dim != dim
        )
        if not on:
            return _Info(info.space, rest)
        (d,) = on if len(on) == 1 else (None,)
        whole = d is not None and (lo, hi) == (0, d.rep * d.count) and not drop_dim
        if whole:
            return info
        size = self._size(info.space)
        if d is not None and d.rep == 1 and d.span == size and d.count * d.rep >= hi:
            if len(info.digits) > 1:  # a reshaped fused projection (B, N, 3, H, D): q, k, v alike
                self._cut_even(info.space, d.stride, d.count, where)
            part = self._cut(info.space, lo * d.stride, hi * d.stride, where)
            if part is None:
                return None
            if drop_dim or hi - lo == 1:
                return _Info(part, rest) if drop_dim else _Info(part, (*rest, Digit(dim, d.stride, 1, 1)))
            return _Info(part, (*rest, Digit(dim, d.stride, 1, hi - lo)))
        for x in on:
            self._block(info.space, x.span, where)
        return _Info(info.space, rest)

    def _h_select(self, node: Any) -> _Info | None:
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s = self._shape(src)
        name = _op_name(node)
        dim = self._arg(node, 1, "dim", 0) % len(s)
        if name == "select":
            i = self._arg(node, 2, "index", 0) % s[dim]
            return self._take(info, dim, i, i + 1, True, node.name)
        start = self._arg(node, 2, "start", 0) or 0
        if name == "narrow":
            lo, hi, step = start % s[dim], start % s[dim] + self._arg(node, 3, "length", 0), 1
        else:
            end = self._arg(node, 3, "end", None)
            lo, hi = max(0, min(start + s[dim] if start < 0 else start, s[dim])), s[dim]
            if end is not None:
                hi = max(lo, min(end + s[dim] if end < 0 else end, s[dim]))
            step = self._arg(node, 4, "step", 1) or 1
        if step != 1:
            return self._drop(info, [dim], node.name)
        return self._take(info, dim, lo, hi, False, node.name)

    def _h_split(self, node: Any) -> list[Any] | None:
        """split / chunk / unbind: one info per piece (``getitem`` picks it)."""
        known = self._known(node)
        if not known:
            return None
        src, info = known[0]
        s = self._shape(src)
        name = _op_name(node)
        dim = self._arg(node, 2 if name != "unbind" else 1, "dim", 0) % len(s)
        n = s[dim]
        if name == "unbind":
            return [self._take(info, dim, i, i + 1, True, node.name) for i in range(n)]
        if name in ("chunk", "unsafe_chunk"):
            k = self._arg(node, 1, "chunks", 1)
            step = -(-n // k)
            sizes = [min(step, n - i) for i in range(0, n, step)]
        else:
            arg = self._arg(node, 1, "split_size", self._arg(node, 1, "split_sizes", n))
            sizes = (
                list(arg) if isinstance(arg, (list, tuple)) else [min(arg, n - i) for i in range(0, n, arg)]
            )
        on = [d for d in info.digits if d.dim == dim]
        if len(set(sizes)) == 1 and len(sizes) > 1 and on == [Digit(dim, 1, 1, n)]:
            self._cut_even(info.space, sizes[0], len(sizes), node.name)
            stack = self._stack(node)
            even = (stack[-1] if stack else "", info.space, sizes[0], len(sizes))
            if even not in self.even_splits:
                self.even_splits.append(even)
        out, at = [], 0
        for size in sizes:
            out.append(self._take(info, dim, at, at + size, False, node.name))
            at += size
        return out

    def _h_getitem(self, node: Any) -> Any:
        src = node.args[0]
        info = self._info.get(src)
        if isinstance(info, list) and isinstance(node.args[1], int):
            return info[node.args[1]] if node.args[1] < len(info) else None
        if isinstance(info, _Info) and self._shape(src) is not None:
            return self._basic_index(node, info, self._shape(src))
        return None

    def _basic_index(self, node: Any, info: _Info, s: tuple) -> _Info | None:
        """``x[:, 0]``, ``x[..., :n]``, ``x[:, None]`` (torch.fx): ints, slices, None and Ellipsis."""
        idx = _basic_indices(node.args[1], len(s))
        plain_slices = idx is not None and all(
            isinstance(b, (int, type(None)))
            for i in idx
            if isinstance(i, slice)
            for b in (i.start, i.stop, i.step)
        )
        if not plain_slices:
            return self._unknown(node, "getitem")
        shape, d, cur = list(s), 0, info
        for it in idx:
            if it is None:
                cur = _Info(cur.space, tuple(x.moved(x.dim + (x.dim >= d)) for x in cur.digits))
                shape.insert(d, 1)
                d += 1
            elif isinstance(it, int):
                i = it % shape[d]
                cur = self._take(cur, d, i, i + 1, True, node.name)
                shape.pop(d)
            else:
                lo, hi, step = it.indices(shape[d])
                cur = (
                    self._take(cur, d, lo, max(lo, hi), False, node.name)
                    if step == 1
                    else self._drop(cur, [d], node.name)
                )
                shape[d] = len(range(lo, hi, step))
                d += 1
            if cur is None:
                return None
        return cur

    def _h_index(self, node: Any) -> _Info | None:
        """``x[:, idx]`` (advanced indexing): fine along dims without channels."""
        known = self._known(node)
        if not known or known[0][0] is not node.args[0]:
            return self._unknown(node, "index") if known else None
        src, info = known[0]
        mapping = self._move_dims(node, "index", self._shape(src), self._out_shape(node))
        if mapping is None or any(d.dim not in mapping for d in info.digits):
            return self._unknown(node, "index")
        return _Info(info.space, tuple(d.moved(mapping[d.dim]) for d in info.digits))

    def _h_concat(self, node: Any) -> _Info | None:
        """Along the channels: a new space made of its inputs' channels at their offsets (a layer
        reading it cuts each part where it sits); along another dim: the inputs meet elementwise."""
        ins = [n for n in (node.args[0] if node.args else node.kwargs.get("tensors", [])) if hasattr(n, "op")]
        infos = [self._info.get(n) for n in ins]
        if not any(isinstance(i, _Info) for i in infos):
            return None
        shape = self._out_shape(node)
        dim = self._arg(node, 1, "dim", 0) % len(shape)
        if not any(d.dim == dim for i in infos if isinstance(i, _Info) for d in i.digits):
            return self._h_elementwise(node)
        parts: list[tuple[int | None, int, int]] = []
        offset = 0
        for n, info in zip(ins, infos, strict=True):
            size = self._shape(n)[dim]
            part = None
            if isinstance(info, _Info):
                if info.digits != plain(dim, size) or len(self._shape(n)) != len(shape):
                    self._freeze(info.space, f"concatenated at {node.name} in another layout")
                elif info.space in self._parts:
                    parts += [(p, offset + o, k) for p, o, k in self._parts[info.space]]
                    offset += size
                    continue
                else:
                    part = info.space
            parts.append((part, offset, size))
            offset += size
        space = self._new(offset)
        self._parts[space] = parts
        return _Info(space, plain(dim, offset))

    def _h_stack(self, node: Any) -> _Info | None:
        known = self._known(node)
        if not known:
            return None
        return self._unknown(node, "stack")

    # -- layers, norms and attention as functions ----------------------------------------------------
    def _param_module(self, node: Any) -> tuple[str, Any] | None:
        owner = self._owner(node) if hasattr(node, "op") else None
        if owner is None:
            return None
        mod = self.modules.get(owner[0])
        return (owner[0], mod) if mod is not None else None

    def _h_layer(self, node: Any) -> _Info | None:
        """``linear`` / ``conv*`` / ``convolution`` / ``addmm`` / ``mm`` reading a layer's weight (a
        subclass calling ``F.conv2d`` itself, GPT-2's ``Conv1D``)."""
        name = _op_name(node)
        if name == "addmm":
            x, w = node.args[1], node.args[2]
        else:  # F.linear(x, weight=..., bias=...): timm EVA's attention passes its own qkv bias by name
            x, w = self._arg(node, 0, "input"), self._arg(node, 1, "weight")
        found = self._param_module(w)
        if found is not None and L.kind(found[1]) == "embedding":
            found = self._tied_layer(node, found[1], ("linear", "conv1d_t")) or found  # a tied head
        normed = found is None and self._weight_normed(w)
        if normed:
            found = normed
        transposed = name == "convolution" and len(node.args) > 6 and node.args[6]
        if (
            found is None
            or transposed
            or not L.is_layer(found[1])
            or (not normed and self._owner(w)[1] != "weight")
            or not self._own_bias(node, name, found[0])
        ):
            return self._unknown(node, name)
        info = self._info.get(x)
        out = self._layer(node, found[0], found[1], x, info if isinstance(info, _Info) else None)
        for i in (info, out) if normed else ():
            if isinstance(i, _Info) and i.space not in self._parts:  # the norm spans the channels
                self._inexact.add(i.space)
                self._norm_at.setdefault(i.space, []).append((None, i.space, self._size(i.space), ()))
        return out

    def _own_bias(self, node: Any, name: str, layer: str) -> bool:
        """Whether a layer called as a function adds no bias or its own: a bias held elsewhere (timm EVA's
        ``q_bias`` / ``v_bias``, passed by name) would keep its full width while the layer's outputs go."""
        bias = None if name in ("addmm", "mm") else self._arg(node, 2, "bias")
        return bias is None or self._owner(bias) == (layer, "bias")

    def _weight_normed(self, w: Any) -> tuple[str, Any] | None:
        """(path, layer) of a weight-normalised layer (``parametrizations.weight``: the weight is
        ``_weight_norm(original1, original0, dim)``, wav2vec2's positional convolution), else None."""
        if getattr(w, "op", None) != "call_function" or _op_name(w) != "weight_norm" or not w.args:
            return None
        owner = self._owner(w.args[0])
        path, sep, _ = (owner[0] if owner else "").rpartition(".parametrizations.")
        mod = self.modules.get(path) if sep and owner[0].endswith(".weight") else None
        return (path, mod) if mod is not None and L.is_layer(mod) else None

    def _tied_layer(self, node: Any, holder: Any, kinds: tuple[str, ...]) -> tuple[str, Any] | None:
        """The module of one of ``kinds`` that ``node`` ran inside whose weight is ``holder``'s: a
        tied embedding and output head share one parameter, which the graph names after one of them."""
        for path in reversed(self._stack(node)):
            mod = self.modules.get(path)
            if mod is not None and L.kind(mod) in kinds and getattr(mod, "weight", None) is holder.weight:
                return path, mod
        return None

    def _h_norm(self, node: Any) -> _Info | None:
        """Functional batch_norm / layer_norm / group_norm / rms_norm (timm's BatchNormAct2d calls
        ``F.batch_norm`` itself): tied to the module whose parameters it reads."""
        op = _op_name(node)
        x = node.args[0]
        info = self._info.get(x)
        if not isinstance(info, _Info):
            return None
        want = {"batch_norm": "batch_norm", "layer_norm": "layer_norm", "rms_norm": "layer_norm",
                "group_norm": "group_norm"}[op]  # fmt: skip
        for arg in [*node.args[1:], *node.kwargs.values()]:
            found = self._param_module(arg) if hasattr(arg, "op") else None
            if found is not None and L.kind(found[1]) == want:
                return self._norm(node, found[0], found[1], want, x, info)
        if found is None and op == "batch_norm" and all(d.dim == 1 for d in info.digits):
            return info  # no parameters, no statistics: per channel
        return self._unknown(node, op)

    def _h_matmul(self, node: Any) -> _Info | None:
        """``a @ b`` of two activations (attention scores, attention times values): batch dims meet
        like an elementwise op, the contracted dim is mixed (whole heads), rows come from a,
        columns from b. With a layer's weight it is that layer."""
        a, b = node.args[0], node.args[1]
        if self._param_module(b) is not None:
            return self._h_layer(node)
        ia, ib = self._info.get(a), self._info.get(b)
        ia, ib = (i if isinstance(i, _Info) else None for i in (ia, ib))
        if ia is None and ib is None:
            return None
        sa, sb, out = self._shape(a), self._shape(b), self._out_shape(node)
        if len(sa) < 2 or len(sb) < 2:
            return self._unknown(node, "matmul")
        ra, rb, r = len(sa), len(sb), len(out)
        if ia is not None:
            ia = self._drop(ia, [ra - 1], node.name)
        if ib is not None:
            ib = self._drop(ib, [rb - 2], node.name)
        ea = _Info(ia.space, tuple(d.moved(d.dim + r - ra) for d in ia.digits)) if ia else None
        eb = _Info(ib.space, tuple(d.moved(d.dim + r - rb) for d in ib.digits)) if ib else None
        entries = [(a, ia, r - ra), (b, ib, r - rb)]
        tracked = [(n, e, k) for (n, _, k), e in zip(entries, (ea, eb), strict=True) if e is not None]
        keep: dict[int, bool] = {
            dim: self._tie(node, dim, out[dim], entries, tracked) for dim in range(r - 2)
        }
        main = eb if eb is not None and any(d.dim == r - 1 for d in eb.digits) else (ea or eb)
        other = ea if main is eb else eb
        if other is not None:
            for d in other.digits:
                if d.dim >= r - 2:  # rows of a and columns of b from two spaces: one is kept
                    self._block(other.space, d.span, node.name)
        digits = [d for d in main.digits if (d.dim >= r - 2 or keep.get(d.dim, True))]
        if main is eb:
            digits = [d for d in digits if d.dim != r - 2]
        else:
            digits = [d for d in digits if d.dim != r - 1]
        return _Info(main.space, tuple(digits))

    def _h_sdpa(self, node: Any) -> _Info | None:
        """``scaled_dot_product_attention(q, k, v, mask)``: q, k and v heads are cut together (with
        grouped-query attention a kv head goes with its q heads), a head's own dim is mixed, the
        mask (a position bias table per head) is cut with them; the output has v's channels."""
        q, k, v = node.args[:3]
        mask = self._arg(node, 3, "attn_mask", None)
        infos = [self._info.get(n) for n in (q, k, v)]
        infos = [i if isinstance(i, _Info) else None for i in infos]
        out = self._out_shape(node)
        r = len(out)
        if r < 3:
            return self._unknown(node, "scaled_dot_product_attention")
        for info in infos:
            if info is not None and any(d.dim == r - 2 for d in info.digits):
                return self._unknown(node, "scaled_dot_product_attention")
        iq, ik, iv = infos
        if iq is not None:
            iq = self._drop(iq, [r - 1], node.name)
        if ik is not None:
            ik = self._drop(ik, [r - 1], node.name)
        hq = self._shape(q)[r - 3]
        entries = []
        for n, info in ((q, iq), (k, ik), (v, iv)):
            rep = hq // self._shape(n)[r - 3]
            if info is not None and rep > 1:  # grouped-query attention: kv head h serves q heads h*rep..
                info = _Info(info.space, tuple(Digit(d.dim, d.stride, d.rep * rep, d.count) if d.dim == r - 3 else d
                                              for d in info.digits))  # fmt: skip
            entries.append((n, info, 0))
        if hasattr(mask, "op") and self._shape(mask) is not None:
            entries.append((mask, self._info.get(mask), r - len(self._shape(mask))))
        tracked = [(n, i, k) for n, i, k in entries if isinstance(i, _Info)]
        if not tracked:
            return None
        kept = [dim for dim in range(r - 2) if self._tie(node, dim, out[dim], entries, tracked)]
        v_out = entries[2][1]
        if v_out is None:
            return None
        return _Info(v_out.space, tuple(d for d in v_out.digits if d.dim in kept or d.dim >= r - 2))


def _as_tuple(index: Any) -> tuple:
    return tuple(index) if isinstance(index, (list, tuple)) else (index,)


def _basic_indices(index: Any, r: int) -> tuple | None:
    """``x[index]`` on a rank-``r`` tensor as one entry per dim it reads (ints and slices; None adds a
    dim; Ellipsis expanded, trailing dims ``:``), or None when it is not basic indexing (a list is
    advanced indexing; ``x[True]`` adds a dim as None does, and is not followed)."""
    if isinstance(index, list):
        return None
    idx = _as_tuple(index)
    if any(isinstance(i, bool) for i in idx) or not all(
        i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in idx
    ):
        return None
    named = sum(i is not None and i is not Ellipsis for i in idx)
    if Ellipsis in idx:
        at = idx.index(Ellipsis)
        idx = idx[:at] + (slice(None),) * (r - named) + idx[at + 1 :]
    return idx + (slice(None),) * (r - sum(i is not None for i in idx))


def _basic_index_dims(index: Any, r: int) -> dict[int, int] | None:
    """Input dim -> output dim of ``x[index]`` (``_basic_indices``: an int drops its dim, None adds
    one); None for anything else."""
    idx = _basic_indices(index, r)
    if idx is None:
        return None
    mapping, k, o = {}, 0, 0
    for i in idx:
        if i is None:
            o += 1
        elif isinstance(i, int):
            k += 1
        else:
            mapping[k], k, o = o, k + 1, o + 1
    return mapping
