"""Each option is declared once (a config field, ``ptopt.core.options``) and the CLI calls the Python
twin: this walks every option of every command, at every mode/target, and proves the CLI and the twin
accept and refuse the same things: the same resolved configs, or the same one-line refusal (exit 2
naming the option where it does not apply). Nothing runs past the options' resolution (a patched
resolver stops there), so the walk takes seconds."""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any

import numpy as np
import pytest
import torch

from ptopt.core.errors import OptionRenamed, PtoptError, UsageError
from tests.helpers import assert_refused, not_progress


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
    #: where the choice is not an option (validate: what the model and data are), the CLI's and the
    #: twin's leading arguments for each choice
    by_choice: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = dataclasses.field(default_factory=dict)
    #: options every call at a choice needs (optimize: a budget), left out where the option walked is one
    base: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: (option, choice) pairs the walk cannot make: the option itself decides the choice
    skip: tuple[tuple[str, str], ...] = ()

    def leading(self, choice: str | None) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        return self.by_choice.get(choice or "", (self.cli, self.args))


CASES = {
    "quantize": Case(
        "ptopt.compress.quantize.config:OPTIONS",
        "ptopt.compress.quantize.api:resolve_config",
        ("quantize", "zoo:resnet", "-o", "out.pt"),
        "ptopt.compress.quantize.api:quantize",
        ("zoo:resnet",),
        {"output": "out.pt"},
    ),
    "export": Case(
        "ptopt.export.config:OPTIONS",
        "ptopt.export.api:settle_config",
        ("export", "zoo:resnet", "-o", "out.onnx"),
        "ptopt.export.api:export",
        ("zoo:resnet",),
        {"output": "out.onnx"},
    ),
    "validate": Case(
        "ptopt.validate.options:OPTIONS",
        "ptopt.validate.api:resolve",
        (),
        "ptopt.validate.api:validate",
        (),
        by_choice={
            "model": (
                ("validate", "zoo:resnet", "m.onnx", "--data", "builtin:digits32:test"),
                ("zoo:resnet", "m.onnx", "builtin:digits32:test"),
            ),
            "lm": (
                ("validate", "hf:lm", "hf:lm.int8", "--data", "builtin:pydoc-text:eval"),
                ("hf:lm", "hf:lm.int8", "builtin:pydoc-text:eval"),
            ),
        },
    ),
    "optimize": Case(
        "ptopt.optimize.options:OPTIONS",
        "ptopt.optimize.api:resolve",
        ("optimize", "zoo:resnet", "-o", "opt"),
        "ptopt.optimize.api:optimize",
        ("zoo:resnet",),
        {"output": "opt"},
        base={"model": {"min_cosine": 0.99}, "lm": {"max_perplexity_increase": 3.0}},
        skip=(("max_perplexity_increase", "model"),),
    ),
    "prune": Case(
        "ptopt.compress.prune.api:OPTIONS",
        "ptopt.compress.prune.api:resolve_config",
        ("prune", "zoo:resnet", "-o", "p.pt"),
        "ptopt.compress.prune.api:prune",
        ("zoo:resnet",),
        {"output": "p.pt"},
        base={"*": {"amount": 0.5}},
    ),
    "distill": Case(
        "ptopt.compress.distill:OPTIONS",
        "ptopt.compress.distill:resolve_config",
        (
            "distill",
            "--teacher",
            "zoo:resnet",
            "--student",
            "zoo:cnn",
            "--train-data",
            "builtin:digits32:train",
            "-o",
            "s.pt",
        ),
        "ptopt.compress.distill:distill",
        ("zoo:resnet", "zoo:cnn", "builtin:digits32:train", "s.pt"),
        by_choice={
            "lm": (
                (
                    "distill",
                    "--teacher",
                    "hf:lm",
                    "--student",
                    "hf:lm-small",
                    "--train-data",
                    "t.txt",
                    "-o",
                    "s",
                ),
                ("hf:lm", "hf:lm-small", "t.txt", "s"),
            ),
        },
    ),
}

#: values for options whose default is "not given" (None) or not a value the walk can send
SAMPLES = {
    "accuracy_budget": 1.0,
    "max_accuracy_drop": 1.0,
    "min_cosine": 0.99,
    "tuning_budget": "4",
    "observer": "percentile",
    "threads": 1,
    "group_size": 64,
    "decode_step": 8,
    "new_tokens": 8,
    "float_modules": ("layers.0",),
    "exclude": ("layers.0",),
    "device": "cpu",
    "int8_method": "ort_static",
    "opset": 17,
    "atol": 0.001,
    "rtol": 0.001,
    "static_batches": (1, 32),
    "min_shape": ("1x1x32x32",),
    "opt_shape": ("4x1x32x32",),
    "max_shape": ("8x1x32x32",),
    "dynamic_batch": "1:8:64",
    "batch_sizes": (1, 8),
    "max_samples": 16,
    "isa": ("native",),
    "eval_batch_size": 16,
    "min_agreement": 0.99,
    "min_speedup": 1.1,
    "max_size_mb": 10.0,
    "max_regression": 5.0,
    "max_latency_ms": ("32=40",),
    "baseline": "base.json",
    "json_path": "r.json",
    "junit_path": "r.xml",
    "markdown_path": "r.md",
    "report_path": "r.html",
    "max_perplexity_increase": 3.0,
    "min_tokens_per_s": 10.0,
    "providers": ("CPUExecutionProvider",),
    "candidates": ("fp32-onnx",),
    "skip": ("fp32-aoti",),
    "time_budget": "90s",
    "amount": 0.3,
    "teacher": "self",
    "teacher_weights": "teacher.pt",
    "feature_pairs": ("layers.0=layers.0",),
    "checkpoint_dir": "ckpt",
    "log_dir": "logs",
    "metrics_file": "m.jsonl",
    "max_steps": 10,
    "checkpoint_every": 5,
    "shard_modules": ("layers.*",),
    "seq_len": 64,
}

#: what a field holds for a sample its config normalizes
NORMALIZED = {"max_latency_ms": ((32, 40.0),), "feature_pairs": (("layers.0", "layers.0"),)}
#: per command, the options another option needs beside it to be accepted (the CLI and the twin alike)
COMPANIONS = {
    "quantize": {
        "compile": {"engine": "pt2e"},
        "static_batches": {"engine": "pt2e"},
        "tuning_budget": {"min_cosine": 0.99},
        "threads": {"min_cosine": 0.99},
    },
    "export": {
        "accuracy_budget": {"accuracy_control": True, "precision": "int8"},
        "accuracy_control": {"precision": "int8", "min_cosine": 0.99},
        "float_modules": {"precision": "int8"},
        "cuda_graphs": {"device": "cuda"},
    },
    "distill": {
        "resume": {"checkpoint_dir": "ckpt"},
        "shard_modules": {"strategy": "fsdp"},
        "cpu_offload": {"strategy": "fsdp"},
    },
    "optimize": {},
    "validate": {"max_regression": {"baseline": "prev.json"}, "baseline": {"max_regression": 5.0}},
}


def _obj(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _sample(spec: Any, d: Any, choice: str | None, value: Any = None) -> tuple[Any, list[str]]:
    """(the Python value, the CLI arguments) of one option where the selector chose ``choice``: a
    value of the config that choice uses (its default, flipped for a flag)."""
    label = spec.selector.label if spec.selector else None
    defaults = [v for c, v in d.defaults if label and label(c) == choice] or [v for _, v in d.defaults]
    if value is not None:
        pass
    elif d.name in SAMPLES:
        value = SAMPLES[d.name]
    elif d.kind is bool:
        value = not defaults[0]
    else:
        value = next((v for v in defaults if v is not None and v != ()), None)
        value = d.opt.choices[0] if value is None else value
    if d.kind is bool:
        flag = d.flag if not d.opt.toggle else (d.flag if value else "--no-" + d.flag[2:])
        return value, [flag]
    if d.opt.repeat:
        return value, [a for v in value for a in (d.flag, str(v))]
    return value, [d.flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]


def _walk() -> list[tuple[str, str]]:
    return [(command, name) for command, case in CASES.items() for name in _obj(case.spec).declared()]


def _outcome(fn) -> tuple[str, Any]:
    try:
        fn()
    except _Resolved as r:
        return "resolved", r.args[0]
    except UsageError as e:
        return "refused", str(e)
    raise AssertionError("the resolver was not reached")


@pytest.mark.parametrize(("command", "name"), _walk(), ids=lambda v: str(v))
def test_cli_and_twin_accept_and_refuse_the_same(cli, monkeypatch, command, name):
    """At every mode/target: the same resolved configs or the same refusal; where the option does not
    apply, a refusal naming it; where it applies, never that refusal, and resolved somewhere."""
    case = CASES[command]
    spec = _obj(case.spec)
    seen: list[Any] = []
    real = _obj(case.resolver)

    def stop(*a: Any, **kw: Any) -> Any:
        seen.append(real(*a, **kw))
        raise _Resolved(seen[-1])

    module, _, attr = case.resolver.partition(":")
    monkeypatch.setattr(importlib.import_module(module), attr, stop)
    resolved = []
    for choice in list(spec.selector.choices()) if spec.selector else [None]:
        if (name, choice) in case.skip:
            continue
        by_twin, by_cli, value = _both(cli, case, spec, name, choice, seen)
        assert by_twin == by_cli, choice
        d = spec.declared()[name]
        inapplicable = by_twin[0] == "refused" and bool(
            re.match(rf"{d.flag} applies (only )?to ", by_twin[1])
        )
        assert inapplicable == (not spec.applies(name, choice)), (choice, by_twin)
        if by_twin[0] == "resolved":
            assert _field_values(by_twin[1], name) == NORMALIZED.get(name, value), (choice, by_twin[1])
            resolved.append(choice)
    assert resolved, f"{name} was accepted nowhere"


def _both(cli, case: Case, spec: Any, name: str, choice: str | None, seen: list[Any]) -> tuple:
    """The outcome of the twin and of the CLI given option ``name`` (and its companions) at ``choice``."""
    d = spec.declared()[name]
    value, args = _sample(spec, d, choice)
    extra: dict[str, Any] = {}
    companions = COMPANIONS.get(spec.command, {}).get(name, {})
    base = case.base.get(choice or "", case.base.get("*", {}))
    base = {k: v for k, v in base.items() if k != name}
    companions = (base if name not in _exclusive(base, name) else {}) | (
        companions if spec.applies(name, choice) else {}
    )
    for other, v in companions.items():
        extra[other] = v
        args += _sample(spec, spec.declared()[other], choice, v)[1]
    on_cli = bool(choice) and spec.selector.cli
    sel = [spec.selector.cli_flag, choice] if on_cli else []
    py_sel = {spec.selector.name: choice} if on_cli else {}
    lead_cli, lead_args = case.leading(choice)
    twin = _obj(case.twin)
    by_twin = _outcome(lambda: twin(*lead_args, **case.kwargs, **py_sel, **extra, **{name: value}))
    if not d.opt.cli:
        return by_twin, by_twin, value
    code, _, err = cli(*lead_cli, *sel, *args)
    assert code in (2, 9), (code, err)
    lines = not_progress(err)  # a slow machine may add a progress heartbeat (ptopt.core.progress)
    if code == 2:
        assert len(lines) == 1, err
    by_cli = ("resolved", seen[-1]) if code == 9 else ("refused", lines[0].strip().removeprefix("error: "))
    return by_twin, by_cli, value


def _exclusive(base: dict[str, Any], name: str) -> set[str]:
    """The walked option and the base options it replaces (one accuracy budget of optimize)."""
    budgets = {"accuracy_budget", "min_cosine"}
    return budgets if name in budgets and set(base) <= budgets else set()


def _field_values(resolved: Any, name: str) -> Any:
    """The value of option ``name`` in what a resolver returned: configs, or tuples / bundles of them."""
    found = _find(resolved, name)
    if found is _MISSING:
        raise AssertionError(f"{name} not in {resolved!r}")
    return found


_MISSING = object()


def _find(obj: Any, name: str) -> Any:
    if isinstance(obj, tuple) and not dataclasses.is_dataclass(obj):
        items = obj
    elif dataclasses.is_dataclass(obj):
        fields = [f.name for f in dataclasses.fields(obj)]
        if name in fields:
            return getattr(obj, name)
        items = tuple(getattr(obj, f) for f in fields)
    else:
        return _MISSING
    for item in items:
        found = _find(item, name)
        if found is not _MISSING:
            return found
    return _MISSING


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--mode", "weight-only", "--bits", "4", "--accuracy-budget", "1"), "--accuracy-budget"),
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

    msg = assert_refused(
        ptopt.quantize, "zoo:resnet", "static", calibration_batch=4, match="calibration_batches"
    )
    assert "takes no option calibration_batch=" in msg


def test_the_twins_signature_lists_every_option():
    import inspect

    import ptopt

    for case in CASES.values():
        params = inspect.signature(_obj(case.twin)).parameters
        assert set(_obj(case.spec).declared()) <= set(params), case.twin
    assert "observer" in (ptopt.quantize.__doc__ or "")


@pytest.mark.parametrize(
    ("command", "args", "twin"),
    [
        (
            "quantize",
            ("zoo:resnet", "--mode", "static", "-o", "q.pt"),
            ("ptopt.compress.quantize.api", "resolve_config"),
        ),
        ("optimize", ("zoo:resnet", "-o", "opt"), ("ptopt.optimize.api", "resolve")),
    ],
    ids=["quantize", "optimize"],
)
def test_the_old_spelling_of_a_search_budget_still_works_with_a_note(cli, monkeypatch, command, args, twin):
    """One meaning per name: validate's --max-accuracy-drop is a gate; a search's budget is
    --accuracy-budget. The old spelling of the budget keeps working, with a note saying so."""
    module, attr = twin
    real = getattr(importlib.import_module(module), attr)
    seen: list[Any] = []

    def stop(*a: Any, **kw: Any) -> Any:
        seen.append(real(*a, **kw))
        raise _Resolved(seen[-1])

    monkeypatch.setattr(importlib.import_module(module), attr, stop)
    code, _, err = cli(command, *args, "--max-accuracy-drop", "1.5")
    assert code == 9 and _field_values(seen[-1], "accuracy_budget") == 1.5, err
    assert "note: --max-accuracy-drop is deprecated here" in err and "--accuracy-budget" in err
    twin_fn = _obj(CASES[command].twin)
    kwargs = {"mode": "static"} if command == "quantize" else {}
    with pytest.warns(OptionRenamed, match="max_accuracy_drop= is deprecated"):
        outcome = _outcome(lambda: twin_fn("zoo:resnet", **kwargs, max_accuracy_drop=1.5))
    assert outcome[0] == "resolved" and _field_values(outcome[1], "accuracy_budget") == 1.5
    assert_refused(
        cli, command, *args, "--max-accuracy-drop", "1", "--accuracy-budget", "1", match="one option"
    )


#: (issue 40) rules where one option needs another: (command, option, value, the twin's call, the refusal)
PARTNERS = [
    ("validate", "max_regression", "5", "ptopt.validate.api:validate", "--max-regression needs --baseline"),
    ("validate", "baseline", "prev.json", "ptopt.validate.api:validate", "--baseline needs --max-regression"),
    ("prune", "epochs", "2", "ptopt.compress.prune.api:prune", "--epochs needs --fine-tune-data"),
    ("prune", "fine_tune_data", "d.pt", "ptopt.compress.prune.api:prune", "--fine-tune-data needs --epochs"),
    (
        "prune",
        "teacher",
        "zoo:resnet",
        "ptopt.compress.prune.api:prune",
        "--teacher distills while fine-tuning",
    ),
    ("distill", "resume", "1", "ptopt.compress.distill:distill", "--resume needs --checkpoint-dir"),
]
_PARTNER_ARGS = {  # files that do not exist: every run stops at its first look at one (exit 2)
    "validate": (
        ("missing.pt", "missing.onnx", "--data", "missing.pt"),
        ("missing.pt", "missing.onnx", "missing.pt"),
    ),
    "prune": (
        ("missing.pt", "--method", "global", "--amount", "0.5", "-o", "out.pt"),
        ("missing.pt", "global", 0.5),
    ),
    "distill": (
        ("--teacher", "missing.pt", "--student", "missing.pt", "--train-data", "missing.pt", "-o", "out.pt"),
        ("missing.pt", "missing.pt", "missing.pt", "out.pt"),
    ),
}


@pytest.mark.parametrize(("command", "name", "value", "twin", "refusal"), PARTNERS, ids=lambda v: str(v)[:24])
def test_an_environment_value_without_its_partner_is_left_out(
    cli, monkeypatch, command, name, value, twin, refusal
):
    """An option set in the environment (``PTOPT_<COMMAND>_<OPTION>``, a soft default) whose partner is
    missing is left out with one note naming the variable and the rule; typed, it is refused as before.
    The twin the same: under ``soft_options`` a warning (OptionIgnored), else the UsageError."""
    from ptopt.core.errors import OptionIgnored
    from ptopt.core.options import soft_options

    cli_args, twin_args = _PARTNER_ARGS[command]
    flag = "--" + name.replace("_", "-")
    typed = (flag,) if value == "1" else (flag, value)
    assert_refused(cli, command, *cli_args, *typed, match=refusal)
    var = f"PTOPT_{command.upper()}_{name.upper()}"
    monkeypatch.setenv(var, value)
    code, _, err = cli(command, *cli_args)
    lines = not_progress(err)
    notes = [line for line in lines if var in line]
    assert code == 2 and refusal not in lines[-1], err
    assert len(notes) == 1 and notes[0].startswith(
        f"note: ignored {var}={value} in the environment: {refusal}"
    )
    module, fn = twin.split(":")
    call = getattr(importlib.import_module(module), fn)
    kwargs = {name: {"1": True, "5": 5.0, "2": 2}.get(value, value)}
    with pytest.raises(UsageError, match=re.escape(refusal)):
        call(*twin_args, **kwargs)
    with (
        soft_options({name}),
        pytest.warns(OptionIgnored, match=re.escape(refusal)),
        pytest.raises(PtoptError) as e,
    ):
        call(*twin_args, **kwargs)
    assert refusal not in str(e.value)


def test_every_option_takes_its_flags_name_as_its_key():
    """The flag's name (dashes as underscores) is a key of its option everywhere (recipe, twin), beside
    the field's name: ``batch_size:`` for optimize's ``--batch-size``; ``per_tensor: true`` for
    ``--per-tensor`` is ``per_channel=False``; and ``--save-recipe`` writes it."""
    from ptopt.serve.package import OPTIONS as PACKAGE

    for spec in [*(_obj(case.spec) for case in CASES.values()), PACKAGE]:
        for name, d in spec.declared().items():
            assert spec.keyword(d.key) == name and spec.keyword(name) == name, (spec.command, name)
    assert _obj(CASES["optimize"].spec).check({"batch_size": "1,4"}) == {"batch_sizes": (1, 4)}
    assert PACKAGE.check({"max_batch_delay": 50, "response_timeout": 60}, "mar") == {
        "max_batch_delay_ms": 50,
        "response_timeout_s": 60,
    }
    assert PACKAGE.check({"max_request_size": 2}, "ray") == {"max_request_mb": 2.0}
    quantize = _obj(CASES["quantize"].spec)
    assert quantize.check({"per_tensor": True, "static_batch": [4]}, "static") == {
        "per_channel": False,
        "static_batches": (4,),
    }
    assert quantize.recipe_keys({"per_channel": False, "float_modules": ("fc",)}) == {
        "per_tensor": True,
        "exclude": ("fc",),
    }
    assert_refused(
        quantize.check, {"per_tensor": True, "per_channel": False}, "static", match="--per-tensor given twice"
    )


@pytest.mark.parametrize(
    ("given", "expect"),
    [
        (
            {"per_channel": "false", "calibration_batches": "2"},
            {"per_channel": False, "calibration_batches": 2},
        ),
        (  # a twin's numpy scalars, one-value tensors and whole floats: the values they hold
            {"per_channel": np.bool_(True), "calibration_batches": 3.0, "min_cosine": torch.tensor(0.5)},
            {"per_channel": True, "calibration_batches": 3, "min_cosine": 0.5},
        ),
        ({"per_channel": "maybe"}, "per_channel: 'maybe' is not true or false"),
        ({"calibration_batches": "two"}, "calibration_batches: 'two' is not a whole number"),
        ({"calibration_batches": 2.5}, "calibration_batches: 2.5 is not a whole number"),
        ({"per_channel": 1.5}, "per_channel: 1.5 is not true or false"),
        ({"min_cosine": "high"}, "min_cosine: 'high' is not a number"),
        ({"observer": ["minmax"]}, "observer: ['minmax'] is not text"),
    ],
    ids=[
        "as-the-flag-reads-it",
        "python-scalars",
        "flag",
        "count",
        "fraction-for-a-count",
        "number-for-a-flag",
        "number",
        "list",
    ],
)
def test_a_value_is_read_as_its_flag_reads_it_or_refused_naming_it(given, expect):
    """A value is of its option's declared type (what the CLI flag's type reads: ``"false"`` is false,
    ``"2"`` is 2), through the twin as through a recipe; else one line naming the key and the value."""
    import ptopt

    quantize = _obj(CASES["quantize"].spec)
    if isinstance(expect, dict):
        assert quantize.check(given, "static") == expect
    else:
        assert_refused(ptopt.quantize, "zoo:resnet", "static", output="q.pt", **given, match=expect)


def test_a_twin_keeps_an_object_a_text_option_takes():
    """``device=torch.device("cpu")`` reached the twin before values were typed (``resolve_device`` takes a
    ``torch.device``); it must not be refused as "not text", while a list for a text option still is."""
    import torch

    validate = _obj(CASES["validate"].spec)
    assert validate.check({"device": torch.device("cpu")}, "model") == {"device": torch.device("cpu")}
    assert_refused(validate.check, {"device": ["cpu"]}, "model", match="device: ['cpu'] is not text")
