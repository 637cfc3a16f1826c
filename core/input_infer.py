"""What a model takes when nobody said: its declared inputs, integer (token id) inputs, a suggested shape.

- :func:`declared_inputs`: a model's own ``example_inputs()``; :func:`implied_inputs`: for a
  Hugging Face model, its main input sized by its config (images of ``image_size``, a second of
  audio, token ids within the position table and ``vocab_size``), when nothing else is known.
- :func:`embedding_inputs`: which inputs feed an ``nn.Embedding`` unchanged (so they are token ids,
  not floats), found by running the model once at batch 1 with forward pre-hooks on its embeddings.
- :func:`suggest_input_shapes`: when nothing is known, an ``--input-shape`` built from the first
  layer (``Conv2d(3, ...)`` → ``1x3x224x224``; ``Embedding`` → ``input_ids=1x128:int64``), for the
  error message; :func:`input_shape_unknown` is that message.

Torch is imported lazily.
"""

from __future__ import annotations

import inspect
from typing import Any

from ptopt.core.errors import UsageError
from ptopt.core.inputspec import DEFAULT_MAX_BATCH, InputSpec, input_style, specs_from_example

#: sequence length of token inputs when the model says none (capped by its position embeddings)
DEFAULT_SEQ = 128
#: image side of a suggested 2-D input
DEFAULT_IMAGE = 224


def declared_inputs(module: Any) -> tuple[list[InputSpec], str]:
    """Specs the model declares with its own ``example_inputs()`` (data must fit them)."""
    fn = getattr(module, "example_inputs", None)
    if callable(fn):
        x = fn()
        return specs_from_example(x), input_style(x)
    return [], "positional"


def implied_inputs(module: Any) -> tuple[list[InputSpec], str]:
    """Specs a model implies without declaring them (a Hugging Face model's config): used only
    when neither data nor ``--input-shape`` says more, never to refuse data (which may add
    ``attention_mask`` or ``token_type_ids``)."""
    return hf_inputs(module)


def _hf_config_int(config: Any, *names: str) -> int | None:
    for name in names:
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def hf_inputs(module: Any) -> tuple[list[InputSpec], str]:
    """Keyword specs of a Hugging Face ``PreTrainedModel`` from its main input and its config.

    ``pixel_values``: ``1 x num_channels x image_size x image_size`` floats; ``input_values`` (audio):
    one second at 16 kHz; token inputs (``dummy_inputs``): as many positions as the position table
    holds past its padding offset (RoBERTa's start at ``padding_idx + 1``), at most 128 (any length from
    1 to that is taken: a tokenizer's batch is as long as its longest text), ids in
    ``[0, vocab_size)``, token types in ``[0, type_vocab_size)``, and an ``attention_mask`` of the same
    shape when ``forward`` takes one (the dummy holds none; without it a padded batch cannot be served).
    Another main input (``input_features``, ...) gives no specs: the caller asks for them. The batch is
    dynamic in [1, 64].
    """
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return [], "positional"
    main = getattr(module, "main_input_name", "input_ids")
    if main == "pixel_values":
        return [_pixels(config)], "keyword"
    if main == "input_values":
        spec = InputSpec.static(main, (1, AUDIO_SAMPLES), "float32")
        return [spec.with_batch(1, 1, DEFAULT_MAX_BATCH)], "keyword"
    if main != "input_ids":
        return [], "positional"
    return _token_inputs(module, config)


#: audio samples of a guessed ``input_values``: one second at 16 kHz, the rate speech models use
AUDIO_SAMPLES = 16000


def _pixels(config: Any) -> InputSpec:
    """``pixel_values``: ``num_channels x image_size x image_size`` floats, the batch in [1, 64]."""
    side = getattr(config, "image_size", DEFAULT_IMAGE)
    h, w = (side, side) if isinstance(side, int) else tuple(side)[:2]
    spec = InputSpec.static("pixel_values", (1, _hf_config_int(config, "num_channels") or 3, h, w), "float32")
    return spec.with_batch(1, 1, DEFAULT_MAX_BATCH)


def _token_inputs(module: Any, config: Any) -> tuple[list[InputSpec], str]:
    import torch

    try:
        dummy = module.dummy_inputs
    except Exception:  # noqa: BLE001 - a model's own property may fail in many ways; then say nothing
        return [], "positional"
    if not isinstance(dummy, dict) or not all(isinstance(t, torch.Tensor) for t in dummy.values()):
        return [], "positional"
    try:
        takes = set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        takes = set(dummy)
    dummy = {k: v for k, v in dummy.items() if k in takes}  # T5's encoder takes no decoder ids
    # a text-and-image model (CLIP, SigLIP) states its text's sizes in text_config
    text = getattr(config, "text_config", None) or config
    seq = min(DEFAULT_SEQ, max(1, _positions(module, text)))
    ranges = hf_token_sizes(text)
    specs = []
    for name, t in dummy.items():
        dtype = str(t.dtype).replace("torch.", "")
        shape = tuple(t.shape)
        vr = None
        if not t.is_floating_point() and t.dim() == 2:
            top = next((v for k, v in ranges.items() if name.endswith(k) and v), None)
            specs.append(_tokens(name, dtype, seq, (0, top) if top else (int(t.min()), int(t.max()) + 1)))
            continue
        spec = InputSpec.static(name, (1, *shape[1:]), dtype, value_range=vr)
        specs.append(spec.with_batch(1, 1, DEFAULT_MAX_BATCH))
    if "attention_mask" in takes and "attention_mask" not in dummy and "input_ids" in dummy:
        # transformers' dummy holds the ids alone; a model built without a mask input takes no padded batch
        specs.append(_tokens("attention_mask", "int64", seq, (0, 2)))
    vision = getattr(config, "vision_config", None)
    if "pixel_values" in takes and "pixel_values" not in dummy and vision is not None:
        specs.append(_pixels(vision))  # CLIP, SigLIP: texts and images in one call
    return specs, "keyword"


def _tokens(name: str, dtype: str, seq: int, value_range: tuple[int, int]) -> InputSpec:
    """A token input: batch in [1, 64], length in [1, ``seq``] (``seq`` the usual one)."""
    return InputSpec(name, (1, 1), (1, seq), (DEFAULT_MAX_BATCH, seq), dtype, value_range=value_range)


def hf_token_sizes(config: Any) -> dict[str, int | None]:
    """``{input name suffix: how many ids}`` a Hugging Face config states (``vocab_size``,
    ``type_vocab_size``); None where it states none."""
    return {
        "input_ids": _hf_config_int(config, "vocab_size"),
        "token_type_ids": _hf_config_int(config, "type_vocab_size"),
    }


def token_ranges(module: Any, specs: list[InputSpec], style: str) -> list[InputSpec]:
    """``specs`` read from data, with the token inputs' value ranges the model's rather than the data's.

    An integer input an ``nn.Embedding`` receives takes ``[0, num_embeddings)`` (found by
    :func:`embedding_inputs`), else a Hugging Face ``input_ids`` / ``token_type_ids`` ``[0, vocab_size)``
    / ``[0, type_vocab_size)`` of the model's config, an ``attention_mask`` ``[0, 2)``. A range is only
    ever widened: the ids of a data sample are not all the ids a request may send (servers refuse values
    outside the recorded range). Runs the model once at batch 1 when it has integer inputs.
    """
    import dataclasses

    ranged = {s.name for s in specs if s.value_range and not s.is_float and s.dtype != "bool"}
    if not ranged or module is None:
        return list(specs)
    sizes = {k: v for k, v in hf_token_sizes(getattr(module, "config", None)).items() if v}
    probed = embedding_inputs(module, list(specs), style, set())
    out = []
    for s in specs:
        top = probed.get(s.name) or next((v for k, v in sizes.items() if s.name.endswith(k)), None)
        if top is None and s.name.endswith("attention_mask"):
            top = 2
        if s.name in ranged and top:
            lo, hi = s.value_range
            s = dataclasses.replace(s, value_range=(min(int(lo), 0), max(int(hi), top)))
        out.append(s)
    return token_lengths(module, out)


def token_lengths(module: Any, specs: list[InputSpec]) -> list[InputSpec]:
    """``specs`` read from data, with the sequence length a Hugging Face token model takes rather than the
    data's one length: from 1 to the longer of its implied inputs' (``hf_inputs``: up to 128 positions)
    and the data's. A tokenizer pads a batch to its longest text, so requests come at every length; the
    data's length stays the ``opt`` one. Every 2-D input of the data's length (ids, mask, token types)
    changes together; nothing changes when the model implies no token inputs, when the data's ids are
    not 2-D or another input takes that length as its second dimension (embeddings given as inputs)."""
    import dataclasses

    implied = {s.name: s for s in hf_inputs(module)[0]}
    ids = next((s for s in specs if s.name == "input_ids"), None)
    hint = implied.get("input_ids")
    if ids is None or hint is None or len(ids.max_shape) != 2 or ids.min_shape[1] != ids.max_shape[1]:
        return list(specs)
    length = ids.opt_shape[1]
    if any(len(s.max_shape) > 2 and s.max_shape[1] == length for s in specs):  # [N, T, D] embeddings
        return list(specs)
    top = max(hint.max_shape[1], length)
    return [
        dataclasses.replace(s, min_shape=(s.min_shape[0], 1), max_shape=(s.max_shape[0], top))
        if len(s.max_shape) == 2 and s.min_shape[1] == s.max_shape[1] == length
        else s
        for s in specs
    ]


def _positions(module: Any, config: Any) -> int:
    """How many tokens the position table takes: its size, less the offset where positions start
    (RoBERTa-style tables count from ``padding_idx + 1``)."""
    from torch import nn

    size = _hf_config_int(config, "max_position_embeddings", "n_positions") or DEFAULT_SEQ
    for name, m in module.named_modules():
        if isinstance(m, nn.Embedding) and "position" in name and m.padding_idx is not None:
            return min(size, m.num_embeddings) - (m.padding_idx + 1)
    return size


def _embeddings(module: Any) -> list[Any]:
    import torch
    from torch import nn

    if not isinstance(module, nn.Module) or isinstance(module, torch.jit.ScriptModule):
        return []
    return [m for m in module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]


def embedding_inputs(module: Any, specs: list[InputSpec], style: str, unknown: set[str]) -> dict[str, int]:
    """``{input name: num_embeddings}`` for each input an ``nn.Embedding`` receives unchanged.

    The model runs once, at batch 1, on zeros: inputs named in ``unknown`` (dtype not given) as
    float32, the others in their dtype. A pre-hook on every embedding matches its input's storage
    against the probes (so a ``view``/``reshape`` of an input still counts) and hands the embedding
    an integer copy, so the run goes on to later embeddings (``token_type_ids``). Nothing else of the
    model changes; a failure anywhere ends the run and keeps what was seen. Costs nothing for a model
    without embeddings.
    """
    import torch

    embeddings = _embeddings(module)
    if not embeddings or not specs:
        return {}
    probes = []
    for s in specs:
        dtype = torch.float32 if s.name in unknown else getattr(torch, s.dtype)
        probes.append(torch.zeros((1, *s.opt_shape[1:]) if s.rank else (), dtype=dtype))
    owners = {p.untyped_storage().data_ptr(): s.name for p, s in zip(probes, specs, strict=True)}
    found: dict[str, int] = {}

    def hook(m: Any, args: tuple, kwargs: dict) -> Any:
        if not args or not isinstance(args[0], torch.Tensor):
            return None
        name = owners.get(args[0].untyped_storage().data_ptr())
        if name is None:
            return None
        found.setdefault(name, int(m.num_embeddings))
        return (args[0].long(), *args[1:]), kwargs

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in embeddings]
    modes = {m: m.training for m in module.modules()}
    module.eval()  # batch statistics must not move
    try:
        with torch.no_grad():
            if style == "keyword":
                module(**{s.name: p for s, p in zip(specs, probes, strict=True)})
            else:
                module(*probes)
    except Exception:  # noqa: BLE001 - the probe is a best effort; what ran before the failure counts
        pass
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    return found


def forward_parameters(module: Any) -> list[str]:
    """The required parameters of ``module.forward`` (those without a default), in order."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def suggest_input_shapes(module: Any) -> list[str]:
    """``--input-shape`` values built from the model's first layer; empty when none fits.

    ``Conv2d(3, ...)`` → ``1x3x224x224`` (``Conv1d``: ``1xCx128``, ``Conv3d``: ``1xCx16x112x112``);
    ``Linear(F, ...)`` → ``1xF``; ``LSTM``/``GRU`` → ``1x32xF`` (batch-first) or ``32x1xF``;
    ``Embedding`` → ``input_ids=1x128:int64``, named after ``forward``'s first parameter, plus one
    ``NAME=1x128`` for each further required parameter (``attention_mask``: its dtype is inferred);
    128 is capped by a position embedding's size.
    """
    from torch import nn

    if not isinstance(module, nn.Module):
        return []
    for m in module.modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            spatial = {1: (128,), 2: (DEFAULT_IMAGE, DEFAULT_IMAGE), 3: (16, 112, 112)}[len(m.kernel_size)]
            return ["x".join(str(d) for d in (1, m.in_channels, *spatial))]
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
            positions = [
                e.num_embeddings
                for n, e in module.named_modules()
                if isinstance(e, nn.Embedding) and "pos" in n
            ]
            seq = min([DEFAULT_SEQ, *positions])
            names = forward_parameters(module) or ["input_ids"]
            return [f"{names[0]}=1x{seq}:int64", *(f"{n}=1x{seq}" for n in names[1:])]
        if isinstance(m, nn.Linear):
            return [f"1x{m.in_features}"]
        if isinstance(m, (nn.LSTM, nn.GRU, nn.RNN)):
            return [f"1x32x{m.input_size}" if m.batch_first else f"32x1x{m.input_size}"]
    return []


def input_shape_unknown(
    ref: str, module: Any, data_hint: str = "--data", flag: str = "--input-shape"
) -> UsageError:
    """The error for a model whose inputs nobody knows, ending in flags to paste when a shape can be
    guessed (``flag``: the command's shape option, ``--opt-shape`` for export)."""
    shapes = suggest_input_shapes(module)
    if shapes:
        flags = " ".join(f"{flag} {s}" for s in shapes)
        return UsageError(
            f"{ref}: input shape unknown; pass {data_hint}, or the shape its first layer suggests: {flags}"
        )
    return UsageError(
        f"{ref}: input shape unknown; pass {data_hint}, or {flag} (e.g. 1x3x224x224; the first "
        "dimension is the batch, NAME=SHAPE:DTYPE per input for keyword inputs: input_ids=1x128:int64)"
    )
