"""What weight-only quantization does to a model (row ``("weight-only", "torchao")``, registered
in ``techniques/weight_only.py``; the flow around it is ``lm_flow.py``).

Which layers: every ``nn.Linear`` (transformers' ``Conv1D``, GPT-2's projections, swapped for the
``nn.Linear`` it is first), except ``--exclude``d ones and, for int4, layers whose outputs the int4
kernel cannot pack. Norms stay float.

A tied output layer (``tie_word_embeddings``: its matrix is the token embedding's, 28.3M of
SmolLM2-135M's 134.5M parameters): int8 quantizes that matrix once and both read it, the output layer
as an int8 Linear like the others, the embedding by gathering the int8 rows of its ids times their
scales (``ptopt.core.lm.use_int8_embedding``), so the folder stores it once, in int8. The record says
so (``tied_embedding``: ``{embedding: output layer}``). The matrix stays float, stored once, for int4
(the int4 kernel's packed layout has no cheap row lookup) and when ``--exclude`` names the output layer
or the embedding. With AWQ the tied matrix is rounded to nearest: AWQ's input scales would change the
rows the embedding reads (and torchao's own embedding, which from_pretrained runs, ignores them).

How (``config.method``): rtn, hqq and awq through torchao (``engine_torchao``), gptq (int4) through
ptopt's own ``gptq.py`` (torchao's GPTQ runs on CUDA only). int4 turns the model to bf16 first: that
is what the int4 CPU kernel multiplies. int8 layers run torch's ``_weight_int8pack_mm`` in eager mode
(``ptopt.core.lm.use_int8_kernel``: torchao's eager int8 path converts the matrix to float on every
call).
"""

from __future__ import annotations

from typing import Any

from ptopt.compress.quantize.config import WeightOnlyConfig
from ptopt.core.errors import UsageError

#: the int4 CPU kernel (``_convert_weight_to_int4pack_for_cpu``) packs output channels in this many
INT4_ROWS = 16


def plan(model: Any, config: WeightOnlyConfig) -> tuple[list[str], dict[str, str]]:
    """``(quantized, {float layer: why})``: the Linear layers to quantize and those kept float.
    UsageError when there is nothing to quantize or a group does not divide a layer's inputs."""
    import torch

    tied = _tied_output(model)
    shared = shared_embedding(model, config)
    read = _read_directly(model) or set()
    chosen: list[str] = []
    floats: dict[str, str] = {}
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear):
            continue
        if _excluded(name, config):
            floats[name] = "excluded (--exclude)"
        elif name in read:
            floats[name] = READ_DIRECTLY
        elif name == tied and shared is None:
            floats[name] = _why_float_tie(model, config)
        elif config.bits == 4 and m.out_features % INT4_ROWS:
            floats[name] = f"{m.out_features} outputs: the int4 CPU kernel packs them in 16s"
        else:
            chosen.append(name)
    if not chosen:
        why = f" ({len(floats)} kept float: {', '.join(list(floats)[:3])})" if floats else ""
        raise UsageError(
            f"weight-only quantization needs Linear layers; {type(model).__name__} has none to quantize{why}"
        )
    group = config.groups
    if group is not None:
        bad = [n for n in chosen if model.get_submodule(n).in_features % group]
        if bad:
            width = model.get_submodule(bad[0]).in_features
            raise UsageError(
                f"{config.group_flag} does not divide the {width} inputs of {bad[0]}"
                f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}: choose a divisor of {width}, "
                "or --exclude the layer"
            )
    return chosen, floats


#: why a Linear whose weight the model's forward reads outside the layer stays float
READ_DIRECTLY = (
    "the model reads its weight directly, outside the layer (as Mamba does: dt_proj.weight @ x), which a "
    "quantized weight cannot do"
)


def _read_directly(model: Any) -> set[str] | None:
    """The Linear layers whose weight a causal LM's forward on a few tokens uses in an op outside the
    layer's own forward (watched by a ``TorchFunctionMode``; a shape or dtype read is not a use), or None
    when the model is not one or that forward fails. A Linear the forward never touches (a multimodal
    model's vision tower, on text) is not among them: quantized, it still runs where it is called.
    ``dt_proj.weight.shape`` reads no values; ``.T`` does."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 4:
        return None
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    by_weight = {id(m.weight): n for n, m in linears.items()}
    # every module holding a Linear's weight as its own (a tied embedding too): a use inside one is no read
    owners = {id(m): m for m in model.modules() for p in m.parameters(recurse=False) if id(p) in by_weight}
    held = {id(p): {id(m) for m in owners.values() if any(q is p for q in m.parameters(recurse=False))}
            for m in linears.values() for p in [m.weight]}  # fmt: skip
    inside: list[int] = []
    read: set[str] = set()

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not _metadata(func):
                for t in tree_leaves((args, kwargs or {})):
                    if id(t) in by_weight and not held[id(t)].intersection(inside):
                        read.add(by_weight[id(t)])
            return func(*args, **(kwargs or {}))

    def leave(*_: Any) -> None:  # a forward hook that returns a value replaces the layer's output
        inside.pop()

    handles = [m.register_forward_pre_hook(lambda *_, i=i: inside.append(i)) for i, m in owners.items()]
    handles += [m.register_forward_hook(leave) for m in owners.values()]
    try:
        with (
            torch.no_grad(),
            Watch(),
        ):  # not inference_mode: a cache built lazily here must stay a plain tensor
            model(input_ids=torch.arange(1, 5).reshape(1, 4) % vocab)
    except Exception:  # noqa: BLE001 - not a plain causal LM call: no layer is judged by it
        return None
    finally:
        for h in handles:
            h.remove()
    return read


#: tensor attributes that read no values (``.T`` and ``.data`` do)
_METADATA = {"shape", "dtype", "device", "ndim", "layout", "requires_grad", "is_leaf", "grad", "grad_fn",
             "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "itemsize", "nbytes", "names"}  # fmt: skip


def _metadata(func: Any) -> bool:
    """A property read of a tensor's metadata (``w.shape``): not a use of its values."""
    return (
        getattr(func, "__name__", "") == "__get__"
        and getattr(getattr(func, "__self__", None), "__name__", "") in _METADATA
    )


def _excluded(name: str, config: WeightOnlyConfig) -> bool:
    return any(name == e or name.startswith(e + ".") for e in config.float_modules)


def _why_float_tie(model: Any, config: WeightOnlyConfig) -> str:
    import torch

    emb = model.get_input_embeddings()
    if config.bits == 4:
        why = "int4 keeps it float"
    elif type(emb) is not torch.nn.Embedding:
        why = f"the embedding is a {type(emb).__name__}, whose forward is its own"
    elif emb.max_norm is not None:
        why = "the embedding rescales the rows it reads (max_norm)"
    else:
        why = "the embedding is excluded (--exclude)"
    return f"shares its matrix with the token embedding (tied; {why}): stays float, stored once"


def shared_embedding(model: Any, config: WeightOnlyConfig) -> tuple[str, str] | None:
    """``(embedding, output layer)`` when the output layer is tied to the token embedding and int8
    quantizes their one matrix for both (module docstring); None otherwise. The embedding must be a
    plain ``nn.Embedding``: a subclass (Gemma's scaled one) computes more than a row lookup."""
    import torch

    tied = _tied_output(model)
    if tied is None or config.bits != 8 or _excluded(tied, config):
        return None
    emb = model.get_input_embeddings()
    if type(emb) is not torch.nn.Embedding or emb.max_norm is not None:
        return None
    name = next((n for n, m in model.named_modules() if m is emb), None)
    return None if name is None or _excluded(name, config) else (name, tied)


def _tied_output(model: Any) -> str | None:
    """The name of the output layer whose weight is the input embedding's, or None."""
    get_out, get_in = (
        getattr(model, "get_output_embeddings", None),
        getattr(model, "get_input_embeddings", None),
    )
    if get_out is None or get_in is None:
        return None
    out, emb = get_out(), get_in()
    if out is None or emb is None or out.weight is not emb.weight:
        return None
    return next((n for n, m in model.named_modules() if m is out), None)


def quantize_module(model: Any, config: WeightOnlyConfig, calibrate: Any) -> dict[str, Any]:
    """Quantize ``model`` in place (see the module doc); returns the record of what was done.
    ``calibrate(model)``: runs the calibration text through the model (awq, gptq)."""
    import torch

    from ptopt.compress.quantize import engine_torchao as engine
    from ptopt.compress.quantize.layers import linearize_conv1d

    swapped = linearize_conv1d(model, config.float_modules)
    chosen, floats = plan(model, config)
    total = sum(p.numel() for p in model.parameters())
    shared = shared_embedding(model, config)
    if config.bits == 4:
        model.to(torch.bfloat16)
    bits, group, method = config.bits, config.groups, config.method
    # AWQ's input scales would change the rows the embedding reads: the tied matrix is rounded to nearest
    awq_skips = {shared[1]} if shared and method == "awq" else set()
    wanted = set(chosen) - awq_skips
    selected = lambda m, name: name in wanted  # noqa: E731
    if method in ("rtn", "hqq"):
        engine.quantize_rtn(model, bits, group, method, selected)
    elif method == "awq":
        engine.quantize_awq(model, bits, group, selected, calibrate)
        if awq_skips:
            engine.quantize_rtn(model, bits, group, "rtn", lambda m, name: name in awq_skips)
    else:
        from ptopt.compress.quantize.gptq import gptq_int4

        gptq_int4(model, chosen, group, calibrate)
    missed = [n for n in chosen if not engine.is_quantized(model.get_submodule(n).weight)]
    if missed:
        raise RuntimeError(f"torchao left {len(missed)} selected layer(s) float: {', '.join(missed[:3])}")
    tied = _share_int8(model, shared) if shared else {}
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    from ptopt.core.lm import use_int8_kernel

    kernel = "_weight_int8pack_mm (bf16 activations)" if bits == 8 and use_int8_kernel(model) else None
    return {"bits": bits, "group_size": group, "method": method, "quantized_layers": chosen,
            "float_layers": floats, "float_tensors": float_tensors(model), "tied_embedding": tied,
            "dtype": dtype, "linear_from_conv1d": swapped, "int8_kernel": kernel, "parameters": total}  # fmt: skip


#: why a fused expert tensor stays float
FUSED_EXPERTS = (
    "fused expert weights (one 3-D Parameter holding every expert's matrix, not nn.Linear layers): "
    "torchao's weight-only quantization takes nn.Linear layers only, so they stay float (--engine openvino "
    "compresses them: its graph holds one matrix per expert)"
)


def float_tensors(model: Any) -> dict[str, dict[str, Any]]:
    """``{parameter: {"params": n, "why": ...}}``: the weight matrices (2-D and up) left float outside
    any Linear layer: a mixture of experts' fused ``gate_up_proj`` / ``down_proj`` (transformers 5 keeps
    each layer's experts in one 3-D Parameter), a router's weight, an untied token embedding. A Linear's
    weight (quantized, or in ``float_layers`` with its reason) and the embedding that shares it are not
    listed. Called after quantization: a quantized weight is a torchao tensor, not a float one."""
    import torch

    from ptopt.core.lm import expert_tensors

    experts = expert_tensors(model)  # one reading of what a fused expert tensor is (not a ViT's class token)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    out: dict[str, dict[str, Any]] = {}
    for owner_name, owner in model.named_modules():
        for pname, p in owner.named_parameters(recurse=False):
            if p.dim() < 2 or id(p) in linear_weights or not p.dtype.is_floating_point:
                continue
            if isinstance(owner, torch.nn.Linear) or not type(p).__name__ == "Parameter":
                continue  # a Linear's own weight, or a torchao tensor (quantized)
            name = f"{owner_name}.{pname}" if owner_name else pname
            if isinstance(owner, torch.nn.Embedding):
                why = (
                    "token embedding (not tied to a Linear): weight-only quantization takes nn.Linear layers"
                )
            elif name in experts:
                why = FUSED_EXPERTS
            else:
                why = f"a {p.dim()}-D Parameter of a {type(owner).__name__}, not an nn.Linear layer"
            out[name] = {"params": p.numel(), "why": why}
    return out


def _share_int8(model: Any, shared: tuple[str, str]) -> dict[str, str]:
    """Give the embedding the output layer's int8 weight (the same Parameter: one matrix in memory and
    in the file) and route it to the row lookup; ``{embedding: output layer}``."""
    from ptopt.core.lm import use_int8_embedding

    emb, out = (model.get_submodule(n) for n in shared)
    emb.weight = out.weight
    if shared[0] not in use_int8_embedding(model):
        raise RuntimeError(f"{shared[0]}: the int8 row lookup did not take the shared weight")
    return {shared[0]: shared[1]}
