"""Hugging Face model folders: ``hf`` (a folder with ``config.json`` and fp32/bf16 weights, as
``save_pretrained`` writes it: a MODEL ptopt reads) and ``hf_weight_only`` (what ``ptopt quantize
--mode weight-only`` writes: the same folder with int8 or int4 weights).

A weight-only folder holds ``config.json`` (the model's), ``quantization.json`` (bits, group size,
method, the layers quantized, the activation dtype), the tokenizer files of its source, and its
weights, written so that the tools users already have load it:

- int8: ``model.safetensors`` in torchao's safetensors layout and a ``quantization_config``
  (``TorchAoConfig``) in ``config.json``: ``AutoModelForCausalLM.from_pretrained(folder)`` loads it
  with torchao installed, and so does ``ptopt.load_model(folder)``.
- int8 of a model with tied embeddings (``quantization.json``'s ``tied_embedding``: ``{embedding:
  output layer}``): the same file and loaders. The shared matrix is one int8 tensor, stored once under
  the embedding's name as the fp32 folder stores it; ``quantization_config`` says
  ``include_input_output_embeddings: true`` so that from_pretrained reads it as int8, and
  ``tie_word_embeddings`` makes the output layer the same tensor again (transformers 5.x; its
  ``untie_embedding_weights`` would store a second copy and is not used). Loaded by from_pretrained,
  the embedding runs torchao's own embedding, which dequantizes the whole table on every call;
  ``ptopt.load_model`` routes it to a lookup of the int8 rows of the ids
  (``ptopt.core.lm.use_int8_embedding``; same values). With ``--exclude lm_head`` (or the embedding)
  the matrix stays float, as in the fp32 folder.
- int4: ``model.pt``, a state_dict of torchao ``Int4OpaqueTensor`` weights (the CPU int4 layout,
  which torchao's safetensors support does not cover yet): ``torch.load(f, weights_only=True)``
  after ``import torchao``, into ``AutoModelForCausalLM.from_config(config)`` in ``dtype`` with
  ``load_state_dict(sd, assign=True)``. ``ptopt.load_model(folder)`` does that. GPT-2-style models
  (``Conv1D`` layers ptopt made ``nn.Linear``, ``linear_from_conv1d``) are saved this way at int8 too
  (from_pretrained would rebuild the ``Conv1D``); their tied int8 matrix is stored once and tied again
  by ``tie_weights`` after loading.

The sidecar sits beside the folder (``model.int4.ptopt.json`` for ``model.int4/``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError
from ptopt.core.hf import (
    TOKENIZER_FILES,
    config_names_causal_lm,
    has_tokenizer,
    is_hf_dir,
    load_causal_lm,
    load_hf_module,
)
from ptopt.formats.base import Format, loaded_model
from ptopt.formats.runner import TorchModuleRunner

QUANT_FILE = "quantization.json"
INT8_WEIGHTS = "model.safetensors"
INT4_WEIGHTS = "model.pt"
#: tokenizer and generation files copied from the source folder (transformers 5 saves a chat template
#: as its own file, and named ones in a folder: without them the copy's ``apply_chat_template`` fails)
COMPANIONS = (*TOKENIZER_FILES, "special_tokens_map.json", "merges.txt", "generation_config.json",
              "added_tokens.json", "chat_template.jinja", "chat_template.json")  # fmt: skip
#: folders of tokenizer files copied whole
COMPANION_DIRS = ("additional_chat_templates",)


class HFModel(Format):
    """A Hugging Face causal-LM folder (``hf:DIR`` or the folder itself)."""

    name = "hf"
    label = "Hugging Face model folder"
    folder = True
    servers = ("ray",)
    generates_text = True
    sniff_rank = 40

    def sniff(self, path: Path) -> bool:
        return is_hf_dir(path) and not (path / QUANT_FILE).is_file()

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        if art is not None and not config_names_causal_lm(path):
            # a folder ptopt wrote of an encoder, a classifier, a vision or audio model (``prune -o DIR``):
            # its module, as ``hf:DIR`` of the source loads it, with the sidecar's inputs
            module = load_hf_module(path, allow_pickle)
            return loaded_model(path, "eager", module, path, art, info={"hf_model": str(path)})
        module = load_causal_lm(path, allow_pickle)
        return loaded_model(path, self.name, module, path, art, info={"hf_dir": str(path)})

    def runner(self, name: str, loaded: Any, **kw: Any) -> Any:
        return TorchModuleRunner.from_loaded(name, loaded, "torch eager")


class HFWeightOnly(HFModel):
    """ptopt's weight-only folder (module docstring)."""

    name = "hf_weight_only"
    label = "weight-only quantized Hugging Face folder (torchao)"
    packages = ("torchao", "transformers")
    reexportable = False
    sniff_rank = 39

    def sniff(self, path: Path) -> bool:
        return is_hf_dir(path) and (path / QUANT_FILE).is_file()

    def load(self, path: Path, art: Any, allow_pickle: bool) -> Any:
        module = load_weight_only(path)
        return loaded_model(path, self.name, module, path, art, info={"hf_dir": str(path)})


def _quant_record(path: Path) -> dict[str, Any]:
    try:
        rec = json.loads((path / QUANT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path / QUANT_FILE}: unreadable ({e})") from None
    if not isinstance(rec, dict) or rec.get("bits") not in (4, 8):
        raise ModelLoadError(f"{path / QUANT_FILE}: not a ptopt weight-only record")
    return rec


def load_weight_only(path: Path) -> Any:
    """The quantized model of a weight-only folder (module docstring), in eval mode."""
    import torch

    from ptopt.core.hf import config_of, import_transformers
    from ptopt.core.quiet import quiet_imports

    rec = _quant_record(path)
    tf = import_transformers()
    with quiet_imports():
        import torchao  # noqa: F401 - registers its tensors as safe to load

        if rec["weights"] == INT8_WEIGHTS:
            try:
                model = tf.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).eval()
            except (OSError, ValueError, RuntimeError) as e:
                raise ModelLoadError(
                    f"{path}: transformers cannot load it: {type(e).__name__}: {e}"
                ) from None
            return _int8_kernel(model)
        # torchao's int4 CPU tensor registers itself as safe to load only when its module is imported
        import torchao.prototype.quantization.int4  # noqa: F401

        try:
            state = torch.load(path / rec["weights"], weights_only=True, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - a corrupt or foreign file
            raise ModelLoadError(f"{path / rec['weights']}: unreadable: {type(e).__name__}: {e}") from None
        model = tf.AutoModelForCausalLM.from_config(config_of(path))
    model = model.to(getattr(torch, rec["dtype"])).eval()
    for name in rec.get("linear_from_conv1d") or ():
        _as_linear(model, name)
    missing, unexpected = model.load_state_dict(state, assign=True, strict=False)
    tied = set(_tied_keys(model))
    if unexpected or set(missing) - tied:
        odd = sorted(unexpected or set(missing) - tied)
        raise ModelLoadError(
            f"{path / rec['weights']}: does not fit the model of config.json ({', '.join(odd[:3])})"
        )
    model.tie_weights()
    return _int8_kernel(model) if rec["bits"] == 8 else model


def _int8_kernel(model: Any) -> Any:
    """int8 layers through torch's CPU kernel (``core.lm.use_int8_kernel``) and an embedding that
    shares the int8 matrix through the row lookup (``core.lm.use_int8_embedding``), as quantize ran
    them."""
    from ptopt.core.lm import use_int8_embedding, use_int8_kernel

    use_int8_kernel(model)
    use_int8_embedding(model)
    return model


def _as_linear(model: Any, name: str) -> None:
    """Replace the Conv1D ``name`` (GPT-2) by the empty ``nn.Linear`` its saved weight fills."""
    import torch

    conv = model.get_submodule(name)
    rows, cols = conv.weight.shape  # Conv1D stores [in, out]
    lin = torch.nn.Linear(rows, cols, bias=conv.bias is not None, device="meta", dtype=conv.weight.dtype)
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, lin.to_empty(device="cpu"))


def _tied_keys(module: Any) -> list[str]:
    if not getattr(module.config, "tie_word_embeddings", False):
        return []
    tied = getattr(module, "_tied_weights_keys", None) or {}
    return list(tied.keys() if isinstance(tied, dict) else tied)


def write_weight_only(
    module: Any, folder: Path, record: dict[str, Any], source_dir: Any, files: dict[str, bytes] | None = None
) -> dict[str, Any]:
    """Write ``module`` (torchao-quantized) as a weight-only folder; returns the writer's facts.
    ``files``: more files of the folder, by name (``decode_step.pt2``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    # from_pretrained rebuilds int8 from safetensors, but not Conv1D layers ptopt made Linear
    weights = INT8_WEIGHTS if record["bits"] == 8 and not record.get("linear_from_conv1d") else INT4_WEIGHTS
    record = dict(record, weights=weights)
    config = module.config.to_dict()
    if weights == INT8_WEIGHTS:
        config["quantization_config"] = _torchao_config(record)
        _save_int8(module, folder / weights)
    else:
        import torch

        torch.save(_state_without_ties(module), folder / weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n", encoding="utf-8")
    (folder / QUANT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return {"files": copy_companions(source_dir, folder)}


def copy_companions(source_dir: Any, folder: Path) -> list[str]:
    """Copy the tokenizer and generation files of ``source_dir`` (when it has a tokenizer) into
    ``folder``; returns every file of the folder, relative to its parent (the writer's ``files``)."""
    if source_dir is not None and has_tokenizer(source_dir):
        for name in COMPANIONS:
            if (Path(source_dir) / name).is_file():
                shutil.copyfile(Path(source_dir) / name, folder / name)
        for name in COMPANION_DIRS:
            if (Path(source_dir) / name).is_dir():
                shutil.copytree(Path(source_dir) / name, folder / name, dirs_exist_ok=True)
    return sorted(p.relative_to(folder.parent).as_posix() for p in folder.rglob("*") if p.is_file())


def _state_without_ties(module: Any) -> dict[str, Any]:
    """The state_dict with each tied weight once (``from_config`` ties them again)."""
    state = module.state_dict()
    for name in _tied_keys(module):
        state.pop(name, None)
    return state


def _torchao_config(record: dict[str, Any]) -> dict[str, Any]:
    """``config.json``'s ``quantization_config`` for int8 (what ``from_pretrained`` rebuilds from)."""
    from ptopt.core.hf import import_transformers
    from ptopt.core.quiet import quiet_imports

    tf = import_transformers()
    with quiet_imports():
        from torchao.quantization import Int8WeightOnlyConfig
        from torchao.quantization.granularity import PerGroup, PerRow

        group = record.get("group_size")
        cfg = tf.TorchAoConfig(
            Int8WeightOnlyConfig(granularity=PerGroup(group) if group else PerRow()),
            modules_to_not_convert=sorted(record.get("float_layers", {})) or None,
            # the tied matrix is int8 and stored once, under the embedding's name: from_pretrained reads
            # it as int8 only when embeddings are in scope (it ties the output layer to it again)
            include_input_output_embeddings=bool(record.get("tied_embedding")),
        )
    return cfg.to_dict()


def _save_int8(module: Any, path: Path) -> None:
    from safetensors.torch import save_file

    from ptopt.core.quiet import quiet_imports

    with quiet_imports():
        from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

        tensors, metadata = flatten_tensor_state_dict(_state_without_ties(module))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)


FORMATS = [HFModel(), HFWeightOnly()]
