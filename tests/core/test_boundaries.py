"""core imports no stage, not even lazily; stages reach core through registries (MODEL schemes)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from ptopt.core import schemes
from ptopt.core.errors import ModelLoadError
from ptopt.core.modelref import load_model
from tests.helpers import assert_refused, tiny_cnn

CORE = Path(__file__).resolve().parents[2] / "core"
STAGES = ("compress", "export", "validate", "serve", "models", "cli", "optimize")


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "ptopt" and len(parts) > 1 and parts[1] in STAGES:
        return parts[1]
    return None


def _stage_imports(source: str) -> list[str]:
    """Every stage a module reaches: import statements anywhere (inside functions too), relative
    imports that leave core, and ``importlib.import_module`` / ``__import__`` of a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _stage_of(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level >= 2:  # from .. import X / from ..X import Y, seen from ptopt.core
                base = ".".join(["ptopt", *filter(None, [node.module])])
            else:
                base = node.module or ""
            if node.level == 1:
                continue  # a sibling inside core
            names = [base] if _stage_of(base) else []
            if base == "ptopt":
                names += [f"ptopt.{a.name}" for a in node.names if a.name in STAGES]
            found += names
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            arg = node.args[0].value
            if name in ("import_module", "__import__") and isinstance(arg, str) and _stage_of(arg):
                found.append(arg)
    return found


@pytest.mark.parametrize(
    "source,expected",
    [
        ("import ptopt.models", ["ptopt.models"]),
        ("def f():\n    from ptopt.compress.trainer import train", ["ptopt.compress.trainer"]),
        ("from ptopt import export, core", ["ptopt.export"]),
        ("from ..validate import api", ["ptopt.validate"]),
        ("import importlib\nimportlib.import_module('ptopt.serve.package')", ["ptopt.serve.package"]),
        ("from ptopt.core.errors import UsageError\nfrom .data import load_data", []),
    ],
    ids=["import", "lazy-from", "from-ptopt", "relative", "import_module", "core-only"],
)
def test_the_checker_sees_every_form(source, expected):
    assert _stage_imports(source) == expected


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_no_stage(path):
    assert _stage_imports(path.read_text(encoding="utf-8")) == [], f"{path.name} imports a stage"


def test_importing_all_of_core_loads_no_stage():
    """At run time too: ``import ptopt`` plus every core module leaves the stages unloaded (and zoo:
    is registered all the same, without torch)."""
    names = [f"ptopt.core.{p.stem}" for p in sorted(CORE.glob("*.py")) if p.stem != "__init__"]
    code = (
        "import sys, importlib, ptopt\n"
        "assert 'torch' not in sys.modules, 'import ptopt imported torch'\n"
        "from ptopt.core.schemes import model_scheme\n"
        "assert model_scheme('zoo:resnet') is not None\n"
        f"for n in {names!r}: importlib.import_module(n)\n"
        f"stages = sorted(m for m in sys.modules if m.split('.')[:2][-1] in {STAGES!r} and m.startswith('ptopt.'))\n"
        "assert not stages, stages\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture
def demo_scheme(monkeypatch):
    """A scheme registered the way a stage registers one (restored afterwards)."""
    monkeypatch.setattr(schemes, "_SCHEMES", dict(schemes._SCHEMES))
    calls = []

    def loader(name):
        calls.append(name)
        model = tiny_cnn()
        from ptopt.core.inputspec import input_style, specs_from_example

        x = model.example_inputs()
        return model, specs_from_example(x), input_style(x)

    schemes.register_model_scheme("demo", loader, "tiny test models")
    return calls


def test_registered_scheme_resolves(demo_scheme):
    lm = load_model("demo:cnn")
    assert demo_scheme == ["cnn"] and lm.format == "eager" and not lm.module.training
    assert lm.info == {"demo": "cnn"} and lm.input_specs[0].opt_shape == (2, 1, 8, 8)


def test_scheme_registered_twice_with_another_loader_is_an_error(demo_scheme):
    with pytest.raises(RuntimeError, match="registered twice"):
        schemes.register_model_scheme("demo", lambda name: None)


@pytest.mark.parametrize(
    "ref,kwargs,match",
    [
        ("zoo:nope", {}, "unknown zoo model 'nope' (known: lstm, mobilenet, resnet, transformer)"),
        (
            "zoo:resnet",
            {"weights": "w.pt"},
            "--weights goes with a pkg.module:factory model, not with zoo:NAME",
        ),
        ("demo:cnn", {"weights": "w.pt"}, "not with demo:NAME"),
        (
            "nothing_here.pt",
            {},
            "forms: model.pt, model.onnx, model.xml, model.ep, model.pt2, pkg.module:factory, demo:NAME, zoo:NAME",
        ),
    ],
    ids=["unknown-zoo-name", "zoo-with-weights", "scheme-with-weights", "forms-list-schemes"],
)
def test_scheme_refusals(tmp_path, monkeypatch, demo_scheme, ref, kwargs, match):
    monkeypatch.chdir(tmp_path)
    assert_refused(load_model, ref, match=match, where=tmp_path, error=ModelLoadError, **kwargs)
