"""Capturing a model as a graph, shared by every writer: sample inputs for tracing, ``torch.export``
with the specs' ``Dim``s, ``torch.jit.trace`` / ``torch.jit.script``, and quieting the exporters.

A capture failure is an UnsupportedModelError that says what could not be captured (and, for the
ONNX exporter, which op in which module), never a traceback from deep inside torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ptopt.core.errors import UnsupportedModelError, clip
from ptopt.core.inputspec import InputSpec, call_args, flatten_inputs, make_inputs
from ptopt.core.quiet import silenced
from ptopt.formats.shapes import torch_export_dynamic_shapes


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """The exporters print progress and log warnings (missing torchvision ops, opset conversion); and
    torch turns its ONNX C++ log on for every TorchScript-path export (``setup_onnx_logging`` tests the
    function ``_jit_is_onnx_log_enabled``, not its value), which prints the whole Torch IR graph to file
    descriptor 1 when a translation fails: all that native code writes there is dropped."""
    loggers = (
        "torch.onnx",
        "torch.export",
        "torch._export",
        "torch.fx.experimental.symbolic_shapes",
        "onnxscript",
    )
    with silenced(loggers, streams=True, native_stdout=True):
        yield


#: torch.onnx's op registry built once per opset in this process (:func:`torchlib_registry_reused`)
_REGISTRIES: dict[Any, Any] = {}


@contextlib.contextmanager
def torchlib_registry_reused() -> Iterator[None]:
    """torch.onnx's dynamo exporter rebuilds its op registry from onnxscript's torchlib at every export
    (torch 2.11-2.13: the source of ~500 ONNX functions parsed again, 1.5-5 s of each export on 2
    cores), though nothing in it changes within a process. Inside this block the first build per
    opset is kept and every export gets its own copy of it (the exporter may add custom ops to the
    one it gets). Where torch moves that private class, the exporter runs as it is."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:  # a torch without the class: nothing to reuse
        yield
        return
    original = ONNXRegistry.__dict__.get("from_torchlib")
    if not isinstance(original, classmethod):
        yield
        return
    build = original.__get__(None, ONNXRegistry)

    def from_torchlib(*args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        if key not in _REGISTRIES:
            _REGISTRIES[key] = build(*args, **kwargs)
        built, copy = _REGISTRIES[key], ONNXRegistry()
        copy._opset_version = built._opset_version
        copy.functions = {target: list(decomps) for target, decomps in built.functions.items()}
        return copy

    ONNXRegistry.from_torchlib = staticmethod(from_torchlib)  # called on the class and on an instance
    try:
        yield
    finally:
        ONNXRegistry.from_torchlib = original


def first_lines(text: str, n: int) -> str:
    """The first ``n`` non-empty lines of an error message, joined (at most 400 characters)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return clip(" ".join(lines[:n]), 400)


def output_names(n: int, keys: list[str] | None = None, taken: Iterable[str] = ()) -> list[str]:
    """The names an exported graph gives its ``n`` outputs: the model's own where it returns a dict
    (``logits``, ``image_embeds``, ``last_hidden_state``: what a server answers and ``core.scores``
    reads), else ``output`` / ``output_i``. ``keys``: ``flatten_named_outputs``' names, in order.
    ``taken``: the graph's input names; an output never reuses one (nor another output's name)."""
    if not keys or len(keys) != n or all(k.replace(".", "").isdigit() for k in keys):
        keys = ["output"] if n == 1 else [f"output_{i}" for i in range(n)]
    used, names = set(taken), []
    for i, k in enumerate(keys):
        name = re.sub(r"[^A-Za-z0-9_]", "_", k)
        if not name or k.replace(".", "").isdigit():
            name = f"output_{i}"
        while name in used:
            name = f"{name}_{i}"
        used.add(name)
        names.append(name)
    return names


def output_keys(module: Any, x: Any) -> list[str]:
    """``flatten_named_outputs``' name of each output of ``module`` on ``x`` (``"logits"``, ``"0"``)."""
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.core.tensors import flatten_named_outputs

    with torch.inference_mode():
        return [n for n, _ in flatten_named_outputs(call_model(module, x))]


def graph_output_names(module: Any, x: Any, taken: Iterable[str] = ()) -> list[str]:
    """``output_names`` of ``module``'s outputs on ``x`` (``taken``: the graph's input names)."""
    keys = output_keys(module, x)
    return output_names(len(keys), keys, taken)


def weight_bytes(module: Any) -> int:
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        total += t.numel() * t.element_size()
    return total


def example_for_export(specs: Sequence[InputSpec], style: str) -> Any:
    """Sample inputs at the opt shape, except that a dynamic dim of size 1 becomes 2: torch.export
    specializes sizes 0 and 1 to constants, which would contradict the dynamic Dim."""
    fixed = []
    for s in specs:
        opt = tuple(
            min(2, hi) if (d == 1 and lo != hi) else d
            for d, lo, hi in zip(s.opt_shape, s.min_shape, s.max_shape, strict=False)
        )
        fixed.append(dataclasses.replace(s, opt_shape=opt))
    return make_inputs(fixed, style, which="opt")


def fits_for_export(specs: Sequence[InputSpec], x: Any) -> bool:
    """Whether a given example batch can stand in for ``example_for_export``: one tensor per spec of
    the spec's rank, every dim within [min, max], and no dynamic dim of size 0 or 1."""
    got = flatten_inputs(x)
    if len(got) != len(specs):
        return False
    for s, (_, t) in zip(specs, got, strict=False):
        if len(t.shape) != s.rank:
            return False
        for i, d in enumerate(t.shape):
            if not s.min_shape[i] <= d <= s.max_shape[i] or (i in s.dynamic_dims and d < 2):
                return False
    return True


def export_program(
    module: Any, specs: Sequence[InputSpec], style: str, device: str = "cpu", example: Any = None
) -> Any:
    """``torch.export.export`` with the specs' Dims; a failure names what torch.export could not trace.

    ``example``: the batch to capture with (default ``example_for_export(specs, style)``)."""
    import torch

    x = example if example is not None else example_for_export(specs, style)
    args, kwargs = call_args(x)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    dyn = torch_export_dynamic_shapes(specs, style)
    try:
        with quiet_export():
            return torch.export.export(module, args, kwargs or None, dynamic_shapes=dyn, strict=False)
    except Exception as e:  # noqa: BLE001 - torch.export raises many kinds (UserError, GuardOnDataDependent...)
        fix = shape_range_fix(str(e), specs)
        if fix:
            raise UnsupportedModelError(fix) from None
        raise UnsupportedModelError(
            f"torch.export cannot capture the model with inputs {', '.join(s.describe() for s in specs)}: "
            f"{type(e).__name__}: {first_lines(str(e), 3)}. If a dimension must stay fixed, give the same "
            f"min/opt/max for it; a model torch.export cannot trace can still go to --target torchscript"
        ) from None


#: one line of torch.export's constraint violation: a dynamic dimension whose range the model's code narrows
_GUARD_RE = re.compile(
    r"Not all values of \w+ = L\['(\w+)'\]\.size\(\)\[(\d+)\] in the specified range "
    r"(\d+) <= \w+ <= (\d+) satisfy the generated guard (.+?)\.?$",
    re.M,
)
_GUARD_NAMES = {"Max": max, "Min": min, "Mod": lambda a, b: a % b, "Eq": lambda a, b: a == b}


def shape_range_fix(message: str, specs: Sequence[InputSpec]) -> str | None:
    """torch.export's "Constraints violated ... Not all values of h = L['x'].size()[2] in the specified
    range 32 <= h <= 96 satisfy the generated guard G" as one line: the dimension, the sizes G allows
    within the range (G evaluated at each size) and the --min-shape/--max-shape that work; None when
    the message is not that, or a guard cannot be read."""
    found: dict[tuple[int, int], tuple[int, int, list[str]]] = {}
    for arg, dim, lo, hi, guard in _GUARD_RE.findall(message):
        spec = next((i for i, sp in enumerate(specs) if sp.name == arg), 0 if len(specs) == 1 else None)
        if spec is None:
            return None
        expr = guard.replace(f"L['{arg}'].size()[{dim}]", "v")
        if not re.fullmatch(r"[\sv\d()+\-*/%<>=!,MaxinodEqrt]*", expr):
            return None
        key = (spec, int(dim))
        found.setdefault(key, (int(lo), int(hi), []))[2].append(expr)
    if not found:
        return None
    mins = {i: list(sp.min_shape) for i, sp in enumerate(specs)}
    maxs = {i: list(sp.max_shape) for i, sp in enumerate(specs)}
    said = []
    for (spec, dim), (lo, hi, exprs) in sorted(found.items()):
        ok = _sizes_allowed(exprs, lo, hi)
        if not ok:
            return None
        mins[spec][dim], maxs[spec][dim] = ok[0], ok[-1]
        said.append(f"dimension {dim} of {specs[spec].name} takes {ok[0]}..{ok[-1]}, not all of {lo}..{hi}")
    flags = [
        f"{flag} {prefix}{'x'.join(map(str, shape[i]))}"
        for flag, shape, given in (("--min-shape", mins, "min_shape"), ("--max-shape", maxs, "max_shape"))
        for i, sp in enumerate(specs)
        if tuple(shape[i]) != tuple(getattr(sp, given))
        for prefix in [f"{sp.name}=" if len(specs) > 1 else ""]
    ]
    return (
        f"torch.export cannot keep the range you gave: {'; '.join(said)} (the model's code narrows it, e.g. "
        f"a downsampling layer that needs the size above a stride); give {' '.join(flags)}"
    )


def _sizes_allowed(exprs: list[str], lo: int, hi: int) -> list[int]:
    """The sizes in lo..hi at which every guard (an expression in ``v`` of digits and operators,
    checked by the caller) holds; [] where one cannot be evaluated."""
    scope = {"__builtins__": {}, **_GUARD_NAMES}
    try:
        return [v for v in range(lo, hi + 1) if all(eval(x, scope, {"v": v}) for x in exprs)]  # noqa: S307
    except Exception:  # noqa: BLE001 - a guard this reader does not follow: the raw message instead
        return []


def trace(module: Any, x: Any, style: str, hint: str = "") -> tuple[Any, list[str]]:
    """``torch.jit.trace`` on the batch ``x``; returns the ScriptModule and the tracer's warnings
    (data-dependent control flow baked in), which the reload check then judges. ``hint``: what the
    caller's user can do instead, appended to a failure's message. An output the tracer cannot type
    (CLIP's ``CLIPOutput`` holds each tower's whole output as a nested ModelOutput) is traced again
    as one flat dict of its tensors (:func:`flat_tensors`), named as ptopt's comparisons name them."""
    try:
        return _trace(module, x, style, hint)
    except UnsupportedModelError as e:
        if "cannot infer type of" not in str(e):
            raise
        return _trace(flat_tensors(module), x, style, hint)


def flat_tensors(module: Any) -> Any:
    """``module`` returning its output's tensors as one dict named as every comparison names them
    (``core.tensors.named_leaves``: ``logits_per_image``, ``text_model_output.pooler_output``); its
    ``forward`` keeps the module's signature (the tracer binds keyword inputs by it)."""
    import inspect

    import torch

    from ptopt.core.tensors import named_leaves

    class FlatTensors(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = module

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            leaves = named_leaves(self.module(*args, **kwargs))
            return {name: v for name, v in leaves if isinstance(v, torch.Tensor)}

    FlatTensors.forward.__signature__ = inspect.signature(type(module).forward)  # type: ignore[attr-defined]
    return FlatTensors()


def _trace(module: Any, x: Any, style: str, hint: str) -> tuple[Any, list[str]]:
    import torch

    # the tracer reads every attribute of every module: transformers' properties log as it does
    # (GPT-2's ``loss_function``: "`loss_type=None` was set in the config but it is unrecognized")
    with silenced(("transformers",)), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        said = io.StringIO()  # a failing torch.fx GraphModule prints its own traceback to stderr
        try:
            with torch.inference_mode(False), torch.no_grad(), contextlib.redirect_stderr(said):
                if style == "keyword":
                    sm = torch.jit.trace(
                        module, example_kwarg_inputs=dict(x), check_trace=False, strict=False
                    )
                else:
                    args = tuple(x) if isinstance(x, (tuple, list)) else (x,)
                    sm = torch.jit.trace(module, args, check_trace=False, strict=False)
        except Exception as e:  # noqa: BLE001 - the tracer raises whatever the model's code raises
            raise UnsupportedModelError(
                f"torch.jit.trace cannot trace {type(module).__name__}: {type(e).__name__}: "
                f"{without_values(first_lines(str(e), 1))[:300]}{hint}"
            ) from None
    sys.stderr.write(said.getvalue())  # what the trace said when it worked
    notes = sorted({tracer_note(w) for w in caught if issubclass(w.category, torch.jit.TracerWarning)})
    return sm, notes


def tracer_note(w: warnings.WarningMessage) -> str:
    """A tracer warning as one short note: its first sentence (whole, never cut mid-word) and the line
    of the model's code that raised it (``modeling_bert.py:1023``), where the user can look."""
    first = str(w.message).strip().splitlines()[0] if str(w.message).strip() else ""
    sentence = re.split(r"(?<=[.!?])\s", first, maxsplit=1)[0].rstrip(".")
    where = f" ({os.path.basename(w.filename)}:{w.lineno})" if w.filename else ""
    return f"{clip(sentence, 200)}{where}"


def without_values(message: str) -> str:
    """An error message without the tensors it prints: torch's tracer quotes the model's whole output
    (``cannot infer type of CausalLMOutputWithPast(loss=None, logits=tensor([[...``); the type's name
    says what is wrong, the values only flood a one-line message."""
    m = re.search(r"cannot infer type of (\w+)\(", message)
    if m:
        return f"{message[: m.end() - 1]} (a {m.group(1)}, not a tensor or a tuple/list/dict of tensors)"
    return message.split("tensor(")[0].rstrip(" ,=([") if "tensor(" in message else message


def script(module: Any) -> Any:
    """``torch.jit.script``: control flow kept; an unsupported construct is an UnsupportedModelError."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.jit.script(module)
    except Exception as e:  # noqa: BLE001 - the TorchScript compiler raises frontend errors of many kinds
        raise UnsupportedModelError(
            f"torch.jit.script cannot compile {type(module).__name__}: {first_lines(str(e), 2)[:300]}. "
            f"Export without --script (tracing) instead"
        ) from None


def failing_op(error: BaseException, ep: Any = None) -> str:
    """'op aten.linalg_eigh in module inner.solver (Solver)' from an exporter error, as far as it says."""
    text = str(error)
    m = (
        re.search(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)", text)
        or re.search(r"target=torch\.ops\.([\w.]+)\]", text)
        or re.search(r"operator '([\w:.]+)'", text)
    )
    if not m:
        return ""
    op = m.group(1)
    return f"op {op}{_op_location(op, ep) if ep is not None else ''}"


def _op_location(op: str, ep: Any) -> str:
    """' in module 'solver' (Solver)': where the ExportedProgram's ``nn_module_stack`` puts ``op``."""
    key = _op_key(op)
    for node in ep.graph.nodes:
        if node.op == "call_function" and _op_key(str(node.target)) == key:
            stack = node.meta.get("nn_module_stack") or {}
            if not stack:
                return " in the top-level module"
            path, typ = list(stack.values())[-1]
            name = typ.rsplit(".", 1)[-1] if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
            return f" in module {path!r} ({name})" if path else f" in the top-level module ({name})"
    return ""


def _op_key(target: str) -> str:
    """'aten._linalg_eigh.default' and 'aten.linalg_eigh.default' → 'linalg_eigh'."""
    parts = target.replace("::", ".").split(".")
    parts = [p for p in parts if p not in ("aten", "torch", "ops", "default", "prims", "Tensor")]
    return parts[0].lstrip("_") if parts else target
