"""A pytest plugin that runs only the test node ids listed in the file ``$PTOPT_SELECT_IDS`` (one per line).

``benchmarks/gpu_session.sh`` (``CPU2=FILE``) times the same tests on another machine's CPU as on this one:
node ids hold brackets and spaces that a shell command line would split, and ``pytest @file`` needs pytest 8.2.
Load it with ``-p select_ids`` and ``benchmarks/`` on ``PYTHONPATH``."""

from __future__ import annotations

import os
from pathlib import Path


def pytest_collection_modifyitems(config, items) -> None:
    path = os.environ.get("PTOPT_SELECT_IDS")
    if not path:
        return
    wanted = {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
    keep = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
    items[:] = keep
