"""Data-parallel training across processes started by ``torchrun`` (one process per device or core).

``torchrun --nproc_per_node N --no-python ptopt distill ...`` sets ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``; the trainer then joins a process group (gloo on CPU, nccl on CUDA), wraps the model
in DistributedDataParallel and gives each process its own shard of every epoch through a
DistributedSampler. Only rank 0 writes checkpoints, logs and the output artifact.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


def env_world_size() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def rank() -> int:
    """This process's rank: from the process group when one is up, else from torchrun's environment."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK", "0")) if env_world_size() > 1 else 0
    except ValueError:
        return 0


def is_main_process() -> bool:
    return rank() == 0


def world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return env_world_size()


def resolve_device(name: str) -> Any:
    """``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``, checked by
    ``ptopt.core.device.resolve_device``; under torchrun a plain ``cuda`` means cuda:LOCAL_RANK."""
    from ptopt.core.device import resolve_device as resolve

    if str(name).strip().lower() == "cuda" and env_world_size() > 1:
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return resolve(name)


@contextlib.contextmanager
def process_group(device: Any) -> Iterator[bool]:
    """Join the torchrun process group for the duration of training; yields whether training is distributed.

    A group that is already up (the caller set it up) is used and left up.
    """
    import torch.distributed as dist

    if env_world_size() <= 1 or not dist.is_available():
        yield dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        return
    if dist.is_initialized():
        yield True
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    try:
        yield True
    finally:
        dist.destroy_process_group()


def shard_indices(n: int, epoch: int, seed: int, shuffle: bool = True) -> list[int]:
    """This rank's sample indices for one epoch (every rank gets the same number; a few repeat)."""
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    class _Len:
        def __len__(self) -> int:
            return n

    sampler = DistributedSampler(
        _Len(),
        num_replicas=dist.get_world_size(),
        rank=dist.get_rank(),  # type: ignore[arg-type]
        shuffle=shuffle,
        seed=seed,
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def all_reduce_sum(values: list[float], device: Any) -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def average_gradients(params: list[Any]) -> None:
    """All-reduce gradients that DDP does not own (trainable parts outside the model, e.g. projections)."""
    import torch.distributed as dist

    n = dist.get_world_size()
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= n


def broadcast_buffers(module: Any) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift apart after each rank's last forward)."""
    import torch.distributed as dist

    for b in module.buffers():
        dist.broadcast(b, src=0)


def gather_objects(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
