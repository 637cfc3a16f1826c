"""Each option is declared once (a config field, ``ptopt.core.options``) and the CLI calls the Python
twin: this walks every option of every command, at every mode/target, and proves the CLI and the twin
accept and refuse the same things: the same resolved configs, or the same one-line refusal (exit 2
naming the option where it does not apply). Nothing runs past the options' resolution (a patched
resolver stops there), so the walk takes seconds."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest

from ptopt.core.errors import PtoptError, UsageError
from tests.helpers import assert_refused


class _Resolved(PtoptError):
    """Raised by the patched resolver with what it resolved (exit 9: neither success nor refusal)."""

    exit_code = 9


# the CLI reports errors of ptopt's own modules as one line and their exit code (others are exit 3)
_Resolved.__module__ = "ptopt.tests"


@dataclasses.dataclass(frozen=True)
class Case:
    """One command: its ``Options`` (``module:attr``), the resolver its twin calls (patched where the
    twin's module looks it up), the CLI's leading arguments, and the twin with its leading arguments."""

    spec: str
    resolver: str
    cli: tuple[str, ...]
    twin: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


CASES = {
    "quantize": Case(
        "ptopt.compress.quantize.config:OPTIONS",
        "ptopt.compress.quantize.api:resolve_config",
        ("quantize", "zoo:resnet", "-o", "out.pt"),
        "ptopt.compress.quantize.api:quantize",
        ("zoo:resnet",),
        {"output": "out.pt"},
    ),
}

#: values for options whose default is "not given" (None) or not a value the walk can send
SAMPLES = {
    "max_accuracy_drop": 1.0,
    "min_cosine": 0.99,
    "tuning_budget": "4",
    "threads": 1,
    "group_size": 64,
    "decode_step": 8,
    "float_modules": ("layers.0",),
}
#: the options another option needs beside it to be accepted (as both the CLI and the twin take them)
COMPANIONS = {
    "compile": {"engine": "pt2e"},
    "tuning_budget": {"min_cosine": 0.99},
    "threads": {"min_cosine": 0.99},
}


def _obj(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _sample(spec: Any, d: Any, choice: str | None, value: Any = None) -> tuple[Any, list[str]]:
    """(the Python value, the CLI arguments) of one option where the selector chose ``choice``: a
    value of the config that choice uses (its default, flipped for a flag)."""
    owner = spec.selector.config(choice) if choice and spec.selector.config else None
    defaults = [v for c, v in d.defaults if c is owner] or [v for _, v in d.defaults]
    if value is not None:
        pass
    elif d.name in SAMPLES:
        value = SAMPLES[d.name]
    elif d.kind is bool:
        value = not defaults[0]
    else:
        value = next(v for v in defaults if v not in (None, ()))
    if d.kind is bool:
        flag = d.flag if not d.opt.toggle else (d.flag if value else "--no-" + d.flag[2:])
        return value, [flag]
    if d.opt.repeat:
        return value, [a for v in value for a in (d.flag, str(v))]
    return value, [d.flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]


def _walk() -> list[tuple[str, str, str | None]]:
    out = []
    for command, case in CASES.items():
        spec = _obj(case.spec)
        choices = list(spec.selector.choices()) if spec.selector else [None]
        for name in spec.declared():
            out += [(command, name, c) for c in choices]
    return out


def _outcome(fn) -> tuple[str, Any]:
    try:
        fn()
    except _Resolved as r:
        return "resolved", r.args[0]
    except UsageError as e:
        return "refused", str(e)
    raise AssertionError("the resolver was not reached")


@pytest.mark.parametrize(("command", "name", "choice"), _walk(), ids=lambda v: str(v))
def test_cli_and_twin_accept_and_refuse_the_same(cli, monkeypatch, command, name, choice):
    case = CASES[command]
    spec = _obj(case.spec)
    d = spec.declared()[name]
    value, args = _sample(spec, d, choice)
    extra: dict[str, Any] = {}
    applies = spec.applies(name, choice)
    for other, v in COMPANIONS.get(name, {}).items() if applies else ():
        extra[other] = v
        args += _sample(spec, spec.declared()[other], choice, v)[1]
    module, _, attr = case.resolver.partition(":")
    real = _obj(case.resolver)

    seen: list[Any] = []

    def stop(*a: Any, **kw: Any) -> Any:
        seen.append(real(*a, **kw))
        raise _Resolved(seen[-1])

    monkeypatch.setattr(importlib.import_module(module), attr, stop)
    sel = [spec.selector.cli_flag, choice] if choice else []
    py_sel = {spec.selector.name: choice} if choice else {}
    twin = _obj(case.twin)
    by_twin = _outcome(lambda: twin(*case.args, **case.kwargs, **py_sel, **extra, **{name: value}))
    if d.opt.cli:
        code, out, err = cli(*case.cli, *sel, *args)
        by_cli = ("resolved", seen[-1]) if code == 9 else ("refused", err.strip().removeprefix("error: "))
        assert code in (2, 9), (code, err)
        if by_cli[0] == "refused":
            assert len(err.strip().splitlines()) == 1, err
    else:
        by_cli = by_twin
    assert by_twin == by_cli
    if not applies:
        assert by_twin[0] == "refused" and d.flag in by_twin[1], by_twin
    else:
        assert by_twin[0] == "resolved", by_twin
        assert _field_values(by_twin[1], name) == value, by_twin[1]


def _field_values(resolved: Any, name: str) -> Any:
    for obj in resolved if isinstance(resolved, tuple) else (resolved,):
        if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
            return getattr(obj, name)
    raise AssertionError(f"{name} not in {resolved!r}")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--mode", "weight-only", "--bits", "4", "--max-accuracy-drop", "1"), "--max-accuracy-drop"),
        (("--mode", "dynamic", "--group-size", "64", "--min-cosine", "0.98"), "--group-size"),
        (("--mode", "static", "--epochs", "2"), "--epochs"),
        (("--mode", "dynamic", "--observer", "minmax"), "--observer"),
    ],
    ids=["weight-only-search", "dynamic-group-size", "static-epochs", "dynamic-observer"],
)
def test_an_option_of_another_mode_is_one_line_naming_it(cli, tmp_path, args, flag):
    """The two bugs of issue 39 (exit 3, a TypeError from inside) and their kind: exit 2 naming it."""
    assert_refused(cli, "quantize", "zoo:resnet", *args, "-o", tmp_path / "q.pt", match=flag, where=tmp_path)
    kwargs = {a[2:].replace("-", "_"): v for a, v in zip(args[::2], args[1::2], strict=True)}
    import ptopt

    assert_refused(ptopt.quantize, "zoo:resnet", **kwargs, match=flag, where=tmp_path)


def test_an_unknown_keyword_is_refused_with_the_closest_option():
    import ptopt

    msg = assert_refused(ptopt.quantize, "zoo:resnet", "static", calibration_batch=4, match="calibration_batches")
    assert "takes no option calibration_batch=" in msg


def test_the_twins_signature_lists_every_option():
    import inspect

    import ptopt

    for case in CASES.values():
        params = inspect.signature(_obj(case.twin)).parameters
        assert set(_obj(case.spec).declared()) <= set(params), case.twin
    assert "observer" in (ptopt.quantize.__doc__ or "")
