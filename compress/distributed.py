"""Training across processes with torch's engines: DistributedDataParallel and FSDP2's ``fully_shard``.

``torchrun --nproc-per-node N -m ptopt.cli.main distill ...`` (or ``ptopt distill --nproc N``) starts N
processes and sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; the trainer joins a process group (gloo
on CPU, nccl on CUDA) and, by ``strategy``:

- ``ddp``: the trained module is wrapped in ``DistributedDataParallel`` (gradients all-reduced
  during backward, buffers broadcast from rank 0 at every forward);
- ``fsdp``: ``fully_shard`` on each wrap unit (the transformer blocks of a Hugging Face model, named by
  its ``_no_split_modules``, or the modules ``shard_modules`` names), then on the model: parameters,
  gradients and optimizer state are sharded over the processes and a unit's parameters are gathered
  only while it runs. A teacher is sharded the same way (forward only). ``MixedPrecisionPolicy``
  (``param_dtype`` / ``reduce_dtype``) and ``CPUOffloadPolicy`` are torch's own;
- ``auto``: ``ddp`` under torchrun, one process otherwise; ``none``: one process.

Every process sees the same global batch of ``batch_size`` samples (the single-process run's batch, in
its order) and trains on its own slice of it (:func:`rank_part`); the trainer weighs each slice's loss
so that the averaged gradient is the gradient of the global batch's loss, whatever the world size.
Only rank 0 writes logs and the output; every rank writes its shard of a checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import functools
import os
import weakref
from collections.abc import Iterator
from typing import Any

from ptopt.core.errors import UsageError

STRATEGIES = ("auto", "none", "ddp", "fsdp")
#: dtypes of FSDP's MixedPrecisionPolicy, by the names the options take
DTYPES = ("fp32", "bf16", "fp16")
#: how to start several processes, for the messages that need it
LAUNCH_HINT = (
    "launch it with torchrun: torchrun --nproc-per-node 2 -m ptopt.cli.main distill ... "
    "(or add --nproc 2 to the ptopt command)"
)


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


def is_distributed() -> bool:
    """Whether a process group of more than one process is up."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def resolve_device(name: str) -> Any:
    """``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``, checked by
    ``ptopt.core.device.resolve_device``; under torchrun a plain ``cuda`` means cuda:LOCAL_RANK."""
    from ptopt.core.device import resolve_device as resolve

    if str(name).strip().lower() == "cuda" and env_world_size() > 1:
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return resolve(name)


def resolve_strategy(name: str) -> str:
    """``auto`` → ``ddp`` under torchrun, ``none`` otherwise; ``ddp``/``fsdp`` need several processes
    and ``none`` only one (UsageError saying how to launch)."""
    world = env_world_size()
    if name not in STRATEGIES:
        raise UsageError(f"strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
    if name == "auto":
        return "ddp" if world > 1 else "none"
    if name in ("ddp", "fsdp") and world <= 1:
        raise UsageError(f"--strategy {name} trains across several processes, and this is one: {LAUNCH_HINT}")
    if name == "none" and world > 1:
        raise UsageError(
            f"--strategy none under torchrun ({world} processes) would train {world} separate models: "
            "use --strategy ddp or fsdp"
        )
    return name


def check_launch(nproc: int, command: str) -> None:
    """``nproc`` processes asked of a twin: under torchrun, its number of processes (or 1); in one
    process, 1 (the CLI's ``--nproc`` starts the processes; a Python script runs under torchrun)."""
    world = env_world_size()
    if world > 1 and nproc not in (1, world):
        raise UsageError(
            f"--nproc {nproc} under torchrun, which started {world} processes: leave --nproc out"
        )
    if world == 1 and nproc > 1:
        raise UsageError(
            f"nproc={nproc} starts processes from the command line ({command} --nproc {nproc} ...); "
            f"from Python, run the script under torchrun --nproc-per-node {nproc}"
        )


def check_batch(batch_size: int, world: int) -> None:
    """The global batch must split evenly over the processes (each trains on batch_size / world)."""
    if batch_size % world:
        raise UsageError(
            f"--batch-size {batch_size} is the global batch (all processes together) and does not split "
            f"over {world} processes: use a multiple of {world}"
        )


@contextlib.contextmanager
def process_group(device: Any) -> Iterator[bool]:
    """Join the torchrun process group for the duration of training; yields whether training is
    distributed. A group that is already up (the caller set it up) is used and left up."""
    import torch.distributed as dist

    if env_world_size() <= 1 or not dist.is_available():
        yield is_distributed()
        return
    if dist.is_initialized():
        yield True
        return
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    try:
        yield True
    finally:
        dist.destroy_process_group()


# -- the global batch, split -------------------------------------------------------------------------


def global_batches(n: int, batch_size: int, shuffle: bool, seed: int) -> list[Any]:
    """The single-process run's batches as index tensors: a permutation seeded by ``seed`` (the order
    ``Dataset.batches(shuffle=True, seed=seed)`` gives), cut into batches of ``batch_size``."""
    import torch

    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    return list(torch.split(order, batch_size))


def rank_part(indices: Any, world: int, rank_: int) -> tuple[Any, bool]:
    """This rank's slice of one global batch (contiguous, as even as the batch allows) and whether it
    counts: a rank left without samples (a last batch smaller than the world) runs the batch's first
    sample with weight 0, so that every rank takes part in every step's collectives."""
    import torch

    part = torch.tensor_split(indices, world)[rank_]
    return (part, True) if part.numel() else (indices[:1], False)


# -- wrapping ----------------------------------------------------------------------------------------


def data_parallel(module: Any) -> Any:
    """``module`` in DistributedDataParallel (inputs are already on the module's device)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(module, device_ids=None)


def shard_units(model: Any, names: tuple[str, ...] = (), strict: bool = True) -> list[Any]:
    """The modules ``fully_shard`` wraps one by one, innermost first: those ``names`` match (a module's
    path, a shell pattern over paths such as ``layers.*``, or a class name), else a Hugging Face model's
    ``_no_split_modules`` classes (its transformer blocks), else none (the model is one unit).
    ``strict``: a name that matches nothing is a UsageError (else skipped: a teacher of another shape)."""
    named = [(n, m) for n, m in model.named_modules() if n]
    chosen = []
    for name in names:
        hits = [m for n, m in named if _matches(n, name) or type(m).__name__ == name]
        if not hits and strict:
            listed = ", ".join(n for n, _ in named[:12]) + (" ..." if len(named) > 12 else "")
            raise UsageError(f"--shard-module {name}: the model has no such module (modules: {listed})")
        chosen += [m for m in hits if all(m is not c for c in chosen)]
    if not chosen:
        classes = set(getattr(model, "_no_split_modules", None) or ())
        chosen = [m for _, m in named if type(m).__name__ in classes]
    order = {id(m): i for i, (_, m) in enumerate(named)}
    return sorted(chosen, key=lambda m: -order[id(m)])  # children before their parents


def _matches(path: str, pattern: str) -> bool:
    """A module path against a pattern, part by part (``layers.*`` names the blocks, not their layers)."""
    parts, wanted = path.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(
        fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True)
    )


def fsdp_policies(param_dtype: str, reduce_dtype: str, cpu_offload: bool, device: Any) -> dict[str, Any]:
    """``fully_shard``'s keyword arguments: torch's MixedPrecisionPolicy and CPUOffloadPolicy."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    kw: dict[str, Any] = {}
    if param_dtype != "fp32" or reduce_dtype != "fp32":
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=dtypes[param_dtype], reduce_dtype=dtypes[reduce_dtype] or torch.float32
        )
    if cpu_offload:
        if device.type != "cuda":
            raise UsageError(
                "--cpu-offload keeps FSDP's sharded parameters on the CPU between uses on a GPU; "
                "training on the CPU already holds them there (use it with --device cuda)"
            )
        kw["offload_policy"] = CPUOffloadPolicy()
    return kw


def shard(model: Any, units: list[Any], policies: dict[str, Any], frozen: bool = False) -> Any:
    """``fully_shard`` each unit, then the model (its root); the model itself, now sharded. A model
    sharded already (loaded in shards) is left as it is. ``frozen`` (a teacher: forward only): its root
    too gives its gathered parameters back after each forward (FSDP keeps a root's for the backward).

    Tied input and output embeddings (a language model's vocabulary matrix, used by the first layer and
    by the last) are a unit of their own (:func:`tied_embeddings`), so that the matrix, the largest
    parameter of a small LM, is gathered only while it is used: a frozen model's after its forward,
    a trained model's as soon as the output layer's backward is done (:func:`_free_after_output_backward`;
    the input embedding's backward needs the token ids, not the matrix). On gloo, without mixed
    precision, its gradient is reduce-scattered as soon as it is complete (:class:`_EmbeddingRows`)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(model, FSDPModule):
        return model
    tied = tied_embeddings(model, units)
    gloo = not frozen and _backend() == "gloo"
    comm = _chunked_reduce_scatter() if gloo else None
    if tied:
        fully_shard(tied, **policies, reshard_after_forward=frozen)
        if not frozen:
            _free_after_output_backward(tied[1])
            if _EmbeddingRows.applies(tied[0]):
                rows = _EmbeddingRows(tied[0], tied[1])
                rows.reduce = gloo and "mp_policy" not in policies
    for unit in units:
        fully_shard(unit, **policies)
    fully_shard(model, **policies, **({"reshard_after_forward": True} if frozen else {}))
    for module in model.modules() if comm is not None else ():
        if isinstance(module, FSDPModule) and hasattr(module, "set_custom_reduce_scatter"):
            module.set_custom_reduce_scatter(comm)
    return model


def _backend() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_available() and dist.is_initialized() else None


#: elements per piece of a reduce-scatter on gloo (:func:`_chunked_reduce_scatter`): 4 MiB of fp32
REDUCE_SCATTER_CHUNK = 1 << 20


def _chunked_reduce_scatter() -> Any | None:
    """FSDP's gradient reduce-scatter (``set_custom_reduce_scatter``, torch's own hook for it) in pieces
    of REDUCE_SCATTER_CHUNK elements of every rank's shard: gloo reduces a flat buffer through a working
    copy of it, which for a unit holding a vocabulary matrix is the largest allocation of the step
    (``benchmarks/bench_distill_lm.py memory``); piece by piece that copy is a piece. Sums are the same."""
    import torch
    import torch.distributed as dist

    try:  # torch's hook for it is recent (2.13 has it); without it FSDP reduces in one piece, as before
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError:
        return None

    class ChunkedReduceScatter(ReduceScatter):
        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(
            self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False
        ):
            shard = output_tensor.numel()
            rows = input_tensor.view(-1, shard)  # rank r's part of the flat buffer is row r
            for start in range(0, shard, REDUCE_SCATTER_CHUNK):
                part = slice(start, min(start + REDUCE_SCATTER_CHUNK, shard))
                dist.reduce_scatter(output_tensor[part], [row[part] for row in rows], op=op, group=group)

    return ChunkedReduceScatter()


def tied_embeddings(model: Any, units: list[Any]) -> list[Any] | None:
    """``[input embeddings, output layer]`` of a model whose output layer holds the input embedding's
    weight (Hugging Face's ``tie_word_embeddings``), when neither is a wrap unit already; else None."""
    try:
        pair = [model.get_input_embeddings(), model.get_output_embeddings()]
    except (AttributeError, NotImplementedError):
        return None
    weights = [getattr(m, "weight", None) for m in pair]
    if weights[0] is None or weights[0] is not weights[1] or any(u is m for u in units for m in pair):
        return None
    return pair


def _free_after_output_backward(output: Any) -> None:
    """Give the gathered tied matrix back once the output layer's backward has computed its gradients
    (FSDP would keep it until the input embedding's, the last of the backward): each training
    forward hooks the output layer's input, whose gradient comes with the weight's."""
    import torch

    def hook(module: Any, args: tuple, _out: Any) -> None:
        x = args[0] if args else None
        if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
            x.register_hook(lambda _grad: _output_backward_done(module))

    output.register_forward_hook(hook)


def _output_backward_done(output: Any) -> None:
    if hasattr(output, "reshard"):  # an FSDP unit (always, but for a unit test's plain module)
        output.reshard()
    rows = getattr(output, "_ptopt_rows", None)
    if rows is not None:
        rows.output_done = True


class _EmbeddingRows:
    """The tied matrix's gradient accumulated in place. Autograd sums the two uses of one matrix out of
    place: the output layer's gradient (vocabulary x hidden), plus the input embedding's (a dense
    matrix of the same size, mostly zeros), into a third. Here the embedding's forward output is cut
    from the matrix (its backward gives the matrix no gradient) and keeps the gradient of its rows;
    once autograd has put the output layer's gradient on the matrix (``.grad``, a post-accumulate
    hook), those rows are added into it (``index_add_``): one vocabulary-sized matrix in the whole
    backward. Only when the output layer's backward has run in this backward (else the embedding's
    gradient is autograd's as usual) and for a plain ``nn.Embedding`` (no max_norm, no scaling).

    With ``reduce`` (gloo, no mixed precision) that complete gradient is also reduce-scattered right
    there (:func:`_reduce_scatter_tied`), so that FSDP, finding no gradient on the matrix, does not copy
    it into a reduce-scatter buffer of the same size: the end of the backward holds one
    vocabulary-sized matrix, not two."""

    def __init__(self, embedding: Any, output: Any):
        self.embedding, self.output_done, self.pending, self.reduce = embedding, False, [], False
        output._ptopt_rows = self
        embedding.register_forward_hook(self.forward_hook)

    @staticmethod
    def applies(embedding: Any) -> bool:
        import torch

        return (
            isinstance(embedding, torch.nn.Embedding)
            and type(embedding).forward is torch.nn.Embedding.forward
            and embedding.max_norm is None
            and not embedding.scale_grad_by_freq
        )

    def forward_hook(self, module: Any, args: tuple, out: Any) -> Any:
        import torch

        weight, ids = module.weight, args[0] if args else None  # the gathered matrix (FSDP's hook ran)
        if not (torch.is_grad_enabled() and weight.requires_grad and isinstance(ids, torch.Tensor)):
            return out
        self.output_done = False
        if not getattr(weight, "_ptopt_rows", False):
            weight.register_post_accumulate_grad_hook(self.add_rows)
            weight._ptopt_rows = True
        return _rows_function().apply(out.detach(), weight, ids, self)

    def add_rows(self, weight: Any) -> None:
        pending, self.pending = self.pending, []
        for ids, rows in pending:
            keep = ids != self.embedding.padding_idx if self.embedding.padding_idx is not None else None
            ids, rows = (ids[keep], rows[keep]) if keep is not None else (ids, rows)
            weight.grad.index_add_(0, ids, rows.to(weight.grad.dtype))
        if pending and self.reduce:
            _reduce_scatter_tied(self.embedding, weight)

    def backward(self, grad: Any, num: int, ids: Any) -> Any:
        """The matrix's gradient from this lookup: none (its rows kept for :meth:`add_rows`) when the
        output layer's gradient is on its way to the matrix, else the dense one autograd gives."""
        import torch

        if self.output_done:
            self.pending.append((ids.reshape(-1), grad.reshape(-1, grad.shape[-1])))
            return None
        pad = self.embedding.padding_idx
        return torch.ops.aten.embedding_dense_backward(grad, ids, num, -1 if pad is None else pad, False)


def _reduce_scatter_tied(embedding: Any, weight: Any) -> None:
    """The gathered tied matrix's complete gradient (``weight.grad``, its last contribution added)
    averaged over the ranks into this rank's shard, which FSDP would do at its post-backward: pieces of
    REDUCE_SCATTER_CHUNK elements (as :func:`_chunked_reduce_scatter`) written into a shard-sized tensor,
    accumulated into the sharded parameter's ``.grad`` as FSDP accumulates it (a DTensor of the same
    placement), then ``weight.grad = None``. FSDP's own path copies the gradient into a new buffer of
    its size first (``foreach_reduce``) while the gradient is still held: that copy was the peak of the
    step. Public API only (the sharded parameter is the module's ``weight`` once the group is resharded
    by :func:`_output_backward_done`); anything else (uneven rows, a dtype FSDP would reduce in another
    precision) is left to FSDP, as before. ptopt never turns FSDP's gradient sync off (no ``no_sync``
    under FSDP), so every backward reduces."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    sharded, grad = embedding.weight, weight.grad
    if not isinstance(sharded, DTensor) or grad is None or isinstance(grad, DTensor):
        return
    group = sharded.device_mesh.get_group()
    world = dist.get_world_size(group)
    if (
        grad.dtype != sharded.dtype
        or grad.dtype not in (torch.float32, torch.bfloat16)
        or grad.shape[0] % world
        or tuple(sharded.to_local().shape) != (grad.shape[0] // world, *grad.shape[1:])
        or not grad.is_contiguous()
    ):
        return
    local = torch.empty_like(sharded.to_local())
    flat, rows = local.view(-1), grad.view(world, -1)
    for start in range(0, flat.numel(), REDUCE_SCATTER_CHUNK):
        part = slice(start, min(start + REDUCE_SCATTER_CHUNK, flat.numel()))
        dist.reduce_scatter(flat[part], [row[part] for row in rows], op=dist.ReduceOp.AVG, group=group)
    weight.grad = None
    if sharded.grad is None:
        sharded.grad = DTensor.from_local(
            local,
            sharded.device_mesh,
            sharded.placements,
            run_check=False,
            shape=sharded.shape,
            stride=sharded.stride(),
        )
    else:
        sharded.grad.to_local().add_(local)


@functools.cache
def _rows_function() -> Any:
    """An embedding lookup's output, joined to the matrix in autograd with :class:`_EmbeddingRows`'s
    backward (the lookup itself is computed by the module)."""
    import torch

    class Rows(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, out: Any, weight: Any, ids: Any, owner: Any) -> Any:
            ctx.owner, ctx.num = owner, weight.shape[0]
            ctx.save_for_backward(ids)
            return out.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
            (ids,) = ctx.saved_tensors
            return None, ctx.owner.backward(grad, ctx.num, ids), None, None

    return Rows


#: skeletons of models loaded in shards (:func:`load_sharded`), taken before sharding
_SKELETONS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def skeleton(model: Any) -> Any:
    """A copy of ``model`` whose parameters are on the meta device (no memory) and whose buffers are
    real: :func:`materialize` fills it with a gathered state dict after sharded training. A model
    loaded in shards gives the skeleton taken before it was sharded."""
    import torch

    if model in _SKELETONS:
        return _SKELETONS[model]
    memo = {
        id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
        for p in model.parameters()
    }
    return copy.deepcopy(model, memo)


def materialize(shell: Any, state: dict[str, Any]) -> Any:
    """``shell`` (from :func:`skeleton`) holding ``state``; parameters shared under several names
    (tied embeddings) are shared again."""
    groups: dict[int, list[str]] = {}
    for name, p in shell.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    shell.load_state_dict(state, assign=True, strict=False)
    for names in groups.values():
        first = shell.get_parameter(names[0])
        for name in names[1:]:
            owner, _, leaf = name.rpartition(".")
            setattr(shell.get_submodule(owner) if owner else shell, leaf, first)
    return shell


def full_state_dict(model: Any) -> dict[str, Any]:
    """The whole model's state dict on rank 0's CPU (empty on the other ranks); collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# -- collectives -------------------------------------------------------------------------------------


def all_reduce_sum(values: list[float], device: Any) -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def gather_objects(obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (``obj`` itself when not distributed)."""
    if not is_distributed():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


#: glibc's ``mallopt`` parameter for the size from which an allocation is its own mapping
_M_MMAP_THRESHOLD = -3
#: FSDP on the CPU: allocations from this size on are mappings, unmapped (given back) when freed
MMAP_THRESHOLD = 128 * 1024


def return_freed_memory() -> bool:
    """Make glibc give freed tensor memory back to the system at once (``mallopt(M_MMAP_THRESHOLD)``
    at 128 KiB, its initial value, which then stays fixed); returns whether it could (glibc only).

    By default glibc raises that threshold to the size of every mapped block freed (up to 32 MiB), so
    after the first steps activations, FSDP's gathered parameters and gradient buffers come from its
    heap, which keeps what they freed: a process's resident memory then grows well past what it
    holds, and FSDP's per-process saving is lost in it (``benchmarks/bench_distill.py`` measured
    both). The same setting from the environment: ``MALLOC_MMAP_THRESHOLD_=131072``."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False


def peak_memory(device: Any) -> dict[str, float]:
    """This process's peak resident memory (MiB, since it started) and, on CUDA, the peak allocated."""
    import resource
    import sys

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"peak_rss_mb": rss / (2**20 if sys.platform == "darwin" else 1024)}
    if device.type == "cuda":
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


# -- loading in shards -------------------------------------------------------------------------------


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside hold their parameters on the meta device (no memory) and their buffers
    for real (a rotary embedding's frequencies are computed, not stored): ``nn.Module.register_parameter``
    moves each parameter to meta as it is registered (what accelerate's ``init_empty_weights`` does)."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module: Any, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def load_sharded(
    model: Any, tensors: Any, units: list[Any], policies: dict[str, Any], device: Any, frozen: bool = False
) -> Any:
    """``model`` (built with :func:`parameters_on_meta`) sharded by ``fully_shard`` and filled with its
    weights, each process reading only its own shard of every parameter: ``tensors(name, rows)`` gives
    rows ``rows`` (a slice of dim 0, the dimension FSDP2 shards) of the stored tensor ``name``; ``frozen``
    as in :func:`shard`. Peak memory is this process's shard, never the whole model (torchtitan's
    meta-device initialization, the weights read by slice as DCP's Hugging Face reader does)."""
    import torch

    _SKELETONS[model] = skeleton(model)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    shard(model, units, policies, frozen)
    model.to_empty(device=device)  # this process's shards only; buffers come back below
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            start = _row_offset(p)
            local.copy_(tensors(name, slice(start, start + local.shape[0])))
    return model


def _row_offset(param: Any) -> int:
    """The first row (dim 0) of this process's shard of ``param`` (a DTensor; 0 for a plain tensor)."""
    if not hasattr(param, "device_mesh"):
        return 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return int(offset[0]) if offset else 0
