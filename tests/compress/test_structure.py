"""The shape of ``compress/`` (issue 26), checked on the source: only the engine files import the
quantization stacks, no import loop among compress modules (at import time nor through the imports
functions make when they run), the CLI's choices are the technique table's keys, reading the table
imports no torch, and no function outgrows the limits."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_refused

ROOT = Path(__file__).resolve().parents[2]
COMPRESS = ROOT / "compress"
#: the only importer of each upstream quantization stack
ENGINES = {
    "torch.ao": {"compress/quantize/engine_fx.py"},
    "torchao": {"compress/quantize/engine_pt2e.py", "compress/quantize/engine_torchao.py"},
}


def _module_name(path: Path) -> str:
    parts = ["ptopt", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(COMPRESS.rglob("*.py"))}


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported(tree: ast.AST, *, runtime: bool) -> list[str]:
    """Every module name an import of ``tree`` names (``from X import n`` names X and X.n):
    statements that run when the module is imported (``runtime=False``: not inside functions), or
    also those inside functions (``runtime=True``), plus ``importlib.import_module("literal")``.
    ``if TYPE_CHECKING:`` blocks never run and are left out."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if not runtime and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append(child.module)
                found.extend(f"{child.module}.{a.name}" for a in child.names)
            elif isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant):
                fn = child.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if name in ("import_module", "__import__") and isinstance(child.args[0].value, str):
                    found.append(child.args[0].value)
            visit(child)

    visit(tree)
    return found


def _uses(tree: ast.AST, stack: str) -> bool:
    """Whether ``tree`` imports ``stack`` (anywhere, inside functions too) or reaches it as an
    attribute (``torch.ao.quantization...`` after ``import torch``)."""
    names = _imported(tree, runtime=True)
    if any(n == stack or n.startswith(stack + ".") for n in names):
        return True
    return any(
        isinstance(node, ast.Attribute) and ast.unparse(node).startswith(stack + ".")
        for node in ast.walk(tree)
    )


@pytest.mark.parametrize(
    "source, stack, expected",
    [
        ("def f():\n    import torch.ao.quantization as tq", "torch.ao", True),
        ("from torch.ao.quantization import QConfig", "torch.ao", True),
        ("import torch\nx = torch.ao.nn.quantized", "torch.ao", True),
        ("import importlib\nimportlib.import_module('torchao.quantization')", "torchao", True),
        ("def f():\n    from torchao.quantization.pt2e import quantize_pt2e", "torchao", True),
        ("import torch\nx = torch.nn.Linear", "torch.ao", False),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torchao", "torchao", False),
    ],
    ids=["lazy", "from", "attribute", "import_module", "lazy-from", "other", "type-checking"],
)
def test_the_checker_sees_every_form(source, stack, expected):
    assert _uses(ast.parse(source), stack) is expected


@pytest.mark.parametrize("stack", sorted(ENGINES))
def test_only_the_engine_file_imports_its_stack(stack):
    """``engine_fx`` is the only module of compress that imports torch.ao, ``engine_pt2e`` (PT2E) and
    ``engine_torchao`` (weight-only) the only ones that import torchao (issue 26: "the ONLY module
    that imports torch.ao" was false)."""
    users = {
        p.relative_to(ROOT).as_posix() for p in MODULES.values() if _uses(ast.parse(p.read_text()), stack)
    }
    assert users == ENGINES[stack]


def _graph(runtime: bool) -> dict[str, set[str]]:
    """compress module -> the compress modules its imports load (a package's ``__init__`` counts:
    importing ``a.b.c`` runs ``a.b`` first)."""
    graph = {}
    for name, path in MODULES.items():
        edges = set()
        for imported in _imported(ast.parse(path.read_text()), runtime=runtime):
            parts = imported.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(MODULES)
        graph[name] = edges - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop of ``graph`` (its modules in order), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_loop_finder_finds_a_loop():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("runtime", [False, True], ids=["import-time", "with-function-imports"])
def test_no_import_loop_among_compress_modules(runtime):
    """Acyclic at import time (module-level imports), and also counting the imports functions make
    when they run (the 8-file loop issue 26 counted was made of those)."""
    graph = _graph(runtime)
    assert len(graph) > 20 and "ptopt.compress.quantize.flow" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_cli_choices_are_the_table_keys(cli, tmp_path):
    """--mode lists the table's modes; an engine the table does not have is refused naming those it has."""
    from ptopt.cli.quantize import command
    from ptopt.compress.quantize import table

    (mode,) = [p for p in command.params if p.name == "mode"]
    assert mode.metavar.split("|") == table.modes() == ["dynamic", "static", "qat", "weight-only"]
    assert set(table.modes()) == {m for m, _ in table.table()}
    assert table.engines() == ["fx", "openvino", "pt2e", "torchao", "auto"]
    assert set(table.engines()) == {e for _, e in table.table()}
    msg = assert_refused(
        cli,
        "quantize",
        "zoo:lstm",
        "--mode",
        "dynamic",
        "--engine",
        "bogus",
        "-o",
        tmp_path / "x.pt",
        where=tmp_path,
    )
    assert "choose from fx, openvino, pt2e, torchao, auto" in msg


def test_every_row_is_its_config_run_by_its_engine():
    from ptopt.compress.quantize import table
    from ptopt.compress.quantize.config import CONFIGS
    from ptopt.core.config import config_from_dict

    rows = table.table()
    assert {m for m, _ in rows} == set(CONFIGS)
    for (mode, engine), row in rows.items():
        assert row.mode == mode and row.engine == engine and row.config is CONFIGS[mode]
        assert config_from_dict({"type": row.config.type_name, "engine": engine}).engine == engine
    assert not rows[("qat", "fx")].gated and rows[("static", "fx")].gated  # QAT trains: recorded only


def test_reading_the_table_and_validating_a_config_import_no_torch():
    """The CLI reads the table for its choices, and every config validates itself: neither imports
    torch, let alone an engine."""
    code = (
        "import sys\n"
        "from ptopt.compress.quantize import table\n"
        "from ptopt.compress.quantize.config import StaticQuantConfig\n"
        "from ptopt.compress.quantize.resolve import check_engine\n"
        "from ptopt.core.errors import UsageError\n"
        "table.table(); check_engine(StaticQuantConfig(engine='pt2e'))\n"
        "try:\n    check_engine(StaticQuantConfig(engine='pt2e', backend='qnnpack'))\nexcept UsageError:\n    pass\n"
        "else:\n    raise AssertionError('pt2e on qnnpack accepted')\n"
        "assert not [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'torchao'))], 'torch'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
