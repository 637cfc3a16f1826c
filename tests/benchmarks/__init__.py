"""Tests of the benchmark scripts (benchmarks/*.py), each loaded from its file under a test-only name."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

from tests.conftest import REPO


@contextlib.contextmanager
def bench_script(name: str) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` as a module, registered in ``sys.modules`` while in use (dataclasses look
    their module up by name)."""
    key = f"ptopt_{name}_under_test"
    spec = importlib.util.spec_from_file_location(key, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(key, None)
