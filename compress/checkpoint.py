"""Training checkpoints through ``torch.distributed.checkpoint`` (DCP): everything needed to continue
a killed run, on the same or another number of processes.

``<checkpoint_dir>/step-NNNNNNNN/`` holds one checkpoint: DCP's files (every rank writes its own shard
of the model, the trainable parts of the loss, the optimizer state and the best-so-far weights:
``__<rank>_0.distcp``, and rank 0 the ``.metadata`` index) and ``trainer.pt`` (rank 0: the scheduler,
the gradient scaler, the optimizer's hyper-parameters, every rank's RNG states, the position in the
run, the history, and a fingerprint of everything that decides the result: train config, model
architecture, data, loss options; the run's length, epochs and max_steps, may change on resume).
``<checkpoint_dir>/latest`` names the current one. A checkpoint is
written under a temporary name and renamed into place when complete, then ``latest`` is replaced
atomically and the previous checkpoint removed: a run killed while writing leaves the previous one
whole. State dicts go through ``torch.distributed.checkpoint.state_dict`` (fully qualified names, whole
tensors' shapes), so DCP reshards them when the world size or the strategy changes.

Nothing in a checkpoint runs code when read: DCP's files hold tensors only (everything else is in
``trainer.pt``, read with ``weights_only=True``) and its pickled ``.metadata`` index is read by an
unpickler that admits DCP's own metadata classes and nothing else. A checkpoint whose fingerprint
differs from the current run is refused, naming what differs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ptopt.core.errors import UsageError

CHECKPOINT_KIND = "ptopt-train-checkpoint"
CHECKPOINT_VERSION = 2
LATEST = "latest"
TRAINER_FILE = "trainer.pt"
#: what ptopt before version 2 wrote (one file, rank 0): not resumed
OLD_CHECKPOINT = "checkpoint.pt"
#: TrainConfig fields that do not change the trained weights (and may differ on resume: the number
#: of processes and the strategy may change too, DCP reshards)
NON_RESULT_FIELDS = (
    "device",
    "eval_batch_size",
    "strategy",
    "shard_modules",
    "cpu_offload",
    "checkpoint_every",
)
#: TrainConfig fields that say how long the run is: a resumed run may change them, and trains on up to
#: the new length (its learning-rate schedule then spans the new total; ``ptopt.compress.trainer``)
LENGTH_FIELDS = ("epochs", "max_steps")


def tensor_digest(tensors: Any) -> str:
    """sha256 (16 hex) over tensors' dtypes, shapes and bytes; identical tensors give identical digests."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


#: inputs whose name starts with this are derived from the others (e.g. cached teacher logits)
DERIVED_PREFIX = "__ptopt_derived:"


def data_digest(data: Any) -> dict[str, Any]:
    from ptopt.core.inputspec import flatten_inputs

    tensors = [t for name, t in flatten_inputs(data.x) if not name.startswith(DERIVED_PREFIX)]
    return {"samples": len(data), "sha": tensor_digest(tensors + [data.y])}


def model_signature(model: Any) -> str:
    """Hash of parameter/buffer names, shapes and dtypes: the architecture, not the weights."""
    text = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in model.state_dict().items())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(
    config: Any, model: Any, train_data: Any, eval_data: Any, extra: dict[str, Any] | None
) -> dict[str, Any]:
    cfg = {k: v for k, v in config.to_dict().items() if k not in NON_RESULT_FIELDS}
    return {
        "train": cfg,
        "model": model_signature(model),
        "train_data": data_digest(train_data),
        "eval_data": data_digest(eval_data) if eval_data is not None else None,
        "loss": dict(extra or {}),
    }


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


#: what a digest in the fingerprint stands for: said in words, since two hashes alone tell a user nothing
_DIGESTS = {
    "model": "another model to train (its layers' names, shapes or dtypes differ)",
    "loss.teacher": "another teacher (its weights differ)",
    "train_data.sha": "other training data (its values differ)",
    "eval_data.sha": "other evaluation data (its values differ)",
}


def describe_differences(saved: dict[str, Any], now: dict[str, Any], limit: int = 6) -> list[str]:
    a, b = _flatten(saved), _flatten(now)
    diffs = []
    for k in sorted(set(a) | set(b)):
        if json.dumps(a.get(k), default=str) != json.dumps(b.get(k), default=str):
            name = k.replace("train.", "", 1)
            values = f"checkpoint {a.get(k, '(unset)')!r}, now {b.get(k, '(unset)')!r}"
            said = k in _DIGESTS and k in a and k in b  # one side unset: the values say it
            diffs.append(f"{name}: {_DIGESTS[k]} ({values})" if said else f"{name}: {values}")
    return diffs[:limit] + ([f"(+{len(diffs) - limit} more)"] if len(diffs) > limit else [])


# -- RNG -------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # plain lists, so the checkpoint loads with weights_only=True
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- save / load -----------------------------------------------------------------------------------


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> Path | None:
    """The folder of the newest complete checkpoint in ``checkpoint_dir`` (None: none yet)."""
    root = Path(checkpoint_dir)
    pointer = root / LATEST
    if not pointer.is_file():
        if (root / OLD_CHECKPOINT).is_file():
            raise UsageError(
                f"{root / OLD_CHECKPOINT} was written by an earlier ptopt (one file per run), which this "
                "version does not resume: start again with another --checkpoint-dir"
            )
        return None
    name = pointer.read_text(encoding="utf-8").strip()
    folder = root / name
    if not name.startswith("step-") or "/" in name or not (folder / TRAINER_FILE).is_file():
        raise UsageError(f"{pointer} names {name!r}, which is not a complete checkpoint in {root}")
    return folder


def refuse_existing(checkpoint_dir: str | os.PathLike) -> None:
    """A run that does not resume never writes over another run's checkpoint."""
    found = latest_checkpoint(checkpoint_dir)
    if found is not None:
        raise UsageError(
            f"{checkpoint_dir} already holds a checkpoint ({found.name}): continue that run with --resume, "
            "or give another --checkpoint-dir (nothing is written over it)"
        )


def save(
    checkpoint_dir: str | os.PathLike, tensors: dict[str, Any], trainer: dict[str, Any], step: int
) -> Path:
    """Write one checkpoint (every rank calls this: collective): ``tensors`` through DCP, each rank its
    shard; ``trainer`` (rank 0's) as ``trainer.pt``; then rename it into place and point ``latest`` at
    it (module docstring). Returns its folder."""
    import shutil

    import torch
    import torch.distributed.checkpoint as dcp

    from ptopt.compress import distributed as dist_util
    from ptopt.core.atomic import atomic_path, write_text_atomic

    root = Path(checkpoint_dir)
    final = root / step_name(step)
    tmp = root / f".tmp-{final.name}"
    if dist_util.is_main_process():
        shutil.rmtree(tmp, ignore_errors=True)  # a killed writer's leftovers
        tmp.mkdir(parents=True)
    dist_util.barrier()
    with _one_process_quietly():
        dcp.save(
            tensors, storage_writer=dcp.FileSystemWriter(str(tmp)), no_dist=not dist_util.is_distributed()
        )
    if dist_util.is_main_process():
        with atomic_path(tmp / TRAINER_FILE) as f:
            torch.save({"kind": CHECKPOINT_KIND, "version": CHECKPOINT_VERSION, **trainer}, f)
        previous = latest_checkpoint(root)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_text_atomic(root / LATEST, final.name + "\n")
        if previous is not None and previous != final:
            shutil.rmtree(previous, ignore_errors=True)
        for stale in root.glob(".tmp-step-*"):  # another step's writer killed mid-write: never resumed from
            shutil.rmtree(stale, ignore_errors=True)
    dist_util.barrier()
    return final


def read_trainer_state(folder: Path, expected_fingerprint: dict[str, Any]) -> dict[str, Any]:
    """``trainer.pt`` of the checkpoint in ``folder``; another configuration's is refused."""
    import pickle

    import torch

    path = folder / TRAINER_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise UsageError(
            f"{path}: not a readable ptopt checkpoint ({str(e).splitlines()[0][:200]})"
        ) from None
    if not isinstance(state, dict) or state.get("kind") != CHECKPOINT_KIND:
        raise UsageError(f"{path}: not a ptopt training checkpoint")
    if state.get("version") != CHECKPOINT_VERSION:
        raise UsageError(
            f"{path}: checkpoint version {state.get('version')} (this ptopt reads {CHECKPOINT_VERSION})"
        )
    diffs = describe_differences(_without_length(state["fingerprint"]), _without_length(expected_fingerprint))
    if diffs:
        raise UsageError(
            f"{folder} was written by another configuration, cannot resume: "
            + "; ".join(diffs)
            + " (resume with the original options, or use another --checkpoint-dir)"
        )
    return state


def _without_length(fingerprint: dict[str, Any]) -> dict[str, Any]:
    train = {k: v for k, v in (fingerprint.get("train") or {}).items() if k not in LENGTH_FIELDS}
    return {**fingerprint, "train": train}


def load_tensors(folder: Path, template: dict[str, Any]) -> None:
    """Fill ``template`` (this run's state dicts: whole tensors or this rank's shards) in place from the
    checkpoint's DCP files; collective. A tensor it lacks or of another shape is a UsageError."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from ptopt.compress import distributed as dist_util

    try:
        with _one_process_quietly():
            dcp.load(template, storage_reader=SafeReader(str(folder)), no_dist=not dist_util.is_distributed())
    except (CheckpointException, RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise UsageError(f"{folder}: its tensors do not fit this run ({first})") from None


@contextlib.contextmanager
def _one_process_quietly() -> Iterator[None]:
    """DCP warns that it assumes one process whenever no process group is up: that is the intent here."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*assuming the intent is to (save|load) in a single process.*"
        )
        yield


def _safe_reader_class() -> Any:
    import torch.distributed.checkpoint as dcp

    class Reader(dcp.FileSystemReader):
        """DCP's reader, whose ``.metadata`` is unpickled with :class:`_MetadataUnpickler`."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as stream:
                metadata = _MetadataUnpickler(stream).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader


def SafeReader(path: str) -> Any:  # noqa: N802 - builds the class lazily (torch is imported late)
    return _safe_reader_class()(path)


class _MetadataUnpickler:
    """Unpickles DCP's index admitting only its metadata classes, torch sizes/dtypes/layouts and paths."""

    _MODULES = ("torch.distributed.checkpoint.",)
    _NAMES = {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch._utils", "_get_layout"),
        ("collections", "OrderedDict"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PurePosixPath"),
    }

    def __init__(self, stream: Any):
        import pickle

        outer = self

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                return outer.find_class(module, name, super().find_class)

        self._unpickler = Unpickler(stream)

    def load(self) -> Any:
        import pickle

        try:
            return self._unpickler.load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
            raise UsageError(f"a checkpoint's .metadata is not DCP's index ({e})") from None

    def find_class(self, module: str, name: str, base: Any) -> Any:
        import pickle

        import torch

        if (module, name) in self._NAMES:
            return base(module, name)
        if module.startswith(self._MODULES) and "." not in name:
            # only classes defined by DCP itself: a dotted name (``filesystem`` + ``os.system``) or a
            # function would let a checkpoint's index run code on --resume
            found = base(module, name)
            if isinstance(found, type) and found.__module__.startswith(self._MODULES):
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format)):
            return base(module, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")
