"""Sentence files for a Hugging Face model that is no language model (an encoder, a classifier).

``ptopt quantize hf:DIR --mode static --calib-data calib.txt --eval-data heldout.txt``: a text DATA file
(``.txt``, ``.tsv``, ``.text``, ``.md``) given with such a MODEL is read as **one sample per non-empty
line**, tokenized by the tokenizer saved in the folder (``AutoTokenizer``, local files only), padded to its
longest line (the ``attention_mask`` says which tokens are padding) and cut at the model's position
table. The inputs are the ones the model's implied inputs name (``input_ids``, and ``attention_mask`` where
``forward`` takes one; ``core.input_infer.hf_inputs``), so the data fits the artifacts made without data.

A ``.tsv`` with tabs, or a text file whose every line holds a tab, is **pairs** (``query<TAB>passage``: a
cross-encoder's, an NLI model's), one per line: tokenized as pairs, with the ``token_type_ids`` that tell
the two texts apart where the model's ``forward`` takes them (BERT's), so an export with such data takes
them too. An artifact's own inputs decide for it; pairs for an artifact that takes no token types, where
the tokenizer sets them, are refused (it would read each pair as one text).

The folder is the MODEL itself (``hf:DIR`` or ``DIR``), or, for an artifact, the folder its sidecars'
parents lead to (an int8 file quantized from such a folder, the ONNX exported from that file). A language
model reads text as one stream of tokens instead (``ptopt.core.text``).
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
    """The folder ``ref`` is, or (``sidecar``) the one its sidecars' parents lead to. A parent recorded as
    a relative path (as it was typed) is read from the working directory, else from the folder of the
    artifact that records it."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.hf import is_hf_dir, is_lm_folder

    seen: set[Path] = set()
    base: Path | None = None
    while isinstance(ref, (str, os.PathLike)) and len(seen) < MAX_HOPS:
        text = str(ref)
        path = Path(text[3:] if text.startswith("hf:") else text)
        if base is not None and not path.is_absolute() and not path.exists() and (base / path).exists():
            path = base / path
        if is_hf_dir(path):
            return None if is_lm_folder(path) else path
        if not sidecar or not path.is_file() or path.resolve() in seen:
            return None
        seen.add(path.resolve())
        art = Artifact.maybe_load(path)
        ref, base = ((art.parent or {}).get("path") if art is not None else None), path.parent
    return None


def read_sentences(
    ref: str | os.PathLike, folder: Path, module: Any = None, takes: list[str] | None = None
) -> tuple[dict[str, Any], str]:
    """``ref``'s non-empty lines as the model's token inputs (module docstring), and the data's name;
    ``takes`` (an artifact's input names) or ``module`` (the loaded model, when at hand) names the inputs,
    else the class config.json names does."""
    import torch

    from ptopt.core.hf import config_of, load_tokenizer
    from ptopt.core.quiet import silenced

    first, second = _texts(ref)
    config = config_of(folder)
    names = _input_names(folder, config, module, takes, pairs=second is not None)
    tokenizer = load_tokenizer(folder)
    limit = _max_tokens(config, tokenizer)
    with silenced(["transformers"]):
        lengths = [len(ids) for ids in tokenizer(first, second)["input_ids"]]
        enc = tokenizer(
            first, second, padding="longest", truncation=True, max_length=limit, return_tensors="pt"
        )
    x = {"input_ids": enc["input_ids"].to(torch.int64)}
    for name in names[1:]:  # attention_mask, token_type_ids: what the tokenizer made, else the neutral value
        made = enc.get(name)
        fill = torch.ones_like if name == "attention_mask" else torch.zeros_like
        x[name] = fill(x["input_ids"]) if made is None else made.to(torch.int64)
    types = enc.get("token_type_ids")
    if second is not None and "token_type_ids" not in names and types is not None and bool(types.any()):
        raise DataError(
            f"text data {ref}: pairs, and this model takes no token_type_ids, which {folder.name}'s tokenizer "
            "sets to tell a pair's two texts apart (it would read each pair as one text): export it from the "
            "folder with these pairs as --data, or give one text per line"
        )
    cut = sum(n > limit for n in lengths)
    note = f", {cut} cut to {limit}" if cut else ""
    what = f"{len(first)} pairs" if second is not None else f"{len(first)} lines"
    name = (
        f"{Path(str(ref)).name} ({what}, {folder.name}'s tokenizer, {x['input_ids'].shape[1]} tokens{note})"
    )
    return x, name


def _texts(ref: str | os.PathLike) -> tuple[list[str], list[str] | None]:
    """The file's samples: one text per non-empty line, or one pair per line (``first<TAB>second``: a
    query and a passage, a premise and a hypothesis) in a ``.tsv`` with tabs, or a text file whose every
    line holds one."""
    from ptopt.core.text import read_text

    lines = [line.strip() for line in read_text(ref).splitlines() if line.strip()]
    if not lines:
        raise DataError(f"text data {ref}: no line holds text (one sentence per line is one sample)")
    tabbed = ["\t" in line for line in lines]
    tsv = Path(str(ref)).suffix.lower() == ".tsv"
    if not any(tabbed) or (not tsv and not all(tabbed)):  # a stray tab in a text file is the text's
        return lines, None
    pairs = [line.split("\t") for line in lines]
    bad = next((i for i, p in enumerate(pairs) if len(p) != 2 or not all(t.strip() for t in p)), None)
    if bad is not None:
        raise DataError(
            f"text data {ref}: line {bad + 1} of {len(lines)} holds {len(pairs[bad])} text(s); a file with "
            "tabs holds one pair per line (first<TAB>second)"
        )
    return [a.strip() for a, _ in pairs], [b.strip() for _, b in pairs]


#: the token inputs a tokenizer makes, in the order a sentence file fills them
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _input_names(folder: Path, config: Any, module: Any, takes: list[str] | None, pairs: bool) -> list[str]:
    """``input_ids``, then ``attention_mask`` when the model takes one, and ``token_type_ids`` when it
    takes them: an artifact's inputs (``takes``) say so, else the model's ``forward`` (token types for
    pairs only: what a folder's model implies takes none). A DataError for a model whose main input is
    no token ids (images, audio)."""
    if takes is not None:
        if "input_ids" not in takes:
            raise DataError(
                f"text data: this model takes {', '.join(takes)}, not token ids: give its inputs as tensors"
            )
        return [n for n in TOKEN_INPUTS if n in takes]
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
        forward = set(inspect.signature(target.forward).parameters) if target is not None else set()
    except (TypeError, ValueError):
        forward = set()
    names = ["input_ids"] + (["attention_mask"] if "attention_mask" in forward or not forward else [])
    return names + (["token_type_ids"] if pairs and "token_type_ids" in forward else [])


def _max_tokens(config: Any, tokenizer: Any) -> int:
    """The longest sample: the tokenizer's ``model_max_length`` (RoBERTa's counts its position offset),
    else the config's position table, else 512."""
    limits = [getattr(tokenizer, "model_max_length", None), getattr(config, "max_position_embeddings", None)]
    known = [int(v) for v in limits if isinstance(v, int) and 0 < v < NO_LIMIT]
    return min(known) if known else 512
