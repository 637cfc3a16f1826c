"""Which model files may run code when loaded, checked before torch reads a byte of them.

``torch.export.load`` runs Python from the archive in three ways (all seen with torch 2.13):

- a weight or constant whose entry in ``data/{weights,constants}/model_*_config.json`` says
  ``use_pickle: true`` is read with ``torch.load(weights_only=False)``; so are constants stored as
  ``custom_obj_*`` / ``opaque_obj_*`` (plain ``pickle.loads``);
- the sample inputs (and the legacy ``.pt`` weight files) are read with ``weights_only=True`` and,
  when that fails, AGAIN with ``weights_only=False``: any pickle there runs;
- every symbolic shape in ``models/*.json`` (``expr_str``) goes through ``sympy.sympify``, which is
  ``eval``: ``__import__('os')...`` in a shape runs.

An AOTInductor package (``data/aotinductor/``) is a compiled shared library: loading it runs its
native code. So a ``.pt2`` is refused unless none of these can happen, or ``allow_pickle`` says the
file is trusted. TorchScript archives need no check: ``torch.jit.load`` unpickles ``data.pkl`` with
TorchScript's own unpickler, which resolves names only to TorchScript types (``io.open`` in a
crafted ``data.pkl`` fails with "Unknown type name"), and its ``code/`` is compiled by TorchScript,
not run by Python. A plain ``torch.save`` file is read with ``weights_only=True`` first
(``ptopt.core.modelref``), and a pickled module needs ``allow_pickle`` there.

The pickles torch must read anyway (sample inputs) are scanned statically: every global they name
must be one of the few that ``torch.save`` writes for tensors, dicts and tuples.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import pickletools
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError, UnsafePickleError
from ptopt.core.quiet import silenced

HINT = (
    "loading it would run code from the file. Pass --allow-pickle (allow_pickle=True) only if you "
    "trust where the file came from"
)

#: globals ``torch.save`` writes for tensors, parameters and containers (a subset of torch's own
#: ``weights_only`` allowlist): calling any of them cannot reach the file system or a shell
_SAFE_GLOBALS = {
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
    ("_codecs", "encode"),  # bytes in protocol-2 pickles
    ("torch", "Size"),
    ("torch", "device"),
    ("torch", "Tensor"),
    ("torch.nn.parameter", "Parameter"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.serialization", "_get_layout"),
} | {
    ("torch._utils", f"_rebuild_{k}")
    for k in (
        "tensor",
        "tensor_v2",
        "tensor_v3",
        "parameter",
        "parameter_with_state",
        "qtensor",
        "sparse_tensor",
        "nested_tensor",
        "meta_tensor_no_storage",
        "wrapper_subclass",
    )
}
_TORCH_NAME = re.compile(
    r"(?:[A-Z][A-Za-z0-9]*Storage|UntypedStorage|float\d*|bfloat16|half|double|u?int\d*|long|short|"
    r"bool|complex\d*|cfloat|cdouble|quint\w*|qint\w*|float8_\w+|bits\w+|strided|sparse_\w+|_mkldnn|"
    r"per_tensor_\w+|per_channel_\w+|(?:contiguous|channels_last|preserve)_format\w*|channels_last_3d)"
)

#: names a symbolic shape may call (torch's serde list + sympy's arithmetic and relations)
_SYMPY_CALLS = {
    "Symbol", "Integer", "Float", "Rational", "Max", "Min", "Mod", "Abs", "Eq", "Ne", "Lt", "Le",
    "Gt", "Ge", "And", "Or", "Not", "Piecewise", "floor", "ceiling", "sqrt", "Pow", "Mul", "Add",
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal",
    "ToFloat", "Identity", "OpaqueUnaryFn_sqrt", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or",
}  # fmt: skip
_SYMPY_CONSTANTS = {"oo", "zoo", "nan", "true", "false", "True", "False", "pi", "E", "I"}
#: torch's shape symbols: s0, u3, zf1, ps2, r0_4 ...
_SYMBOL = re.compile(r"[a-z]+[a-z0-9_]*[0-9]\Z")
_SAFE_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.keyword,
    ast.Name, ast.Load, ast.Constant, ast.operator, ast.unaryop, ast.boolop, ast.cmpop,
)  # fmt: skip


def check_model_file(path: str | Path, allow_pickle: bool = False) -> None:
    """Refuse a model file that is not what its name says, or whose loading would run code.

    Raises ``ModelLoadError`` for a ``.pt2`` that is no PT2 archive (so torch never prints its
    traceback for it) and ``UnsafePickleError`` (exit 2, naming ``--allow-pickle``) for an archive
    that asks torch to unpickle, eval or dlopen something, unless ``allow_pickle``. Other files,
    and zips that are no PT2 archive, are left to their loaders (see the module docstring).
    """
    path = Path(path)
    if not path.is_file():
        return
    is_pt2 = path.suffix.lower() == ".pt2"
    if not zipfile.is_zipfile(path):
        if is_pt2:
            raise ModelLoadError(f"{path}: not a .pt2 archive (not a zip file)")
        return
    try:
        with zipfile.ZipFile(path) as z:
            entries = _entries(z)
            if not _is_pt2_archive(entries):
                if is_pt2:
                    raise ModelLoadError(
                        f"{path}: not a .pt2 archive (no models/*.json or archive_format inside); "
                        "write one with torch.export.save or `ptopt export --target exported_program`"
                    )
                return
            if allow_pickle:
                return
            problem = archive_problem(z, entries)
    except zipfile.BadZipFile as e:
        raise ModelLoadError(f"{path}: corrupt zip archive ({e})") from None
    if problem:
        raise UnsafePickleError(f"{path}: refusing to load: {problem}; {HINT}")


def archive_problem(z: zipfile.ZipFile, entries: dict[str, zipfile.ZipInfo] | None = None) -> str | None:
    """Why loading this PT2 archive would run code from it (the first reason found), or None."""
    entries = _entries(z) if entries is None else entries
    raw: set[str] = set()  # weight/constant files torch reads as raw bytes, never unpickles
    for name, info in entries.items():
        rel = _relative(name)
        if rel.startswith("data/aotinductor/"):
            return "it is an AOTInductor package (compiled native code that runs when it is loaded)"
        if rel.startswith(("data/weights/", "data/constants/")) and rel.endswith("_config.json"):
            why = _payload_config_problem(z.read(info), rel, raw)
            if why:
                return why
    for name, info in entries.items():
        rel = _relative(name)
        if rel in raw or rel.endswith("_config.json") or name.endswith("/"):
            continue
        data = z.read(info)
        if rel in _LEGACY_PICKLED or data.startswith((b"PK", b"\x80")):
            why = _torch_save_problem(data, rel)  # torch.load, retried without weights_only
        elif rel.endswith(".json"):
            why = _json_problem(data, rel)
        else:
            why = None  # archive_format, version, byteorder ... read as text
        if why:
            return why
    return None


def _entries(z: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    entries: dict[str, zipfile.ZipInfo] = {}
    for info in z.infolist():
        if info.filename in entries:
            # Python reads the last copy of a name, torch's reader may read another one
            raise UnsafePickleError(f"{z.filename}: refusing to load: it holds {info.filename!r} twice")
        entries[info.filename] = info
    return entries


#: the 2.7 layout's files that torch.load reads whatever their name says
_LEGACY_PICKLED = {"serialized_state_dict.json", "serialized_constants.json"}


def _relative(name: str) -> str:
    """The record name inside a PT2 archive, without its root folder (``archive/`` or the file stem)."""
    if name in ("serialized_exported_program.json", "version") or name.startswith("serialized_"):
        return name  # the 2.7 layout, at the zip's root
    return name.split("/", 1)[1] if "/" in name else name


def _is_pt2_archive(entries: dict[str, zipfile.ZipInfo]) -> bool:
    for name in entries:
        rel = _relative(name)
        if rel in ("archive_format", "serialized_exported_program.json") or (
            rel.startswith(("models/", "data/aotinductor/")) and not rel.endswith("/")
        ):
            return True
    return False


def _payload_config_problem(data: bytes, where: str, raw: set[str]) -> str | None:
    try:
        config = json.loads(data).get("config") or {}
        items = list(config.items())
    except (ValueError, AttributeError):
        return f"{where} is not a readable payload config"
    for fqn, meta in items:
        if not isinstance(meta, dict):
            return f"{where} is not a readable payload config"
        path_name = str(meta.get("path_name", ""))
        if meta.get("use_pickle") or path_name.startswith(("custom_obj", "opaque_obj")):
            return f"{where} asks to unpickle {fqn!r} ({path_name})"
        raw.add(where.rsplit("/", 1)[0] + "/" + path_name)
    return None


def _torch_save_problem(data: bytes, where: str) -> str | None:
    """Whether a ``torch.save`` blob that torch unpickles unrestricted if it must holds anything but data."""
    if not data:
        return None
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return f"{where} is a pickle in a format ptopt cannot check"
    with zipfile.ZipFile(io.BytesIO(data)) as inner:
        pickles = [i for i in inner.infolist() if i.filename.endswith(".pkl")]
        if not pickles:
            return f"{where} is a pickle in a format ptopt cannot check"
        for info in pickles:
            for glob in pickle_globals(inner.read(info)):
                if glob is None or not _safe_global(*glob):
                    name = "an unknown callable" if glob is None else ".".join(glob)
                    return f"{where} is a pickle that calls {name}"
    return None


def _safe_global(module: str, name: str) -> bool:
    return (module, name) in _SAFE_GLOBALS or (module == "torch" and bool(_TORCH_NAME.fullmatch(name)))


_STRING_OPS = {
    "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING",
}  # fmt: skip
_STACK_NEUTRAL = {"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME"}


def pickle_globals(data: bytes) -> Iterator[tuple[str, str] | None]:
    """Every (module, name) a pickle imports; None for one whose name cannot be known statically.

    ``STACK_GLOBAL`` takes its two names from the stack: they are known only when the two opcodes
    that pushed last were strings (or memo reads of strings), which is what every pickler writes.
    A pickle that cannot be parsed yields None.
    """
    memo: dict[int, str | None] = {}
    recent: list[str | None] = []  # the strings the last pushing opcodes put on the stack
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            if name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                yield module, attr
            elif name == "STACK_GLOBAL":
                yield (recent[-2], recent[-1]) if len(recent) >= 2 and None not in recent[-2:] else None
            elif name.startswith("EXT"):
                yield None  # the copyreg extension registry: a callable by number
            if name in _STRING_OPS:
                recent.append(arg if isinstance(arg, str) else None)
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                recent.append(memo.get(int(arg)))
            elif name in _STACK_NEUTRAL:
                top = recent[-1] if recent else None
                if name == "MEMOIZE":
                    memo[len(memo)] = top
                elif name != "FRAME":
                    memo[int(arg)] = top
            else:
                recent = []
    except (ValueError, TypeError):
        yield None


def _json_problem(data: bytes, where: str) -> str | None:
    """A shape expression in a serialized program that is more than arithmetic on shape symbols."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None  # torch rejects it without evaluating anything
    for expr in _expr_strings(doc):
        if not isinstance(expr, str) or not safe_shape_expression(expr):
            return f"{where} has a shape expression that is code: {str(expr)[:80]!r}"
    return None


def _expr_strings(doc: Any) -> Iterator[Any]:
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "expr_str":
                    yield v
                else:
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)


def safe_shape_expression(expr: str) -> bool:
    """Whether ``sympy.sympify(expr)`` can only build an expression (it ``eval``s the text).

    Allowed: numbers, shape symbols (``s0``), the sympy/torch functions of shapes called by name,
    ``Symbol('s0', integer=True)``; no attribute access, subscripts, lambdas or other names.
    """
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if not isinstance(node, _SAFE_NODES):
            return False
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_CALLS):
                return False
            strings = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if strings and not (
                node.func.id == "Symbol" and node.args[0] is strings[0] and len(strings) == 1
            ):
                return False
        elif isinstance(node, ast.Name):
            if not (node.id in _SYMPY_CALLS or node.id in _SYMPY_CONSTANTS or _SYMBOL.match(node.id)):
                return False
        elif isinstance(node, ast.keyword):
            if node.arg is None or node.arg.startswith("_"):
                return False
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if not _SYMBOL.match(node.value):
                return False
        elif isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool)):
            return False
    return True


@contextlib.contextmanager
def quiet_upstream(*loggers: str) -> Iterator[None]:
    """Silence torch's warnings and its logged tracebacks while it reads a file we then report on.

    ``torch.export.load`` of a corrupt file logs a 13-line traceback before raising; ptopt turns the
    exception into one ``error:`` line, so the log is noise.
    """
    names = loggers or ("torch.export", "torch._export", "torch.fx.experimental.symbolic_shapes")
    with silenced(names, level=logging.CRITICAL):
        yield
