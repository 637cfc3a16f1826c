"""Hugging Face model directories: what ``hf:DIR`` and a folder holding ``config.json`` load as.

A causal language model is read with ``AutoModelForCausalLM.from_pretrained(DIR,
local_files_only=True)`` (never a hub download, never ``trust_remote_code``): safetensors weights are
read without unpickling; ``pytorch_model.bin`` (a pickle) needs ``--allow-pickle``. Its tokenizer,
when the folder has one, is ``AutoTokenizer.from_pretrained(DIR)``.

transformers imports torchvision whenever it is installed; PyPI's torchvision beside the CPU torch
cannot load its C++ ops and dies on import (``operator torchvision::nms does not exist``), taking
``import transformers`` with it. :func:`import_transformers` defines the two op names first (the
language models use neither), as REFERENCE.md describes, and drops transformers' import notices.
:func:`ensure_torchvision_ops` does the same before a user's factory module is imported and before a
pickled module is loaded: a torchvision model, as ``torch.save(model)`` writes it, imports torchvision.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from pathlib import Path
from typing import Any

from ptopt.core.errors import MissingDependencyError, ModelLoadError, UsageError

#: files a Hugging Face tokenizer is read from (any one is enough)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model")
#: weight files ``from_pretrained`` reads; the last one is a pickle
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_LIBS: list[Any] = []  # a torch.library.Library deregisters its ops when garbage-collected


def is_hf_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder with a Hugging Face ``config.json``."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def has_tokenizer(path: str | os.PathLike) -> bool:
    return any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def ensure_torchvision_ops() -> None:
    """``import torchvision`` works beside the CPU torch (module docstring): its own C++ ops when
    they load, else the two op names its import registers fake kernels for."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None or hasattr(torch.ops.torchvision, "nms"):
        return
    for so in glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so")):
        try:
            torch.ops.load_library(so)
            return
        except OSError:
            break
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBS.append(lib)


def import_transformers() -> Any:
    """``transformers``, imported quietly (module docstring); one line naming the extra otherwise."""
    from ptopt.core.quiet import quiet_imports

    if importlib.util.find_spec("transformers") is None:
        raise MissingDependencyError(
            "language models need transformers: pip install 'ptopt[llm]' (or pip install transformers)"
        )
    ensure_torchvision_ops()
    with quiet_imports():
        import transformers

        transformers.utils.logging.disable_progress_bar()  # ptopt reports loading itself
    return transformers


def config_of(path: str | os.PathLike) -> Any:
    """The folder's ``config.json`` as a transformers config (ModelLoadError when it is not one)."""
    tf = import_transformers()
    try:
        return tf.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"{path}: config.json is not a Hugging Face model config ({e})") from None


def _check_weight_files(path: Path, allow_pickle: bool) -> None:
    if not is_hf_dir(path):
        raise ModelLoadError(f"{path}: not a Hugging Face model folder (no config.json)")
    present = [f for f in WEIGHT_FILES if (path / f).is_file()]
    if not present:
        raise ModelLoadError(f"{path}: no weights ({' or '.join(WEIGHT_FILES[::2])}) beside config.json")
    if present == ["pytorch_model.bin"] and not allow_pickle:
        raise UsageError(
            f"{path}/pytorch_model.bin is a pickle, which can run code when loaded: pass --allow-pickle "
            "if you trust it (or convert it to model.safetensors)"
        )


def load_causal_lm(path: str | os.PathLike, allow_pickle: bool = False) -> Any:
    """The causal language model of a Hugging Face folder, fp32, in eval mode (module docstring)."""
    path = Path(path)
    _check_weight_files(path, allow_pickle)
    tf = import_transformers()
    config = config_of(path)
    _refuse_unknown_head(tf, path, config)
    from ptopt.core.quiet import quiet_imports

    with quiet_imports():
        try:
            model, info = tf.AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, dtype="float32", output_loading_info=True
            )
        except (OSError, ValueError, RuntimeError) as e:
            raise ModelLoadError(f"{path}: transformers cannot load it: {type(e).__name__}: {e}") from None
    _refuse_random_weights(path, config, type(model).__name__, sorted(info.get("missing_keys") or ()))
    _refuse_non_causal(path, config, type(model).__name__)
    return model.eval()


def _refuse_unknown_head(tf: Any, path: Path, config: Any) -> None:
    if not _is_causal_lm(tf, config):
        raise ModelLoadError(
            f"{path}: a {type(config).__name__} ({config.model_type}) has no causal language model head "
            "(AutoModelForCausalLM does not know it). hf:DIR loads causal language models; load any other model "
            "with a factory (pkg.module:factory, see ptopt --help)"
        )


def check_causal_config(path: str | os.PathLike) -> None:
    """The refusals of :func:`load_causal_lm` that config.json alone decides (no weights read): a model
    transformers has no causal head for, or one that names no causal architecture and is no decoder.
    For a stage that must refuse a folder before measuring anything else (``ptopt validate``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    tf = import_transformers()
    config = config_of(Path(path))
    _refuse_unknown_head(tf, Path(path), config)
    _refuse_non_causal(Path(path), config, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])


def _refuse_random_weights(path: Path, config: Any, built: str, missing: list[str]) -> None:
    """A folder whose weights lack tensors of the causal LM ``from_pretrained`` built (a ``BertModel`` or a
    classifier's folder read as ``BertLMHeadModel``: its head would be new random weights) is refused:
    every figure measured on it would be of a model nobody trained."""
    if not missing:
        return
    saved = ", ".join(getattr(config, "architectures", None) or []) or "no architectures entry"
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    raise ModelLoadError(
        f"{path}: not a causal language model's folder: its weights lack {len(missing)} tensor(s) of the "
        f"{built} that AutoModelForCausalLM builds from it ({shown}), which would be random. Its config.json "
        f"names {saved}. hf:DIR loads causal language models; load any other model with a factory "
        "(pkg.module:factory, see ptopt --help)"
    )


#: how the name of a causal language model's class ends (transformers' naming)
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel", "WithLMHead")


def _refuse_non_causal(path: Path, config: Any, built: str) -> None:
    """A folder whose config.json names a model that is no decoder (``is_decoder`` false) and whose
    ``architectures`` holds no causal LM (nor the family's base model, whose causal head is its tied
    embeddings: GPT-2's) is refused, though every weight was found: a ``BertForMaskedLM`` folder loads as
    ``BertLMHeadModel``, an encoder that never learned to predict the next token."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    names = [str(a) for a in getattr(config, "architectures", None) or []]
    fits = {
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type),
        MODEL_MAPPING_NAMES.get(config.model_type),
    }
    if (
        getattr(config, "is_decoder", False)
        or not names
        or any(n.endswith(CAUSAL_SUFFIXES) or n in fits for n in names)
    ):
        return
    if getattr(config, "is_encoder_decoder", False):
        kind = (
            "an encoder-decoder (sequence-to-sequence) model, trained to write an output from a whole input"
        )
    elif any(n.endswith("ForMaskedLM") for n in names):
        kind = "an encoder (a masked language model, trained to fill in masked tokens seeing both sides)"
    else:
        kind = "a task model (a classification or other head), not a causal language model"
    raise ModelLoadError(
        f"{path}: not a causal language model's folder: its config.json names {', '.join(names)}, {kind}, with "
        f"is_decoder false. AutoModelForCausalLM would read it as {built}, predicting next tokens it never "
        "learned to predict. hf:DIR loads causal language models (*ForCausalLM, *LMHeadModel); load an encoder "
        "or any other model with a factory (pkg.module:factory, see ptopt --help)"
    )


def _is_causal_lm(tf: Any, config: Any) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def names_lm_folder(ref: str | os.PathLike) -> bool:
    """Whether a MODEL reference names a causal language model's folder, without loading it: ``hf:DIR``
    or a folder with config.json that :func:`is_lm_folder` reads as one (``hf:`` of no folder: True,
    so that the language-model loader says what is missing)."""
    text = str(ref)
    if text.startswith("hf:"):
        return is_lm_folder(text[3:]) if is_hf_dir(text[3:]) else True
    return is_hf_dir(text) and is_lm_folder(text)


def is_lm_folder(path: str | os.PathLike) -> bool:
    """Whether ``hf:DIR`` (or the folder itself) is read as a causal language model, from config.json
    alone: a decoder (``is_decoder``), an ``architectures`` entry transformers maps to a causal LM, or a
    decoder-only family's base model (GPT-2's, whose causal head is its tied embeddings). An encoder, a
    classifier, a sequence-to-sequence or vision model is not: :func:`load_hf_module` loads it (a folder
    ptopt wrote of one too: ``prune -o DIR``). A weight-only folder (``quantization.json``), a folder with
    no readable config and a model type transformers does not know stay with the language-model loader,
    which says what is wrong."""
    p = Path(path)
    if not is_hf_dir(p) or (p / "quantization.json").is_file():
        return True
    return config_names_causal_lm(p)


def config_names_causal_lm(path: str | os.PathLike) -> bool:
    """:func:`names_causal_lm` of the folder's config.json; True when it cannot be read (the language-model
    loader says what is wrong)."""
    import json

    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    return not isinstance(config, dict) or names_causal_lm(config)


def names_causal_lm(config: dict[str, Any]) -> bool:
    """:func:`is_lm_folder`'s rule on a config.json's contents."""
    import_transformers()  # quietly first: its import pulls torchao's notices in
    from transformers.models.auto import modeling_auto as auto

    kind, names = config.get("model_type"), [str(a) for a in config.get("architectures") or []]
    base = auto.MODEL_MAPPING_NAMES.get(kind)
    if config.get("is_decoder") or (base is None and kind not in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        return True  # a decoder, or a type transformers does not know: the LM loader's message
    if any(
        n in set(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) or n.endswith(CAUSAL_SUFFIXES)
        for n in names
    ):
        return True
    decoder_only = (
        kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and kind not in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and not config.get("is_encoder_decoder")
    )
    bases = set(base) if isinstance(base, tuple) else {base}
    return decoder_only and (not names or any(n in bases for n in names))


def load_hf_module(path: str | os.PathLike, allow_pickle: bool = False) -> Any:
    """A Hugging Face folder that holds no causal language model (:func:`is_lm_folder`): the class its
    config.json's ``architectures`` names (``BertForSequenceClassification``, ``ViTModel``, ...), else
    ``AutoModel``; fp32, in eval mode, local files only, never ``trust_remote_code``. A weight the class
    has and the folder lacks (it would be random) is refused, naming the tensors."""
    path = Path(path)
    _check_weight_files(path, allow_pickle)
    tf = import_transformers()
    config = config_of(path)
    names = [str(a) for a in getattr(config, "architectures", None) or []]
    from ptopt.core.quiet import quiet_imports

    with quiet_imports():  # the class's module is imported here (it pulls torchao's notices in)
        cls = getattr(tf, names[0], None) if names else tf.AutoModel
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise ModelLoadError(
            f"{path}: config.json names {names[0]}, which transformers {tf.__version__} does not have "
            "(ptopt never runs a folder's own code: load it with a factory, pkg.module:factory)"
        )
    with quiet_imports():
        try:
            model, info = cls.from_pretrained(
                str(path), local_files_only=True, dtype="float32", output_loading_info=True
            )
        except (OSError, ValueError, RuntimeError, TypeError) as e:
            raise ModelLoadError(f"{path}: transformers cannot load it: {type(e).__name__}: {e}") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelLoadError(
            f"{path}: its weights lack {len(missing)} tensor(s) of the {cls.__name__} its config.json names "
            f"({shown}), which would be random: save the folder again with save_pretrained"
        )
    return model.eval()


def load_tokenizer(path: str | os.PathLike | None) -> Any:
    """The tokenizer saved in the model's folder; UsageError (exit 2) naming what is missing."""
    if path is None or not has_tokenizer(path):
        where = f"{path}" if path is not None else "this model (not a Hugging Face folder)"
        raise UsageError(
            f"text data needs the model's tokenizer, and {where} has none ({', '.join(TOKENIZER_FILES[:2])} "
            "...): give token ids instead (a .pt or .npy of int64), or save the tokenizer beside config.json"
        )
    tf = import_transformers()
    from ptopt.core.quiet import quiet_imports

    with quiet_imports():
        try:
            return tf.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as e:
            raise UsageError(f"{path}: the tokenizer cannot be read: {e}") from None


def is_causal_lm(module: Any) -> bool:
    """Whether ``module`` is a transformers causal language model (has ``generate`` and a config)."""
    config = getattr(module, "config", None)
    return config is not None and hasattr(module, "generate") and hasattr(module, "get_output_embeddings")


def logits_view(model: Any) -> Any:
    """``model`` (a transformers causal LM) as a module whose ``forward(input_ids, attention_mask=None)``
    returns the logits alone, computed without a KV cache: what graph capture, TorchScript and the
    stages built on them take (the cache transformers returns is no tensor). A shallow copy: the same
    submodules and weights under the same names (``--exclude model.layers.0.mlp`` names what the user
    sees), ``model`` itself untouched."""
    import copy
    import types

    view = copy.copy(model)
    view.forward = types.MethodType(_logits_forward, view)
    return view


def _logits_forward(self: Any, input_ids: Any, attention_mask: Any = None) -> Any:
    return (
        type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    )
