"""Sizes a module's own code splits channels at, following the pruned channels.

timm's ``CrossStage`` (cspresnet50, CSPDarkNet) splits its expanded channels in two with
``x.split(self.expand_chs // 2, dim=1)``: the graph cuts both halves alike (``spaces._cut_even``), but its
forward still splits at the old size and fails. When a forward fails that way, each module that split
channels into equal pieces has its integer attributes holding the old total or the old piece size set
to the new ones, once, and the forward is run again. That is kept only when the model then computes what
the unpruned one computes with the removed channels masked (``techniques/structured._runnable_following``);
else the first failure stands and its module type is kept whole, as before. Head-count attributes of
attention are ``attention.follow_heads``'s.
"""

from __future__ import annotations

from typing import Any


def follow_splits(modules: dict[str, Any], splits: list[tuple[str, int, int, int]]) -> list[str]:
    """Set the attributes of each module in ``splits`` (``(module path, old piece size, pieces, new
    piece size)``) that hold the old total (``pieces x size``) or the old piece size. Returns what was
    changed (``path.attr: old → new``), for the report; ``[]`` when nothing matched or two splits ask
    different values of one attribute."""
    changes: dict[tuple[str, str], tuple[int, int]] = {}
    for path, size, pieces, new in splits:
        mod = modules.get(path)
        if mod is None or new == size or new <= 0:
            continue
        for attr, value in vars(mod).items():
            if attr.startswith("_") or not isinstance(value, int) or isinstance(value, bool):
                continue
            after = {size * pieces: new * pieces, size: new}.get(value)
            if after is None:
                continue
            if changes.get((path, attr), (value, after)) != (value, after):
                return []
            changes[(path, attr)] = (value, after)
    for (path, attr), (_, after) in changes.items():
        setattr(modules[path], attr, after)
    return [f"{path}.{attr}: {before} → {after}" for (path, attr), (before, after) in changes.items()]
