"""The house rules of the code base, checked on the source (ast): short functions, few parameters
outside the public twins, no import loop inside a package, and the layering of the format table
(``ptopt.formats`` imports core only; core reads the table without importing it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = (
    "core",
    "formats",
    "compress",
    "export",
    "validate",
    "optimize",
    "serve",
    "cli",
    "models",
    "ptopt",
)
STAGES = ("compress", "export", "validate", "optimize", "serve", "cli", "models")
MAX_LINES = 80
#: every function, the twins and the click commands included: a command's options are one ``**options``
#: (their declarations are the config fields, ``ptopt.core.options``), not a parameter each
MAX_PARAMS = 12


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if ".venv" not in p.parts)


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _params(fn: ast.FunctionDef) -> int:
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    return n - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_library_function_over_80_lines(package):
    long = [
        f"{p.relative_to(REPO)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
        for p in _modules(package)
        for fn in _functions(p)
        if fn.end_lineno - fn.lineno + 1 > MAX_LINES
    ]
    assert not long, long


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_over_12_parameters(package):
    many = [
        f"{p.relative_to(REPO)}:{fn.lineno} {fn.name} ({_params(fn)} parameters)"
        for p in _modules(package)
        for fn in _functions(p)
        if _params(fn) > MAX_PARAMS
    ]
    assert not many, many


def _imports(path: Path, package: str, mods: set[str] = frozenset()) -> set[str]:
    """The modules of ``ptopt.<package>`` this module imports, at module level or inside a function
    (a lazy import is an edge all the same: the loop it closes runs at run time), or through importlib:
    ``importlib.import_module("ptopt...")``, and every module of a package it walks with
    ``pkgutil.iter_modules(PKG.__path__)`` to import (a table filled by its folder's modules)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prefix = "ptopt" if package == "ptopt" else f"ptopt.{package}"
    found, bound = set(), {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            bound |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
        found |= {n for n in names if n == prefix or n.startswith(prefix + ".")}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        arg = node.args[0] if node.args else None
        if node.func.attr == "import_module" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.add(arg.value)
        walked = isinstance(arg, ast.Attribute) and arg.attr == "__path__" and isinstance(arg.value, ast.Name)
        if node.func.attr == "iter_modules" and walked and arg.value.id in bound:
            pkg = bound[arg.value.id]
            found |= {m for m in mods if m.startswith(pkg + ".")}
    return {n for n in found if n == prefix or n.startswith(prefix + ".")}


def _module_name(path: Path, package: str) -> str:
    rel = path.relative_to(REPO / package).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["ptopt"] + ([] if package == "ptopt" else [package]) + parts)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_loop_inside_a_package(package):
    """Modules of one package import each other one way only (a package's ``__init__`` re-exporting
    its modules is not an edge back: it is skipped as a target)."""
    mods = {_module_name(p, package): p for p in _modules(package) if p.name != "__init__.py"}
    graph = {m: {i for i in _imports(p, package, set(mods)) if i in mods and i != m} for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import loop: " + " -> ".join(trail[trail.index(n) :] + [n]))
            if n not in state:
                visit(n, trail + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_formats_import_core_only():
    """The format rows sit between core and the stages: a stage may read them, they read no stage."""
    bad = []
    for p in _modules("formats"):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            mod = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [mod or ""]
            bad += [
                f"{p.name}: {n}"
                for n in names
                if n and n.split(".")[:2][-1] in STAGES and n.startswith("ptopt.")
            ]
    assert not bad, bad


def test_every_export_target_is_one_module_of_the_table():
    """Each target is a row of the table, defined in its own module of ptopt.formats."""
    import ptopt  # noqa: F401 - registers the rows
    from ptopt.core.formats import targets

    for target, row in targets().items():
        module = type(row).__module__
        assert module.startswith("ptopt.formats."), (target, module)
        assert row.suffix and row.label, target


def test_the_files_run_first_exist():
    """tests/conftest.py runs these first; a renamed file would silently lose its place."""
    from tests.conftest import LONGEST_FIRST

    assert all((REPO / path).is_file() for path in LONGEST_FIRST), LONGEST_FIRST


def test_the_benchmarks_import_what_exists():
    """Every ``from ptopt.X import Y`` of the benchmark scripts resolves (a moved module breaks a
    benchmark only when someone runs it, long after the move)."""
    import importlib

    missing = []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ptopt")):
                continue
            try:
                module = importlib.import_module(node.module)
            except ImportError as e:
                missing.append(f"{path.name}: {node.module} ({e})")
                continue
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{path.name}: {node.module}.{alias.name}")
    assert not missing, missing
