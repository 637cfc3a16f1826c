"""Sentence files for a Hugging Face model that is no language model (an encoder, a classifier).

``ptopt quantize hf:DIR --mode static --calib-data calib.txt --eval-data heldout.txt``: a text DATA file
(``.txt``, ``.text``, ``.md``) given with such a MODEL is read as **one sample per non-empty line**,
tokenized by the tokenizer saved in the folder (``AutoTokenizer``, local files only), padded to its
longest line (the ``attention_mask`` says which tokens are padding) and cut at the model's position
table. The inputs are the ones the model's implied inputs name (``input_ids``, and ``attention_mask`` where
``forward`` takes one; ``core.input_infer.hf_inputs``), so the data fits the artifacts made without data.
The folder is the MODEL itself (``hf:DIR`` or ``DIR``), or, for an artifact, the parent its sidecar
records (an int8 file quantized from such a folder). A language model reads text as one stream of tokens
instead (``ptopt.core.text``).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from ptopt.core.errors import DataError

#: a tokenizer's ``model_max_length`` at or above this says "no limit" (transformers' 1e30 sentinel)
NO_LIMIT = 1_000_000


def sentence_folder(model: Any) -> Path | None:
    """The folder whose tokenizer reads sentence files for ``model`` (a MODEL reference, or a loaded
    model: ``core.modelref.LoadedModel``): a Hugging Face folder holding no causal language model, named
    directly or as an ancestor the sidecars record (an int8 file quantized from such a folder, the ONNX
    exported from that file); None when there is none."""
    info = getattr(model, "info", None)
    if isinstance(info, dict) and info.get("hf_model"):
        return Path(info["hf_model"])
    artifact = getattr(model, "artifact", None)
    if artifact is not None:
        return _folder_of((artifact.parent or {}).get("path"), sidecar=True)
    ref = getattr(model, "ref", model)
    return _folder_of(ref, sidecar=True) if isinstance(ref, (str, os.PathLike)) else None


#: the most sidecar parents followed from an artifact to the folder it was made from
MAX_HOPS = 8


def _folder_of(ref: Any, sidecar: bool = False) -> Path | None:
    from ptopt.core.artifact import Artifact
    from ptopt.core.hf import is_hf_dir, is_lm_folder

    seen: set[Path] = set()
    while isinstance(ref, (str, os.PathLike)) and len(seen) < MAX_HOPS:
        text = str(ref)
        path = Path(text[3:] if text.startswith("hf:") else text)
        if is_hf_dir(path):
            return None if is_lm_folder(path) else path
        if not sidecar or not path.is_file() or path.resolve() in seen:
            return None
        seen.add(path.resolve())
        art = Artifact.maybe_load(path)
        ref = (art.parent or {}).get("path") if art is not None else None
    return None


def read_sentences(ref: str | os.PathLike, folder: Path, module: Any = None) -> tuple[dict[str, Any], str]:
    """``ref``'s non-empty lines as the model's token inputs (module docstring), and the data's name;
    ``module`` (the loaded model, when at hand) names the inputs, else the class config.json names does."""
    import torch

    from ptopt.core.hf import config_of, load_tokenizer
    from ptopt.core.quiet import silenced
    from ptopt.core.text import read_text

    lines = [line.strip() for line in read_text(ref).splitlines() if line.strip()]
    if not lines:
        raise DataError(f"text data {ref}: no line holds text (one sentence per line is one sample)")
    config = config_of(folder)
    names = _input_names(folder, config, module)
    tokenizer = load_tokenizer(folder)
    limit = _max_tokens(config, tokenizer)
    with silenced(["transformers"]):
        lengths = [len(ids) for ids in tokenizer(lines)["input_ids"]]
        enc = tokenizer(lines, padding="longest", truncation=True, max_length=limit, return_tensors="pt")
    x = {"input_ids": enc["input_ids"].to(torch.int64)}
    if "attention_mask" in names:
        mask = enc.get("attention_mask")
        x["attention_mask"] = torch.ones_like(x["input_ids"]) if mask is None else mask.to(torch.int64)
    cut = sum(n > limit for n in lengths)
    note = f", {cut} cut to {limit}" if cut else ""
    name = f"{Path(str(ref)).name} ({len(lines)} lines, {folder.name}'s tokenizer, {x['input_ids'].shape[1]} tokens{note})"
    return x, name


def _input_names(folder: Path, config: Any, module: Any) -> list[str]:
    """``input_ids``, and ``attention_mask`` when the model's ``forward`` takes one; a DataError for a
    model whose main input is no token ids (images, audio)."""
    target = module
    if target is None:
        from ptopt.core.hf import import_transformers
        from ptopt.core.quiet import quiet_imports

        arch = (getattr(config, "architectures", None) or [None])[0]
        with quiet_imports():  # the class's module imports torchao as transformers loads it lazily
            target = getattr(import_transformers(), arch, None) if arch else None
    main = getattr(target, "main_input_name", "input_ids")
    if main != "input_ids":
        raise DataError(
            f"text data: the model in {folder} takes {main}, not token ids: give its inputs as tensors "
            "(a .pt or .npz)"
        )
    try:
        takes = set(inspect.signature(target.forward).parameters) if target is not None else set()
    except (TypeError, ValueError):
        takes = set()
    return ["input_ids"] + (["attention_mask"] if "attention_mask" in takes or not takes else [])


def _max_tokens(config: Any, tokenizer: Any) -> int:
    """The longest sample: the tokenizer's ``model_max_length`` (RoBERTa's counts its position offset),
    else the config's position table, else 512."""
    limits = [getattr(tokenizer, "model_max_length", None), getattr(config, "max_position_embeddings", None)]
    known = [int(v) for v in limits if isinstance(v, int) and 0 < v < NO_LIMIT]
    return min(known) if known else 512
