"""Are a model's outputs class scores? Top-1 agreement means something only for those.

Top-1 agreement (the share of samples whose arg-max matches the reference's) is a fair figure for
class scores: a classifier's logits or probabilities, a language model's next-token logits, a CTC
head's per-frame scores. For a sentence embedding or an encoder's hidden states the arg-max is one
feature dimension and its agreement says nothing: a faithful int8 sentence encoder (worst cosine
0.99) can agree on 60%. A tensor does not say which it is; the layer that computes it does.
``output_layer`` walks back from the primary output to the first layer with weights: a Linear, a
Conv or a matrix product is a head (class scores); a normalization, a recurrent layer or an
embedding computes features. Labels settle it too, since they index the classes.

::

    layer = output_layer(module, x)            # "Linear", "LayerNorm", "aten::layer_norm", or None
    ok, why = class_scores(out.shape, layer)   # (False, "its output comes from a normalization ...")

Each format reads its own graph (``Runner.output_layer``): an eager module through the ops its forward
calls (a ``TorchFunctionMode``; its leaf modules name them), TorchScript, fx / ExportedProgram, ONNX and
OpenVINO graphs as they are; ``walk_back`` goes from the output. An output named as features
(``image_embeds``) counts too, and so does an ``nn.Identity`` where a classifier was (``model.fc =
nn.Identity()``, timm's ``num_classes=0``): ``REMOVED``. A file ptopt wrote carries the reading of the
module it was written from (``extra.output_layer``, ``Runner.score_layer``): its own graph can lose it.
Where nothing can be read (a compiled package with no record) the shape alone decides."""

from __future__ import annotations

import contextlib
import re
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

HEAD, NORM, RECURRENT, EMBEDDING = "head", "normalization", "recurrent", "embedding"
#: a classifier replaced by ``nn.Identity`` (``model.fc = nn.Identity()``, timm's ``num_classes=0``)
REMOVED = "removed head"
#: how ``_eager_output_layer`` names such a module's output: ``"Identity as fc"``
_REMOVED_PREFIX = "Identity as "
#: what a classifier is called (``fc``, ``classifier``, timm's ``head`` / ``head.fc``, ``heads.head``):
#: an ``nn.Identity`` of that name, or the last child of a Sequential of that name, is a removed head
_HEAD_NAMES = {"fc", "classifier", "head", "heads", "last_linear", "lm_head", "score", "logits", "cls_head"}
#: an output whose name says it holds features (``image_embeds``, ``last_hidden_state``, ``pooler_output``)
NAMED = "named"
#: how far ``walk_back`` looks before giving up (nodes visited)
MAX_VISITED = 5000

_HEAD_TOKENS = {
    "gemm",
    "addmm",
    "mm",
    "bilinear",
    "convolution",
    "groupconvolution",
    "convinteger",
    "bmm",
    "baddbmm",
    "einsum",
    "qlinearconv",
}
_NOT_HEADS = {"quantizelinear", "dequantizelinear"}  # ONNX's quantize / dequantize pair
_RECURRENT_TOKENS = {"lstm", "gru", "rnn", "lstmsequence", "grusequence", "rnnsequence"}
#: an RMSNorm made of primitives (T5's, Llama's) in a traced graph: x * rsqrt(mean(x²) + eps);
#: ONNX writes rsqrt as Sqrt then Reciprocal, OpenVINO as x / Sqrt(...)
_NORM_TOKENS = {"mvn", "rsqrt", "sqrt", "reciprocal", "rms"}
_NAMED_TOKENS = {"embeds", "hidden", "pooler", "features"}


def family(name: str) -> str | None:
    """What a layer or op computes, from its name (a module class, ``aten::linear``,
    ``aten.layer_norm.default``, an ONNX ``op_type``, an OpenVINO type, an output's name): ``HEAD``,
    ``NORM``, ``RECURRENT``, ``EMBEDDING``, ``NAMED`` (an output named as features), or None for a
    layer without weights of its own (an activation, pooling, reshaping, a quantize/dequantize pair)."""
    if name.startswith(_REMOVED_PREFIX):
        return REMOVED
    for t in re.split(r"[^a-z0-9]+", name.lower()):
        if "norm" in t or t in _NORM_TOKENS:
            return NORM
        if t in _NAMED_TOKENS:
            return NAMED
        if t in _RECURRENT_TOKENS or t.startswith(("lstm", "gru")):
            return RECURRENT
        if "embedding" in t:
            return EMBEDDING
        if t in _HEAD_TOKENS or (t.endswith("linear") and t not in _NOT_HEADS) or "matmul" in t:
            return HEAD
        if t.startswith("conv") and not t.startswith("convert"):
            return HEAD
    return None


def class_scores(
    shape: Iterable[int], layer: str | None, *, labels: bool = False, outputs: Any = None
) -> tuple[bool, str | None]:
    """Whether outputs of ``shape`` ([N, classes] or [N, tokens, vocab]) computed by ``layer``
    (``output_layer``; None: not known) are class scores, and if not, why (one clause). Labels say
    they are; ``outputs`` (a sample of them) whose every row has length 1 are an embedding."""
    shape = tuple(shape)
    if len(shape) not in (2, 3) or shape[-1] < 2:
        return False, f"its outputs {list(shape)} are not [N, classes] or [N, tokens, classes]"
    if labels:
        return True, None
    if outputs is not None and _unit_rows(outputs):
        return False, "every output row has length 1: a normalized embedding"
    if layer is None or family(layer) == HEAD:
        return True, None
    if family(layer) == NAMED:
        return False, f"its output is named {layer}, so it holds features: an embedding or hidden states"
    if family(layer) == REMOVED:
        head = layer[len(_REMOVED_PREFIX) :]
        return False, f"its {head} is nn.Identity (the classifier was removed), so it holds features"
    what = {NORM: "a normalization", RECURRENT: "a recurrent layer", EMBEDDING: "an embedding"}[family(layer)]
    return (
        False,
        f"its output comes from {what} ({layer}), so it holds features: an embedding or hidden states",
    )


def labels_on_features(shape: Iterable[int], layer: str | None, outputs: Any = None) -> str | None:
    """With labels given (they make ``class_scores`` say yes), the note to print when the outputs still
    look like features (the layer behind them is a normalization, a removed head, an embedding...): top-1
    is measured as asked, but against these labels it may mean nothing. None for a head's outputs."""
    shape = tuple(shape)
    ok, why = class_scores(shape, layer, outputs=outputs)
    if ok or not class_scores(shape, layer, labels=True)[0]:
        return None
    return (
        f"labels were given, but the outputs look like features: {why}; top-1 against these labels may "
        "mean nothing (the worst-sample cosine is the figure that does)"
    )


def _unit_rows(outputs: Any) -> bool:
    """Every row (last axis) of a float tensor of L2 length 1, to 1e-3 (probabilities, one-hot aside)."""
    import torch

    if not torch.is_tensor(outputs) or not outputs.is_floating_point() or outputs.numel() == 0:
        return False
    o = outputs.detach().double()
    if bool((o >= 0).all()) and bool(((o.sum(-1) - 1).abs() < 1e-3).all()):
        return False  # probabilities: a one-hot row has length 1 too
    return bool(((o.norm(dim=-1) - 1).abs() < 1e-3).all())


def model_class_scores(model: Any, x: Any, *, labels: bool = False) -> tuple[bool, str | None]:
    """``class_scores`` of ``model``'s primary output on the batch ``x`` (a small one: it runs twice),
    its layer read by ``output_layer``."""
    out, layer = _output_and_layer(model, x)
    return class_scores(out.shape, layer, labels=labels, outputs=out)


def model_labels_on_features(model: Any, x: Any) -> str | None:
    """``labels_on_features`` of ``model``'s primary output on the batch ``x`` (labels given)."""
    out, layer = _output_and_layer(model, x)
    return labels_on_features(out.shape, layer, outputs=out)


def _output_and_layer(model: Any, x: Any) -> tuple[Any, str | None]:
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.core.tensors import primary_output

    layer = output_layer(model, x)
    with torch.no_grad():
        out = primary_output(call_model(model, x)).detach().float()
    return out, layer


#: the layers read on the modules loaded files were written from (their sidecars' ``extra.output_layer``)
_RECORDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remember_layer(module: Any, layer: str) -> None:
    """``output_layer`` of ``module`` (loaded from a file) is ``layer``, as read on the module the file
    was written from: a frozen TorchScript graph folds a last BatchNorm into the Conv before it. The
    record holds while the module's layers are the ones it was loaded with (``gm.fc = nn.Identity()``
    afterwards: its own graph is read again)."""
    with contextlib.suppress(TypeError):  # a module that takes no weak reference: read its graph
        _RECORDED[module] = (layer, _layers_of(module))


def _layers_of(module: Any) -> tuple[tuple[str, int], ...]:
    """Which submodule sits where (names and identities): what an edit in place changes."""
    return tuple((n, id(m)) for n, m in module.named_modules()) if hasattr(module, "named_modules") else ()


def output_layer(model: Any, x: Any) -> str | None:
    """The first layer with weights behind ``model``'s primary output on the batch ``x`` (its type or
    op name), or None where it cannot be read. ``model``: an eager module, a TorchScript module or an
    fx GraphModule (``ExportedProgram.module()``); a loaded file's ``remember_layer`` answers first."""
    import torch

    with contextlib.suppress(KeyError, TypeError):
        layer, layers = _RECORDED[model]
        if layers == _layers_of(model):
            return layer

    if isinstance(model, torch.jit.ScriptModule):
        return _script_output_layer(model)
    if isinstance(model, torch.fx.GraphModule):
        return fx_output_layer(model)
    if isinstance(model, torch.nn.Module):
        return _eager_output_layer(model, x)
    return None


def named(layer: str | None, name: Any) -> str | None:
    """``layer``, or the primary output's ``name`` where that says features (``image_embeds``: a
    CLIP projection is a Linear, yet it computes an embedding) and the layer says class scores."""
    if isinstance(name, str) and family(name) in (NAMED, EMBEDDING) and family(layer or "") in (HEAD, None):
        return name
    return layer


def walk_back(
    start: Iterable[Any],
    inputs_of: Callable[[Any], Iterable[Any]],
    name_of: Callable[[Any], str],
    key_of: Callable[[Any], Any] = id,
) -> str | None:
    """Breadth-first from ``start`` (the nodes that produce the output) through ``inputs_of``: the name
    of the nearest node whose ``family`` is known, or None; of several as near, a normalization
    (OpenVINO's RMSNorm ``x / Sqrt(...)`` is as far from the output as the residual's MatMul).
    ``key_of``: a node's identity (the nodes seen are kept alive, so ``id`` stays unique)."""
    queue, seen, found = deque((s, 0) for s in start), {}, []
    while queue and len(seen) < MAX_VISITED:
        node, depth = queue.popleft()
        if found and depth > found[0][0]:
            break
        if key_of(node) in seen:
            continue
        seen[key_of(node)] = node
        name = name_of(node)
        if family(name) not in (None, NAMED):  # a name says features only of the output itself
            found.append((depth, name))
        elif not found:
            queue.extend((i, depth + 1) for i in inputs_of(node))
    norms = [n for _, n in found if family(n) == NORM]
    return (norms or [n for _, n in found] or [None])[0]


def _eager_output_layer(model: Any, x: Any) -> str | None:
    """Records the torch functions the forward calls (the graph of ops the other formats read) and
    walks back from the primary output. A function's output returned by a leaf module of a known
    family takes the module's name (``LayerNorm``, ``T5LayerNorm``: an RMSNorm made of pow / mean /
    mul). A product after the last layer (a tied LM head ``h @ emb.weight.T``) and a normalization
    inside a composite module (timm's ``BatchNormAct2d``) are both seen, as no list of modules sees."""
    import torch

    from ptopt.core.inputspec import call_model
    from ptopt.core.tensors import primary_output

    rec = _recorder()
    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    handles = [
        m.register_forward_hook(rec.hook) for m in leaves if family(type(m).__name__) not in (None, NAMED)
    ]
    handles += [
        m.register_forward_hook(rec.named_hook(_REMOVED_PREFIX + n)) for m, n in _removed_heads(model)
    ]
    try:
        with torch.no_grad(), rec:  # not inference_mode: a cache built lazily here must stay a plain tensor
            out = call_model(model, x)
    except Exception:  # noqa: BLE001 - the caller's own forward reports its failures; here: unknown
        return None
    finally:
        for h in handles:
            h.remove()
    try:
        start = rec.producer.get(primary_output(out))
    except TypeError:
        return None
    if start is None:  # the output is an input or a parameter: nothing computed it
        return None
    first = next(iter(out), None) if isinstance(out, dict) and "logits" not in out else None
    return named(walk_back([start], lambda n: n.inputs, lambda n: n.label or n.name), first)


def _removed_heads(model: Any) -> list[tuple[Any, str]]:
    """Each ``nn.Identity`` standing where a classifier was, with its name: one named as a head
    (``fc``, ``classifier``, ``head``), or the last child of a Sequential so named (``classifier.6``)."""
    import torch

    return [
        (m, name)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Identity) and _head_slot(model, name, torch.nn.Sequential)
    ]


def _head_slot(model: Any, name: str, sequential: Any) -> bool:
    """Whether the submodule ``name`` stands where a classifier is: named as a head, or the last child
    of a ``sequential`` (a class, or a TorchScript ``original_name``) so named."""
    parent, _, last = name.rpartition(".")
    if not name or last in _HEAD_NAMES:
        return bool(name)
    if not last.isdigit() or parent.rpartition(".")[2] not in _HEAD_NAMES:
        return False
    seq = _submodule(model, parent)
    kind = isinstance(seq, sequential) if isinstance(sequential, type) else seq.original_name == sequential
    return kind and int(last) == len(list(seq.children())) - 1


def _submodule(model: Any, path: str) -> Any:
    """``model.get_submodule(path)``, which a loaded TorchScript module does not support."""
    for part in path.split(".") if path else ():
        model = getattr(model, part)
    return model


def _script_removed_head(module: Any) -> str | None:
    """``"Identity as NAME"`` for a TorchScript module (traced or scripted, not frozen) whose classifier
    was replaced by ``nn.Identity`` and is called: its inlined graph loses the Identity (traced, it
    returns what came before), but the submodule and its parent's call stay."""
    for name, m in module.named_modules():
        if getattr(m, "original_name", None) != "Identity" or not _head_slot(module, name, "Sequential"):
            continue
        parent, _, last = name.rpartition(".")
        with contextlib.suppress(AttributeError, RuntimeError):
            for node in _submodule(module, parent).graph.nodes():
                src = next(iter(node.inputs()), None) if node.kind() == "prim::CallMethod" else None
                if src is not None and src.node().kind() == "prim::GetAttr" and src.node().s("name") == last:
                    return _REMOVED_PREFIX + name
    return None


class _Op:
    __slots__ = ("name", "inputs", "label")

    def __init__(self, name: str, inputs: list[Any]):
        self.name, self.inputs, self.label = name, inputs, None


def _tensors(obj: Any) -> Iterable[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _recorder() -> Any:
    """A torch function mode noting, for every tensor a call returns, the call (an ``_Op``) and the
    ops that made its tensor arguments (``producer``, which holds tensors weakly); ``hook`` (a forward
    hook) names an op by the module that returned its output. Made here: torch is imported lazily."""
    from torch.overrides import TorchFunctionMode
    from torch.utils.weak import WeakIdKeyDictionary

    class Recorder(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.producer = WeakIdKeyDictionary()

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            inputs = [self.producer[t] for t in _tensors((args, kwargs or {})) if t in self.producer]
            op = _Op(str(getattr(func, "__name__", func)), inputs)
            for t in _tensors(out):
                self.producer[t] = op
            return out

        def hook(self, mod: Any, _args: Any, out: Any) -> None:
            self.label(out, type(mod).__name__)

        def named_hook(self, label: str) -> Callable[..., None]:
            return lambda _mod, _args, out: self.label(out, label)

        def label(self, out: Any, label: str) -> None:
            for t in _tensors(out):
                op = self.producer.get(t)
                if op is not None and op.label is None:
                    op.label = label

    return Recorder()


def _script_output_layer(module: Any) -> str | None:
    removed = _script_removed_head(module)
    if removed:
        return removed
    try:
        graph = module.inlined_graph
    except (AttributeError, RuntimeError):
        return None
    outs = list(graph.outputs())
    if not outs:
        return None
    node = outs[0].node()
    while node.kind() in ("prim::TupleConstruct", "prim::ListConstruct", "prim::DictConstruct"):
        ins = list(node.inputs())
        if not ins:
            return None
        node = ins[1 if node.kind() == "prim::DictConstruct" and len(ins) > 1 else 0].node()
    return walk_back([node], lambda n: [v.node() for v in n.inputs()], lambda n: n.kind())


def fx_output_layer(gm: Any) -> str | None:
    """``output_layer`` of an fx graph (an ExportedProgram's ``module()`` or a traced module)."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out is None or not out.args:
        return None
    first = out.args[0]
    while isinstance(first, (tuple, list, dict)) and first:
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    if not hasattr(first, "all_input_nodes"):
        return None

    def name_of(n: Any) -> str:
        if n.op == "call_module":
            return type(gm.get_submodule(n.target)).__name__
        return str(getattr(n.target, "__name__", n.target)) if n.op == "call_function" else ""

    return walk_back([first], lambda n: n.all_input_nodes, name_of)


def onnx_output_layer(path: Any) -> str | None:
    """``output_layer`` of an ONNX file's graph (its first output): the ``op_type`` found."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - a graph that cannot be read here is simply not known
        return None
    if not graph.output:
        return None
    producer = {o: n for n in graph.node for o in n.output}
    start = producer.get(graph.output[0].name)
    if start is None:
        return None
    layer = walk_back([start], lambda n: [producer[i] for i in n.input if i in producer], lambda n: n.op_type)
    return named(layer, graph.output[0].name)


def openvino_output_layer(model: Any) -> str | None:
    """``output_layer`` of an OpenVINO ``Model`` (its first output): the op type found."""
    try:
        start = model.outputs[0].get_node()
    except (AttributeError, IndexError, RuntimeError):
        return None

    def inputs_of(n: Any) -> list[Any]:
        return [i.get_source_output().get_node() for i in n.inputs()]

    layer = walk_back([start], inputs_of, lambda n: n.get_type_name(), key_of=lambda n: n.get_name())
    return named(layer, next(iter(sorted(model.outputs[0].get_names())), None))
