"""The pieces of training across processes that one process can check: the global batch split over
ranks, the strategy and launch checks, FSDP's wrap units, the unsharded copy of a sharded model, and
checkpoint folders (their index is read without running code). The processes themselves:
``test_distill_processes.py``."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from ptopt.compress import checkpoint as ckpt_util
from ptopt.compress import distributed as dist_util
from ptopt.core.errors import UsageError
from tests.helpers import assert_refused


@pytest.mark.parametrize("n,batch,world", [(10, 4, 2), (9, 4, 2), (7, 6, 3), (5, 4, 4)], ids=str)
def test_rank_slices_rebuild_the_single_process_batches(n, batch, world):
    """Each global batch is the one a single process trains on, in its order; the ranks' slices put
    together are that batch, and a rank left without samples runs one that does not count."""
    from ptopt.core.data import Dataset

    single = [
        b.x.reshape(-1).tolist()
        for b in Dataset(torch.arange(n).float()).batches(batch, shuffle=True, seed=3)
    ]
    split = dist_util.global_batches(n, batch, True, 3)
    assert [b.tolist() for b in split] == [[int(v) for v in s] for s in single]
    for idx in split:
        parts = [dist_util.rank_part(idx, world, r) for r in range(world)]
        assert torch.cat([p for p, counts in parts if counts]).tolist() == idx.tolist()
        assert all(p.numel() == 1 for p, counts in parts if not counts)


def test_strategies_need_the_processes_they_name(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert dist_util.resolve_strategy("auto") == "none"
    for name in ("ddp", "fsdp"):
        assert_refused(dist_util.resolve_strategy, name, match=["this is one", "torchrun --nproc-per-node 2"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert dist_util.resolve_strategy("auto") == "ddp"
    assert_refused(dist_util.resolve_strategy, "none", match="train 2 separate models")
    assert_refused(dist_util.check_batch, 7, 2, match=["--batch-size 7 is the global batch", "multiple of 2"])


def test_fsdp_options_need_fsdp_and_offload_needs_cuda():
    from ptopt.compress.trainer import TrainConfig

    with pytest.raises(UsageError, match="apply to --strategy fsdp"):
        TrainConfig(shard_modules=("layers.*",))
    assert_refused(dist_util.fsdp_policies, "fp32", "fp32", True, torch.device("cpu"), match="--device cuda")
    assert set(dist_util.fsdp_policies("bf16", "fp32", False, torch.device("cpu"))) == {"mp_policy"}


class Blocks(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight  # tied, as language models tie them

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5), persistent=False)

    def forward(self, x):
        return x + self.inner(x) * self.scale


def test_wrap_units_by_name_pattern_class_and_model_default():
    model = Blocks()
    blocks = list(model.layers)
    assert dist_util.shard_units(model) == blocks[::-1]  # _no_split_modules; children before parents
    assert dist_util.shard_units(model, ("layers.*",)) == blocks[::-1]
    assert dist_util.shard_units(model, ("layers.1", "layers")) == [blocks[1], model.layers]
    assert dist_util.shard_units(model, ("Linear",))[0] is model.head
    assert_refused(dist_util.shard_units, model, ("nope",), match=["--shard-module nope", "embed, layers"])
    assert dist_util.shard_units(model, ("nope",), strict=False) == blocks[::-1]


class TiedLM(nn.Module):
    """A language model's shape: an input embedding whose matrix the output layer shares (or not)."""

    def __init__(self, tied: bool = True):
        super().__init__()
        self.embed, self.body, self.head = nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 10, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


def test_tied_embeddings_are_one_wrap_unit_unless_named_or_untied():
    tied = TiedLM()
    assert dist_util.tied_embeddings(tied, []) == [tied.embed, tied.head]
    assert dist_util.tied_embeddings(tied, [tied.body]) == [tied.embed, tied.head]
    assert dist_util.tied_embeddings(tied, [tied.embed]) is None  # the user's own unit: left as named
    assert dist_util.tied_embeddings(TiedLM(tied=False), []) is None
    assert dist_util.tied_embeddings(Blocks(), []) is None  # no get_input_embeddings


def test_tied_embedding_rows_are_added_into_the_output_layers_gradient():
    """The input embedding's rows go into the output layer's gradient of the matrix once autograd has
    put it there (the values of autograd's own sum, padding rows left out); an embedding whose gradient
    is the only one gets autograd's dense gradient."""
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 2, 7, 0]])
    plain, rows = TiedLM(), TiedLM()
    plain.embed.padding_idx = rows.embed.padding_idx = 0
    rows.load_state_dict(plain.state_dict())
    dist_util._free_after_output_backward(rows.head)
    assert dist_util._EmbeddingRows.applies(rows.embed)
    hooked = dist_util._EmbeddingRows(rows.embed, rows.head)
    for model in (plain, rows):
        model.head(model.body(model.embed(ids))).logsumexp(-1).sum().backward()
    assert hooked.output_done and hooked.pending == []  # the rows went through add_rows
    assert torch.allclose(rows.embed.weight.grad, plain.embed.weight.grad, atol=1e-6)
    for model in (plain, rows):
        model.embed.weight.grad = None
        model.embed(ids).pow(2).sum().backward()  # no output layer in this backward
    assert not hooked.output_done and torch.equal(rows.embed.weight.grad, plain.embed.weight.grad)
    assert not dist_util._EmbeddingRows.applies(nn.Embedding(4, 2, max_norm=1.0))


def test_fsdp_on_gloo_reduces_the_tied_gradient_in_the_rows_hook(tmp_path, monkeypatch):
    """Under FSDP on gloo the tied matrix's complete gradient is reduce-scattered by the rows' hook (so
    FSDP has none to copy into a buffer of its size); the sharded gradients, accumulated over two
    backwards, are the plain model's. One process: a world of 1 runs the same code."""
    import torch.distributed as dist

    calls, real = [], dist_util._reduce_scatter_tied
    monkeypatch.setattr(dist_util, "_reduce_scatter_tied", lambda e, w: (calls.append(w.grad), real(e, w)))
    torch.manual_seed(0)
    ids = torch.tensor([1, 2, 2, 7, 3])  # 1-d: the output layer returns no view (FSDP warns of one)
    plain, model = TiedLM(), TiedLM()
    model.load_state_dict(plain.state_dict())
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        dist_util.shard(model, [model.body], {})
        for m in (plain, model):
            for _ in range(2):
                m(ids).logsumexp(-1).sum().backward()
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    finally:
        dist.destroy_process_group()
    assert len(calls) == 2 and all(g is not None and g.shape == (10, 4) for g in calls)
    for name, p in plain.named_parameters():
        assert torch.allclose(grads[name], p.grad, atol=1e-6), name


def test_skeleton_takes_a_gathered_state_and_ties_again():
    torch.manual_seed(0)
    model = Blocks()
    shell = dist_util.skeleton(model)
    assert all(p.is_meta for p in shell.parameters()) and not any(b.is_meta for b in shell.buffers())
    state = {k: v.clone() for k, v in model.state_dict().items()}  # a gather gives separate tensors
    out = dist_util.materialize(shell, state)
    assert out.head.weight is out.embed.weight
    ids = torch.arange(5).unsqueeze(0)
    assert torch.equal(out(ids), model(ids))


def test_checkpoint_index_is_read_without_running_code(tmp_path):
    """DCP pickles its index; a checkpoint folder whose index asks for anything but DCP's metadata
    classes is refused before it is unpickled further."""
    ckpt_util.save(tmp_path, {"model": {"w": torch.ones(3)}}, {"fingerprint": {}, "position": {}}, step=1)
    folder = ckpt_util.latest_checkpoint(tmp_path)
    assert folder.name == "step-00000001" and (folder / "trainer.pt").is_file()
    into = {"model": {"w": torch.zeros(3)}}
    ckpt_util.load_tensors(folder, into)
    assert torch.equal(into["model"]["w"], torch.ones(3))

    class Boom:
        def __reduce__(self):
            return (print, ("this ran",))

    (folder / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(UsageError, match="do not fit this run|not DCP's index"):
        ckpt_util.load_tensors(folder, {"model": {"w": torch.zeros(3)}})


def test_a_run_never_writes_over_a_checkpoint_it_does_not_resume(tmp_path):
    ckpt_util.save(tmp_path, {"w": torch.ones(1)}, {"fingerprint": {}}, step=4)
    assert_refused(
        ckpt_util.refuse_existing, tmp_path, match=["already holds a checkpoint (step-00000004)", "--resume"]
    )
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "checkpoint.pt").write_bytes(b"")
    assert_refused(ckpt_util.latest_checkpoint, tmp_path / "old", match="earlier ptopt")


def test_launch_exit_codes_ctrl_c_and_a_rank_stopped_after_another_failed(monkeypatch, tmp_path, capsys):
    """``--nproc``: Ctrl-C (or a kill) of the launcher is exit 128 + N, not an internal error; a rank
    the launcher stopped (negative exit code) after another exited with 2 does not turn bad input into 3."""
    import logging
    import signal
    import types

    import torch.distributed.launcher.api as launcher
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from ptopt.cli import launch

    def interrupted(config, entry):
        def run(*args):
            raise SignalException("Process 1 got signal: 2", sigval=signal.SIGINT)

        return run

    monkeypatch.setattr(launcher, "elastic_launch", interrupted)
    assert launch.launch(2, ["distill"]) == 130
    # nor torch's "Received 2 death signal, shutting down workers" warning on the terminal
    assert (
        logging.getLogger("torch.distributed.elastic.agent.server.api").getEffectiveLevel() > logging.WARNING
    )
    failure = types.SimpleNamespace
    stopped = types.SimpleNamespace(failures={0: failure(exitcode=-15), 1: failure(exitcode=2)})
    assert launch._report(stopped, str(tmp_path)) == 2
    # rank 0 was stopped before it could say why: rank 1's line is shown (the review: it was lost)
    assert "process 1 of the run failed" in capsys.readouterr().err
    both = types.SimpleNamespace(failures={0: failure(exitcode=2), 1: failure(exitcode=2)})
    assert launch._report(both, str(tmp_path)) == 2
    assert capsys.readouterr().err == ""  # rank 0 exited by itself: it said the error
    alone = types.SimpleNamespace(failures={1: failure(exitcode=2)})
    assert launch._report(alone, str(tmp_path)) == 2
    assert "process 1 of the run failed" in capsys.readouterr().err
