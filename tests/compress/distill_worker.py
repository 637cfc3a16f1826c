"""Run by ``test_distill_processes.py`` under torchrun (2 gloo processes): every way of distilling
across processes on the tiny models, each rank calling what a user's command calls. Rank 0 writes
what it got as JSON files beside the outputs; the test compares them with one-process runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from ptopt.cli.main import main as ptopt_main
from ptopt.compress import distributed as dist_util
from ptopt.compress.distill import distill
from ptopt.compress.quantize import quantize
from ptopt.compress.trainer import TrainConfig


class Killed(Exception):
    pass


def _kill_at_epoch_1(epoch, model):
    if epoch == 1:
        raise Killed


def lm_config(strategy: str) -> TrainConfig:
    return TrainConfig(epochs=2, batch_size=8, lr=3e-3, device="cpu", strategy=strategy, checkpoint_every=3)


def run(root: Path) -> None:
    # FSDP's gradient reduce-scatter on gloo runs piece by piece: pieces of 64 elements here, so that
    # every unit's takes several and the loss parity below covers the pieces' bookkeeping
    dist_util.REDUCE_SCATTER_CHUNK = 64
    teacher, student, data = f"hf:{root / 'teacher'}", f"hf:{root / 'student'}", root / "train.pt"
    common = dict(seq_len=16, progress=False, temperature=2.0, alpha=0.5)
    res = distill(teacher, student, data, root / "ddp", train_config=lm_config("ddp"), **common)
    _dump(res, root / "ddp.json")
    try:  # killed after its first epoch: each rank has written its shard of the step-4 checkpoint
        distill(teacher, student, data, train_config=lm_config("fsdp"), checkpoint_dir=root / "ck",
                epoch_hooks=[_kill_at_epoch_1], **common)  # fmt: skip
    except Killed:
        pass
    cli = ["distill", "--teacher", teacher, "--student", student, "--train-data", str(data), "--seq-len", "16",
           "--epochs", "2", "--batch-size", "8", "--lr", "0.003", "--device", "cpu", "--checkpoint-every", "3",
           "--temperature", "2", "--strategy", "fsdp", "--shard-module", "model.layers.*", "--no-progress",
           "--eval-data", str(root / "eval.txt"), "--log-dir", str(root / "logs"), "-o", str(root / "fsdp")]  # fmt: skip
    try:
        ptopt_main(cli)
    except SystemExit as e:
        assert e.code == 0, e.code
    res = distill("tests.helpers:tiny_cnn", "tests.compress.distill_helpers:tiny_student", root / "digits.pt",
                  root / "cnn.pt", eval_data=root / "digits.pt", epochs=1, batch_size=16, device="cpu",
                  strategy="fsdp", progress=False, checkpoint_dir=root / "cnn_ck")  # fmt: skip
    _dump(res, root / "cnn.json")
    res = distill(teacher, teacher, data, root / "qat", qat="8da8w", alpha=1.0, seq_len=16, progress=False,
                  train_config=TrainConfig(epochs=1, batch_size=8, lr=1e-3, device="cpu", strategy="fsdp"))  # fmt: skip
    _dump(res, root / "qat.json")
    res = quantize("tests.helpers:tiny_cnn", "qat", root / "cnn.int8.pt", train_data=root / "digits.pt",
                   epochs=1, batch_size=16, progress=False)  # fmt: skip
    _dump(res, root / "cnn_qat.json")
    _mid_epoch(root)


def mid_epoch_config(strategy: str) -> TrainConfig:
    return TrainConfig(epochs=1, batch_size=16, device="cpu", strategy=strategy, checkpoint_every=2)


def _mid_epoch(root: Path) -> None:
    """DDP killed inside its epoch after the step-2 checkpoint, resumed: its epoch's loss and accuracy
    against the unbroken run's; the checkpoint is kept (mid_ck1) for a one-process resume."""
    import shutil

    from ptopt.compress.trainer import cross_entropy_loss, train
    from ptopt.core.data import load_data
    from tests.compress.distill_helpers import plain_mlp

    data, cfg = load_data(root / "digits.pt"), mid_epoch_config("ddp")
    whole = train(plain_mlp(), data, cfg, progress=False)
    calls = 0

    def killed_at_call_4(model, batch):
        nonlocal calls
        calls += 1
        if calls == 4:  # batch 4 of 4: the last checkpoint is step 2
            raise Killed
        return cross_entropy_loss(model, batch)

    try:
        train(
            plain_mlp(), data, cfg, loss_fn=killed_at_call_4, progress=False, checkpoint_dir=root / "mid_ck"
        )
    except Killed:
        pass
    if dist.get_rank() == 0:
        shutil.copytree(root / "mid_ck", root / "mid_ck1")
    dist.barrier()
    resumed = train(plain_mlp(), data, cfg, progress=False, checkpoint_dir=root / "mid_ck", resume=True)
    if dist.get_rank() == 0:
        record = {
            "whole": whole.history,
            "resumed": resumed.history,
            "resumed_step": resumed.resumed_from_step,
        }
        (root / "mid.json").write_text(json.dumps(record))


def _dump(res, path: Path) -> None:
    if res is not None:
        path.write_text(
            json.dumps({"extra": res.extra, "metrics": res.metrics, "config": res.config}, default=str)
        )


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        run(Path(sys.argv[1]))
    finally:
        dist.destroy_process_group()
