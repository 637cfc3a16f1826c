"""Shared by the benchmark scripts: the machine header every table carries, and where results go.

Each script ``benchmarks/bench_<name>.py`` runs with ``python benchmarks/bench_<name>.py``, prints
its table, and writes ``benchmarks/results/<name>.md`` (+ ``.json``); ``python benchmarks/collect.py``
assembles them into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def machine_header(threads: int) -> str:
    from ptopt.core.system import cpu_info, library_versions

    cpu = cpu_info()
    isa = ", ".join(k for k, v in cpu["isa"].items() if v) or "none of the tracked"
    v = library_versions()
    libs = ", ".join(f"{k} {v[k]}" for k in ("torch", "onnxruntime", "onnx", "torchao") if k in v)
    return (
        f"Machine: {cpu['model']} ({cpu['arch']}, {cpu['usable_cores']} usable cores; ISA: {isa}); "
        f"threads: {threads}; Python {v['python']}; {libs}."
    )


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def write_result(
    name: str,
    title: str,
    markdown: str,
    data: Any,
    threads: int,
    command: str | None = None,
    machine: str | None = None,
) -> str:
    """Write results/<name>.md and .json; returns the markdown section. ``machine``: the header of the machine
    the figures came from, when the tables are written again elsewhere (default: this machine's)."""
    RESULTS.mkdir(exist_ok=True)
    command = command or f"python benchmarks/bench_{name}.py"
    section = f"## {title}\n\n{machine or machine_header(threads)}\n\nReproduce: `{command}`\n\n{markdown}\n"
    (RESULTS / f"{name}.md").write_text(section, encoding="utf-8")
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    print(section)
    return section


def setup(threads: int = 2) -> int:
    """Pin threads (torch intra-op) for a fair comparison; quiet upstream deprecation noise."""
    import warnings

    import torch

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    sys.path.insert(0, str(HERE.parent))
    _quiet_torchao()
    return threads


def _quiet_torchao() -> None:
    """torchao imported once now, as ptopt's commands import it (``ptopt.core.quiet.quiet_imports``): its
    import notices (``Skipping import of cpp extensions``, ``Failed to load ..._C_mxfp8...so``, torch's
    ``_pytree`` deprecations of its Enums) are dropped, and a later import anywhere is silent."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return
    from ptopt.core.quiet import quiet_imports

    with quiet_imports():
        import torchao  # noqa: F401
