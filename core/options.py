"""Options declared once: the fields of a stage's frozen config dataclasses are its command's options.

A field made with :func:`option` carries an :class:`Opt` in its metadata: the help, the CLI flag
(``--`` and the field name, unless given), and the modes / targets / formats it applies to. One
:class:`Options` per command lists the classes whose fields are its options and, where the command
has one, the :class:`Selector` (``--mode``, ``--method``, ``--target``, ``--format``) that decides
which of them apply. Everything else is derived, with no second list anywhere:

- the click options of the command (``ptopt.cli.options.declared``; the library never imports click);
- the Python twin's keyword arguments: a twin takes ``config=`` (or the loose keywords), data and a
  few common arguments, and :meth:`Options.check` turns the keywords into typed fields;
- the keys of a recipe step (``--save-recipe`` writes the keywords given; ``ptopt run`` calls the
  twin with them).

The CLI passes the options it was given to the twin unchanged, so both refuse the same things with
the same one line (exit 2): an unknown keyword, and an option that does not apply to the chosen
mode/target (``--bits applies to --mode weight-only, not --mode dynamic``).

Olive's ``PassConfigParam``, llm-compressor's pydantic modifiers (their fields are the recipe keys)
and torchao's config-is-the-API are the models: here the config field is the declaration.

Conventions: a field that another config of the same command declares with :func:`option` is the same
option there (a config may re-default it by plain assignment: ``batch_size: int = 64``). ``None``
means "not given" (the config's default applies). The library's value of a flag field is a bool.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import functools
import inspect
import numbers
import os
import types
import typing
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from ptopt.core.errors import OptionIgnored, OptionRenamed, UsageError

#: the metadata key of a field's :class:`Opt`
OPT = "ptopt.option"


#: the options of the running command set in the environment (``PTOPT_<COMMAND>_<OPTION>``, see
#: :func:`soft_options`: name → where its value came from) and those of them dropped because they did
#: not apply
_SOFT: contextvars.ContextVar[tuple[Mapping[str, str], set[str]] | None] = contextvars.ContextVar(
    "ptopt_soft_options", default=None
)


#: whether a refusal names an option by its flag (under the CLI) or by its keyword (a twin, a recipe)
_FLAGS: contextvars.ContextVar[bool] = contextvars.ContextVar("ptopt_option_flags", default=False)


@contextlib.contextmanager
def named_by_flags(on: bool = True) -> Iterator[None]:
    """Within it a value an option does not take is refused naming the option's flag (``--static-batch``,
    what a CLI user typed) rather than its keyword (``static_batches``); ``ptopt run`` turns it off
    again for its steps, whose keys are the recipe's."""
    token = _FLAGS.set(on)
    try:
        yield
    finally:
        _FLAGS.reset(token)


def option_name(keyword: str) -> str:
    """``keyword`` as a refusal names it: its flag under the CLI (:func:`named_by_flags`), else itself."""
    return "--" + keyword.replace("_", "-") if _FLAGS.get() else keyword


@contextlib.contextmanager
def soft_options(names: Collection[str] | Mapping[str, str]) -> Iterator[set[str]]:
    """Within it the options ``names`` are soft defaults, not requests: values a CI runner sets for
    every command in the environment (``PTOPT_VALIDATE_MIN_SECONDS``). One that does not apply to the
    chosen mode / target / kind is left out without a word (:meth:`Options.check`) instead of refused
    as the same option typed on the command line is; one whose partner option is missing is left out
    with a note (:func:`drop_without_partner`). A mapping names where each value came from (the CLI:
    ``PTOPT_VALIDATE_MAX_REGRESSION=5 in the environment``). Yields the set of the names left out."""
    dropped: set[str] = set()
    origins = dict(names) if isinstance(names, Mapping) else {n: f"{n}= (a soft default)" for n in names}
    token = _SOFT.set((origins, dropped))
    try:
        yield dropped
    finally:
        _SOFT.reset(token)


def soft(name: str) -> bool:
    """True, noting ``name`` as left out, when ``name`` is a soft default (:func:`soft_options`): the
    caller leaves it out where it does not apply."""
    state = _SOFT.get()
    if state is None or name not in state[0]:
        return False
    state[1].add(name)
    return True


def drop_without_partner(name: str, refusal: str) -> None:
    """For a rule where option ``name`` needs another that was not given (``refusal`` names both:
    ``--max-regression needs --baseline ...``): a soft default (:func:`soft_options`, e.g. a CI runner's
    ``PTOPT_VALIDATE_MAX_REGRESSION`` set for the jobs that pass a baseline) is left out with one
    :class:`~ptopt.core.errors.OptionIgnored` note saying so and why, and the caller drops it; the
    same option given by the user is refused: UsageError(``refusal``)."""
    state = _SOFT.get()
    if state is None or name not in state[0]:
        raise UsageError(refusal)
    state[1].add(name)
    warnings.warn(f"ignored {state[0][name]}: {refusal}", OptionIgnored, stacklevel=2)


def soft_left_out() -> frozenset[str]:
    """The soft defaults left out so far in this :func:`soft_options` (a recipe of the step omits them)."""
    state = _SOFT.get()
    return frozenset(state[1]) if state is not None else frozenset()


@dataclasses.dataclass(frozen=True)
class Opt:
    """What a config field is as an option.

    ``flag``: the CLI spelling (default ``--`` + the field name with dashes); ``short``: e.g. ``-T``.
    ``applies``: the selector values (modes, targets, formats) it applies to; empty: wherever its
    config is used. ``choices``: shown in the help (the config validates the value). ``repeat``: a
    repeatable flag collected into a tuple; ``csv``: one comma-separated value on the CLI, a tuple in
    Python. ``negate``: a flag that sets the field False (``--per-tensor`` → ``per_channel=False``);
    ``toggle``: ``--x/--no-x``. ``aliases``: other keyword / recipe names of the same option.
    ``deprecated``: ``{old spelling: note}``, old flags and keywords that still work with a note.
    ``note``: what a refusal adds, where to go instead. ``cli``: False for Python / recipe only.
    ``path``: ``"in"`` or ``"out"``, a file the command reads or writes (never the same file).
    ``required``: the CLI needs it (the twin takes it as a positional argument).
    """

    help: str
    flag: str = ""
    short: str = ""
    metavar: str = ""
    applies: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    repeat: bool = False
    csv: bool = False
    negate: bool = False
    toggle: bool = False
    aliases: tuple[str, ...] = ()
    deprecated: Mapping[str, str] = dataclasses.field(default_factory=dict)
    note: str = ""
    #: what the help says the default is where a config's default is None (``"the engine's"``)
    default_label: str = ""
    cli: bool = True
    path: str = ""
    #: the CLI cannot run without it (the twin takes it positionally)
    required: bool = False


def option(default: Any = dataclasses.MISSING, *, help: str, factory: Any = None, **opt: Any) -> Any:
    """A config field that is an option (``opt``: the :class:`Opt` fields)."""
    where = {"default_factory": factory} if factory is not None else {"default": default}
    return dataclasses.field(metadata={OPT: Opt(help=help, **opt)}, **where)


@dataclasses.dataclass(frozen=True)
class Declared:
    """One option of a command: its name (the config field and keyword), declaration and type."""

    name: str
    opt: Opt
    hint: Any
    #: the classes that have the field, and its default in each
    defaults: tuple[tuple[type, Any], ...]

    @property
    def flag(self) -> str:
        return self.opt.flag or "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """The option's recipe key: its flag's name, dashes as underscores (``--batch-size`` →
        ``batch_size``). The field's name (the Python keyword) is accepted too."""
        return self.flag[2:].replace("-", "_")

    @property
    def kind(self) -> type:
        """bool, int, float or str: the type of one value (of each item, for a tuple)."""
        return scalar_type(self.hint)

    @property
    def many(self) -> bool:
        return self.opt.repeat or self.opt.csv

    @property
    def owners(self) -> tuple[type, ...]:
        return tuple(c for c, _ in self.defaults)

    def default_text(self, label: Callable[[type], str] | None = None) -> str:
        """The default as the help shows it: one value, or ``fx (weight-only: torchao)`` where the
        configs differ (the most common first)."""
        shown = [(c, _show_default(d) or self.opt.default_label) for c, d in self.defaults]
        values = [v for _, v in shown]
        common = max(values, key=values.count, default="")
        others = [f"{label(c)}: {v or 'none'}" for c, v in shown if v != common] if label else []
        if not others:
            return common
        return f"{common or 'none'} ({', '.join(others)})"


def _show_default(value: Any) -> str:
    if value is None or value == () or value is dataclasses.MISSING:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def scalar_type(hint: Any) -> type:
    """``int | None`` → int, ``tuple[str, ...]`` → str, ``bool`` → bool; anything else → str."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return scalar_type(args[0]) if len(args) == 1 else str
    if origin is tuple:  # the type of one item; an item that is itself a tuple is given as text
        return scalar_type(args[0]) if args and typing.get_origin(args[0]) is not tuple else str
    if origin is typing.Literal:
        return type(args[0]) if args else str
    return hint if hint in (bool, int, float, str) else str


@functools.cache
def fields_of(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """``{name: (field, type hint)}`` of a dataclass (class variables excluded)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints.get(f.name, Any)) for f in dataclasses.fields(cls)}


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class Selector:
    """The twin's argument that decides which options apply: ``mode`` (quantize), ``method`` (prune),
    ``target`` (export), ``format`` (package). ``takes(choice)``: the names of the options that choice
    takes among those some choice takes (quantize: the fields of the mode's config; export: the
    format's ``write_options``); an option no choice names applies to every choice (unless its
    ``applies`` says otherwise). ``label(cls)``: how the help names a config's default."""

    name: str
    help: str
    choices: Callable[[], Sequence[str]]
    takes: Callable[[str], Collection[str]] | None = None
    flag: str = ""
    required: bool = True
    label: Callable[[type], str] | None = None
    #: how refusals name a choice (``lm`` → "a causal language model on text"); None: ``--mode CHOICE``
    describe: Callable[[str], str] | None = None
    #: a CLI option of its own (False: the twin works the choice out, e.g. from the model and data)
    cli: bool = True

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Part:
    """Some of a config's fields as a command's options (prune fine-tunes with the trainer's ``lr``,
    ``batch_size`` and ``seed``, declared once in ``TrainConfig``)."""

    cls: type
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Options:
    """The options of one command: every declared field of ``groups()`` (classes, or a ``Part`` of
    one; read lazily so a table can fill them), and the ``selector`` that decides which apply.
    ``defaults``: this command's own defaults of fields it shares (distill trains 4 epochs)."""

    command: str
    groups: Callable[[], Sequence[type | Part]]
    selector: Selector | None = None
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def declared(self) -> dict[str, Declared]:
        """Every option, by name, in the order the groups declare them."""
        table = dict(_declared(tuple(self.groups())))
        for name, value in self.defaults.items():
            d = table[name]
            table[name] = dataclasses.replace(d, defaults=tuple((c, value) for c, _ in d.defaults))
        return table

    def keyword(self, name: str) -> str | None:
        """The option a keyword names (its own name or an alias), or None."""
        table = self.declared()
        if name in table:
            return name
        for d in table.values():
            if name == d.key or name in d.opt.aliases or name in d.opt.deprecated:
                return d.name
        return None

    def accepted(self) -> list[str]:
        """The keys the options take, as an unknown-key refusal lists them: the recipe key (the
        flag's name), and the field's name in parentheses where it differs."""
        return [
            d.key if d.key == n else f"{d.key} ({'not ' * d.opt.negate}{n})"
            for n, d in self.declared().items()
        ]

    def recipe_keys(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` (keyword → value) with each option under its recipe key (:attr:`Declared.key`;
        ``per_channel=False`` → ``per_tensor: true``); other keys as they are."""
        table = self.declared()
        out: dict[str, Any] = {}
        for k, v in options.items():
            d = table.get(k)
            if d is not None and d.opt.negate and isinstance(v, bool):
                v = not v
            out[d.key if d is not None else k] = v
        return out

    def check_choices(self, given: Mapping[str, Any], choice: Any = None) -> None:
        """UsageError for a value outside its option's ``choices`` or a selector value outside the
        selector's (``mode: statik``), before the twin's config would say so (a recipe's dry run)."""
        sel = self.selector
        if sel is not None and sel.cli and choice is not None and str(choice) not in sel.choices():
            raise UsageError(f"{sel.name}: {choice!r} is not one of {', '.join(sel.choices())}")
        for key, value in given.items():
            name = self.keyword(key)
            d = self.declared().get(name) if name else None
            if d is None or not d.opt.choices or value is None:
                continue
            value = coerce(d, value, key)
            for item in value if isinstance(value, tuple) else (value,):
                if str(item) not in d.opt.choices:
                    raise UsageError(f"{key}: {item!r} is not one of {', '.join(d.opt.choices)}")

    def applies(self, name: str, choice: str | None) -> bool:
        """Whether option ``name`` applies where the selector chose ``choice`` (None: not chosen)."""
        d = self.declared()[name]
        sel = self.selector
        if choice is None or sel is None:
            return True
        if d.opt.applies:
            return choice in d.opt.applies
        if sel.takes is None or choice not in sel.choices():
            return True
        if not any(name in sel.takes(c) for c in sel.choices()):
            return True
        return name in sel.takes(choice)

    def refuse_inapplicable(self, config: Any, choice: str) -> None:
        """UsageError for a field of ``config`` set (not its default) that does not apply to
        ``choice``: a config built directly is held to what the twin's keywords are."""
        for name, (f, _) in fields_of(type(config)).items():
            if (
                name in self.declared()
                and getattr(config, name) != _default(f)
                and not self.applies(name, choice)
            ):
                raise UsageError(self._inapplicable(self.declared()[name], choice))

    def check(self, given: Mapping[str, Any], choice: str | None = None) -> dict[str, Any]:
        """The options ``given`` (keyword → value; None: not given) by their names, each value in its
        field's type (a comma-separated string or a list → tuple); UsageError for a keyword that is
        not an option, and for an option that does not apply to ``choice``."""
        table = self.declared()
        out: dict[str, Any] = {}
        for key, value in given.items():
            if value is None:
                continue
            name = self.keyword(key)
            if name is None:
                raise UsageError(self._unknown(key))
            d = table[name]
            if key in d.opt.deprecated:
                warnings.warn(f"{key}= is deprecated: {d.opt.deprecated[key]}", OptionRenamed, stacklevel=3)
            if name in out:
                raise UsageError(f"{self.command}: {d.flag} given twice ({key}= and {name}=)")
            if not self.applies(name, choice):
                if soft(name):
                    continue
                raise UsageError(self._inapplicable(d, choice))
            value = coerce(d, value, key)
            negated = d.opt.negate and key == d.key != name  # per_tensor: true → per_channel=False
            out[name] = not value if negated else value
        return out

    def build(self, cls: type, given: Mapping[str, Any], **fixed: Any) -> Any:
        """``cls`` from the options of ``given`` that are its fields (and ``fixed``); a value of the
        wrong type is a UsageError naming the option (never a TypeError from inside)."""
        names = fields_of(cls)
        mine = {k: v for k, v in self.defaults.items() if k in names}
        kwargs = mine | {k: v for k, v in given.items() if k in names} | fixed
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise UsageError(f"{self.command}: {e}") from None

    def merge(self, cls: type, obj: Any, given: Mapping[str, Any], keyword: str) -> Any:
        """``cls`` given whole as ``obj`` (an instance, or a mapping of its fields as a recipe writes
        it), or built from its options in ``given``; both is a UsageError (one source of truth)."""
        loose = self.of(cls, given)
        if obj is None:
            return self.build(cls, loose)
        if loose:
            raise UsageError(
                f"give {keyword}={cls.__name__}(...) or its options ({', '.join(loose)}), not both"
            )
        if isinstance(obj, Mapping):
            unknown = sorted(set(obj) - set(fields_of(cls)))
            if unknown:
                raise UsageError(f"{keyword}: unknown option(s) {', '.join(unknown)}")
            return self.build(cls, {k: coerce(self.declared()[k], v, k) if k in self.declared() else v
                                    for k, v in obj.items()})  # fmt: skip
        if not isinstance(obj, cls):
            raise UsageError(f"{keyword} must be a {cls.__name__}, got {type(obj).__name__}")
        return obj

    def of(self, cls: type, given: Mapping[str, Any]) -> dict[str, Any]:
        """The options of ``given`` that are fields of ``cls``."""
        names = fields_of(cls)
        return {k: v for k, v in given.items() if k in names}

    def _unknown(self, key: str) -> str:
        names = [*self.declared(), *(d.key for d in self.declared().values())]
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"; did you mean {close[0]}=?" if close else f" (its options: {', '.join(self.accepted())})"
        return f"{self.command}() takes no option {key}={hint}"

    def _inapplicable(self, d: Declared, choice: str | None) -> str:
        sel = self.selector
        assert sel is not None
        where = [c for c in sel.choices() if self.applies(d.name, c)]
        if sel.describe is not None:
            names = " or ".join(sel.describe(c) for c in where)
            msg = f"{d.flag} applies only to {names}, not to {sel.describe(str(choice))}"
            return msg + (f" ({d.opt.note})" if d.opt.note else "")
        msg = (
            f"{d.flag} applies to {sel.cli_flag} {', '.join(where)}, not {sel.cli_flag} {choice}"
            if where
            else f"{d.flag} does not apply to {sel.cli_flag} {choice}"
        )
        return msg + (f" ({d.opt.note})" if d.opt.note else "")

    def signature(self, fn: Callable[..., Any]) -> inspect.Signature:
        """``fn``'s signature with its ``**options`` spelled out as keyword-only parameters."""
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        have = {p.name for p in params}
        extra = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=d.hint)
            for n, d in self.declared().items()
            if n not in have
        ]
        return sig.replace(parameters=params + extra)

    def twin(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator of a twin ``fn(..., **options)``: its signature and docstring list the options."""
        fn.__signature__ = self.signature(fn)  # type: ignore[attr-defined]
        fn.__ptopt_options__ = self  # type: ignore[attr-defined]
        lines = [f"    ``{n}``: {d.opt.help}" for n, d in self.declared().items()]
        fn.__doc__ = (fn.__doc__ or "") + "\n\n    Options (``ptopt.core.options``):\n\n" + "\n".join(lines)
        return fn


@functools.cache
def _declared(groups: tuple[type | Part, ...]) -> dict[str, Declared]:
    parts = [(g.cls, g.names) if isinstance(g, Part) else (g, None) for g in groups]

    def fields(cls: type, names: tuple[str, ...] | None) -> dict[str, tuple[dataclasses.Field, Any]]:
        return {k: v for k, v in fields_of(cls).items() if names is None or k in names}

    opts: dict[str, Opt] = {}
    hints: dict[str, Any] = {}
    for cls, names in parts:
        for name, (f, hint) in fields(cls, names).items():
            if OPT in f.metadata and name not in opts:
                opts[name], hints[name] = f.metadata[OPT], hint
    defaults: dict[str, list[tuple[type, Any]]] = {n: [] for n in opts}
    for cls, names in parts:
        for name, (f, _) in fields(cls, names).items():
            if name in opts and cls not in (c for c, _ in defaults[name]):
                defaults[name].append((cls, _default(f)))
    return {n: Declared(n, opts[n], hints[n], tuple(defaults[n])) for n in opts}


def coerce(d: Declared, value: Any, key: str | None = None) -> Any:
    """A given value in its field's type, as the CLI flag's type would read it (``"false"`` → False,
    ``"5"`` → 5); a comma-separated string or a list becomes a tuple. UsageError naming ``key`` (the
    keyword or recipe key given) for a value the option does not take (``per_channel: maybe``)."""
    key = d.flag if _FLAGS.get() and key in (None, d.name) else key or d.name
    if value is None:
        return None
    if d.many or typing.get_origin(d.hint) is tuple or _optional_tuple(d.hint):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()] if d.opt.csv else [value]
        elif not isinstance(value, (list, tuple)):
            value = [value]
        item = _item_hint(d.hint)
        return tuple(tuple(v) if isinstance(v, list) else typed(item, v, key) for v in value)
    return typed(d.hint, value, key)


#: the words click's BOOL reads as true / false
_TRUE = ("true", "1", "yes", "y", "on", "t")
_FALSE = ("false", "0", "no", "n", "off", "f")


def typed(hint: Any, value: Any, key: str) -> Any:
    """``value`` as a scalar of ``hint`` (bool, int, float, str, a union of them; anything else is
    taken as it is); UsageError ``KEY: VALUE is not WHAT`` where it is not one."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if len(args) == 1:
            return typed(args[0], value, key)
        return _one_of(args, value, key)
    if typing.get_origin(hint) is typing.Literal:
        hint = type(args[0]) if args else str
    convert = _CONVERT.get(hint)
    if convert is None or isinstance(value, os.PathLike) and hint is str:
        return value
    try:
        return convert(value)
    except (TypeError, ValueError):
        raise UsageError(f"{key}: {value!r} is not {_WHAT[hint]}") from None


def _one_of(kinds: list[Any], value: Any, key: str) -> Any:
    """``value`` as it is where it is one of ``kinds`` (``int | str``: 4 or ``"auto"``)."""
    if any(k not in _CONVERT for k in kinds):
        return value
    for k in kinds:
        if isinstance(value, k) and (k is bool or not isinstance(value, bool)):
            return value
    if str in kinds and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return value
    for k in kinds:
        with contextlib.suppress(TypeError, ValueError):
            return _CONVERT[k](value)
    raise UsageError(f"{key}: {value!r} is not {' or '.join(_WHAT[k] for k in kinds)}")


def _scalar(value: Any) -> Any:
    """A numpy scalar or a one-value tensor as the Python value it holds (a twin's ``epochs=np.int64(3)``,
    ``per_channel=np.bool_(True)``, ``lr=torch.tensor(1e-3)``); anything else as it is."""
    if not isinstance(value, (str, bytes)) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


def _to_bool(value: Any) -> bool:
    value = _scalar(value)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(value)


def _to_int(value: Any) -> int:
    value = _scalar(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():  # a twin's epochs=3.0; 2.5 is refused
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise ValueError(value)


def _to_float(value: Any) -> float:
    value = _scalar(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return value if isinstance(value, float) else float(value)
    if isinstance(value, str):
        return float(value.strip())
    raise ValueError(value)


def _to_str(value: Any) -> Any:
    """Text as it is, a number as its text; a bool, list or mapping is refused (``observer: [minmax]``).
    Any other object stays as it is: a twin's ``device=torch.device("cuda")`` is the twin's to judge."""
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (bool, list, tuple, set, dict)):
        raise ValueError(value)
    return value


_CONVERT: dict[Any, Callable[[Any], Any]] = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}
_WHAT = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def _item_hint(hint: Any) -> Any:
    """The type of one item of ``tuple[X, ...]`` (or ``tuple[X, ...] | None``); Any where unknown."""
    for h in (hint, *typing.get_args(hint)):
        if typing.get_origin(h) is tuple and typing.get_args(h):
            return typing.get_args(h)[0]
    return Any


def _optional_tuple(hint: Any) -> bool:
    return any(typing.get_origin(a) is tuple for a in typing.get_args(hint))


def cli_values(d: Declared, value: Any) -> Any:
    """What the CLI passes for option ``d`` given as ``value`` (None / () when not given)."""
    if value is None or (d.opt.repeat and value == ()):
        return None
    return value
