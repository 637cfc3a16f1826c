"""The model zoo: reference models written the way users write them, each with a deterministic
training recipe on bundled data.

Cache: ``$PTOPT_CACHE_DIR`` or ``~/.cache/ptopt``; ``zoo/<name>-<key>.safetensors`` plus a JSON with
the recipe and the held-out accuracy it reached. The key hashes the recipe, so changing a recipe
retrains instead of loading stale weights.

Weights: the zoo's trained weights ship with ptopt (``models/weights/``, written by
``python -m ptopt.models.zoo --ship NAME``: resnet 1.2 MB, mobilenet 0.4 MB, transformer 0.5 MB, the
LSTM 4.9 MB stored as float16 (``stored``), every model loads as float32) and are copied into the cache
on first use, so every machine gets the same weights without training them. Shipped weights count
only while their recipe key is the current one: a changed recipe trains instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError

#: Bump when a zoo model's code changes in a way that invalidates cached weights.
ZOO_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ZooEntry:
    name: str
    factory: str  # "ptopt.models.resnet:resnet"
    train_data: str
    test_data: str
    description: str
    epochs: int = 6
    lr: float = 3e-3
    batch_size: int = 64
    weight_decay: float = 0.01
    #: the dtype its trained weights are stored (and shipped) in; loaded as float32 either way
    stored: str = "float32"

    def build(self):
        mod, _, fn = self.factory.partition(":")
        return getattr(importlib.import_module(mod), fn)()

    def recipe(self) -> dict[str, Any]:
        recipe = dataclasses.asdict(self) | {"zoo_version": ZOO_VERSION}
        if self.stored == "float32":  # the default leaves the keys of the float32 models as they were
            del recipe["stored"]
        return recipe

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.recipe(), sort_keys=True).encode()).hexdigest()[:12]


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry(
            "resnet",
            "ptopt.models.resnet:resnet",
            "builtin:digits32:train",
            "builtin:digits32:test",
            "ResNet-style CNN, 3 residual stages (32/64/128), 1×32×32 digits",
            epochs=5,
        ),
        ZooEntry(
            "mobilenet",
            "ptopt.models.mobilenet:mobilenet",
            "builtin:digits32:train",
            "builtin:digits32:test",
            "MobileNetV2-style CNN, depthwise-separable inverted residuals, 1×32×32 digits",
            epochs=8,
        ),
        ZooEntry(
            "lstm",
            "ptopt.models.lstm:lstm",
            "builtin:digits-seq:train",
            "builtin:digits-seq:test",
            "1-layer LSTM (768) classifier, digits as 32 rows of 32 pixels",
            epochs=6,
            lr=2e-3,
            batch_size=32,
            stored="float16",  # 4.9 MB shipped instead of 9.9 MB; rounding far below an int8 step
        ),
        ZooEntry(
            "transformer",
            "ptopt.models.transformer:transformer",
            "builtin:digits-tokens:train",
            "builtin:digits-tokens:test",
            "2-layer transformer encoder (d=64), input_ids + attention_mask, digits as position-value tokens",
            epochs=7,
            lr=2e-3,
        ),
    )
}


def cache_dir() -> Path:
    root = os.environ.get("PTOPT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ptopt")
    return Path(root)


def get_entry(name: str) -> ZooEntry:
    if name not in ZOO:
        raise ModelLoadError(f"unknown zoo model {name!r} (known: {', '.join(sorted(ZOO))})")
    return ZOO[name]


def weights_path(name: str) -> Path:
    e = get_entry(name)
    return cache_dir() / "zoo" / f"{name}-{e.key()}.safetensors"


#: the trained weights shipped with ptopt (module docstring)
SHIPPED = Path(__file__).resolve().parent / "weights"


def shipped_path(name: str) -> Path:
    """Where ptopt ships ``name``'s weights for its current recipe (the file may not exist)."""
    return SHIPPED / weights_path(name).name


def _from_shipped(name: str) -> bool:
    """Copy ``name``'s shipped weights and their JSON into the cache; False when none ship."""
    from ptopt.core.artifact import atomic_path

    src, dst = shipped_path(name), weights_path(name)
    if not (src.is_file() and src.with_suffix(".json").is_file()):
        return False
    for a, b in ((src.with_suffix(".json"), dst.with_suffix(".json")), (src, dst)):  # weights last
        with atomic_path(b) as tmp:
            shutil.copyfile(a, tmp)
    return True


def train_zoo_model(name: str, progress: bool = True):
    """Train a zoo model with its recipe (deterministic) and cache its weights; returns (model, info)."""
    import torch
    from safetensors.torch import save_file

    from ptopt.compress.trainer import TrainConfig, evaluate_accuracy, train
    from ptopt.core.artifact import atomic_path, write_text_atomic
    from ptopt.core.data import load_data

    e = get_entry(name)
    torch.manual_seed(0)
    model = e.build()
    cfg = TrainConfig(epochs=e.epochs, lr=e.lr, batch_size=e.batch_size, weight_decay=e.weight_decay, seed=0)
    with _threads_for_training():
        result = train(
            model,
            load_data(e.train_data),
            cfg,
            eval_data=load_data(e.test_data),
            progress=progress and f"training zoo:{name}",
        )
    path = weights_path(name)
    dtype = getattr(torch, e.stored)
    state = {
        k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in model.state_dict().items()
    }
    with atomic_path(path) as tmp:
        save_file(state, str(tmp))
    info = {
        "name": name,
        "recipe": e.recipe(),
        "test_accuracy": result.best_accuracy,
        "best_epoch": result.best_epoch,
        "history": result.history,
    }
    if e.stored != "float32":  # the model users get is the stored one: its accuracy is the one to state
        model.load_state_dict(state)
        info["trained_test_accuracy"] = info["test_accuracy"]
        info["test_accuracy"] = evaluate_accuracy(model.eval(), load_data(e.test_data))
    write_text_atomic(path.with_suffix(".json"), json.dumps(info, indent=2))
    return model.eval(), info


class _threads_for_training:
    """Train with all usable cores, then restore the caller's thread count."""

    def __enter__(self):
        import torch

        self.prev = torch.get_num_threads()
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.prev)
        return False


def zoo_info(name: str) -> dict[str, Any] | None:
    p = weights_path(name).with_suffix(".json")
    return json.loads(p.read_text()) if p.is_file() else None


def load_zoo_model(name: str, progress: bool = True):
    """A trained zoo model (trained now if not cached) with its input specs and calling style."""
    from safetensors.torch import load_file

    from ptopt.core.inputspec import input_style, specs_from_example

    e = get_entry(name)
    path = weights_path(name)
    if not path.is_file():
        # one trainer per cache: a second process (another shell, a parallel test worker) waits for the
        # first one's weights instead of training the same model again
        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            if not path.is_file() and not _from_shipped(name):
                model, _ = train_zoo_model(name, progress=progress)
                x = model.example_inputs()
                return model, specs_from_example(x), input_style(x)
    model = e.build()
    model.load_state_dict(load_file(str(path)))
    model.eval()
    x = model.example_inputs()
    return model, specs_from_example(x), input_style(x)


def ship(name: str) -> Path:
    """Train ``name`` with its recipe (or take this cache's weights for it) and write them into
    ``models/weights/`` for the package to ship; returns the path written."""
    path = weights_path(name)
    if not path.is_file():
        train_zoo_model(name)
    SHIPPED.mkdir(exist_ok=True)
    for old in SHIPPED.glob(f"{name}-*"):
        old.unlink()  # an earlier recipe's weights
    for src in (path.with_suffix(".json"), path):
        shutil.copyfile(src, SHIPPED / src.name)
    return shipped_path(name)


if __name__ == "__main__":  # python -m ptopt.models.zoo --ship resnet mobilenet transformer
    import sys

    if sys.argv[1:2] != ["--ship"] or not sys.argv[2:]:
        sys.exit("usage: python -m ptopt.models.zoo --ship NAME...")
    for n in sys.argv[2:]:
        print(ship(n))
