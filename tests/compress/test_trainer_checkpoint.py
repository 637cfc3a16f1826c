"""The shared trainer's additions: checkpoints and exact resume, mixed precision, logs, data-parallel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptopt.compress.trainer import TrainConfig, train
from ptopt.core.data import load_data
from ptopt.core.errors import UsageError
from tests.compress.distill_helpers import dropout_mlp
from tests.helpers import tiny_cnn

REPO = Path(__file__).resolve().parents[2]


class Killed(Exception):
    pass


def _kill_at(epoch_to_kill: int):
    def hook(epoch, model):
        if epoch == epoch_to_kill:
            raise Killed(f"killed before epoch {epoch + 1}")

    return hook


@pytest.fixture(scope="module")
def data():
    return load_data("builtin:digits:train").take(96), load_data("builtin:digits:test").take(48)


def _state_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


@pytest.mark.parametrize("factory", [tiny_cnn, dropout_mlp], ids=["batchnorm", "dropout"])
def test_resumed_run_ends_with_identical_weights(tmp_path, data, factory):
    train_ds, eval_ds = data
    cfg = TrainConfig(epochs=3, batch_size=16, lr=3e-3, grad_accum_steps=2, seed=3)
    whole = train(factory(), train_ds, cfg, eval_data=eval_ds, progress=False, checkpoint_dir=tmp_path / "a")

    with pytest.raises(Killed):
        train(
            factory(),
            train_ds,
            cfg,
            eval_data=eval_ds,
            progress=False,
            checkpoint_dir=tmp_path / "b",
            epoch_hooks=[_kill_at(2)],
        )
    ckpt = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 2
    resumed = train(
        factory(),
        train_ds,
        cfg,
        eval_data=eval_ds,
        progress=False,
        checkpoint_dir=tmp_path / "b",
        resume=True,
    )
    assert resumed.resumed_from_epoch == 2
    _state_equal(whole.model.state_dict(), resumed.model.state_dict())
    assert resumed.history == [
        {**r, "samples_per_s": resumed.history[i]["samples_per_s"]} for i, r in enumerate(whole.history)
    ]
    assert (resumed.best_epoch, resumed.best_accuracy) == (whole.best_epoch, whole.best_accuracy)


def test_resume_without_checkpoint_starts_from_scratch(tmp_path, data, capsys):
    cfg = TrainConfig(epochs=1, batch_size=32)
    r = train(tiny_cnn(), data[0], cfg, progress=False, checkpoint_dir=tmp_path / "ck", resume=True)
    assert r.resumed_from_epoch is None and (tmp_path / "ck" / "checkpoint.pt").is_file()
    assert "starting from scratch" in capsys.readouterr().err


def test_checkpoint_of_another_configuration_is_refused(tmp_path, data):
    train(tiny_cnn(), data[0], TrainConfig(epochs=2, batch_size=32), progress=False, checkpoint_dir=tmp_path)
    with pytest.raises(UsageError, match=r"another configuration.*lr: checkpoint 0.001, now 0.002"):
        train(
            tiny_cnn(),
            data[0],
            TrainConfig(epochs=2, batch_size=32, lr=2e-3),
            progress=False,
            checkpoint_dir=tmp_path,
            resume=True,
        )
    with pytest.raises(UsageError, match=r"train_data.samples: checkpoint 96, now 64"):
        train(
            tiny_cnn(),
            data[0].take(64),
            TrainConfig(epochs=2, batch_size=32),
            progress=False,
            checkpoint_dir=tmp_path,
            resume=True,
        )


def test_resume_needs_checkpoint_dir(data):
    with pytest.raises(UsageError, match="checkpoint"):
        train(tiny_cnn(), data[0], TrainConfig(epochs=1), progress=False, resume=True)


def test_bf16_autocast_on_cpu(data):
    r = train(
        tiny_cnn(),
        data[0],
        TrainConfig(epochs=2, batch_size=16, precision="bf16"),
        eval_data=data[1],
        progress=False,
    )
    assert all(p.dtype == torch.float32 for p in r.model.parameters())  # weights stay fp32
    assert r.history[-1]["loss"] < r.history[0]["loss"] and r.best_accuracy is not None


def test_fp16_needs_cuda(data):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: fp16 is allowed")
    with pytest.raises(UsageError, match="fp16 training needs CUDA"):
        train(tiny_cnn(), data[0], TrainConfig(epochs=1, precision="fp16"), progress=False)
    with pytest.raises(UsageError, match="precision"):
        TrainConfig(precision="int8")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cuda_mixed_precision_returns_model_on_cpu(data, precision):
    r = train(
        tiny_cnn(),
        data[0],
        TrainConfig(epochs=1, batch_size=16, precision=precision, device="cuda"),
        progress=False,
    )
    assert next(r.model.parameters()).device.type == "cpu"


def test_tensorboard_and_jsonl_logs(tmp_path, data):
    train(
        tiny_cnn(),
        data[0],
        TrainConfig(epochs=2, batch_size=32),
        eval_data=data[1],
        progress=False,
        log_dir=tmp_path / "logs",
    )
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["epoch"] for r in records] == [1, 2] and "eval_accuracy" in records[0]
    assert list((tmp_path / "logs").glob("events.out.tfevents.*"))


def test_old_call_signature_still_works(data):
    """train() positionally (model, data, config, eval data, loss, hooks, progress) with a TrainConfig
    of the original fields."""
    model = tiny_cnn()
    r = train(
        model,
        data[0],
        TrainConfig(3 - 2, 32, 1e-3, 0.01, 0.05, 1.0, 1, 0, True, 256),
        data[1],
        None,
        (),
        False,
    )
    assert r.model is model and len(r.history) == 1 and r.world_size == 1


def _torchrun() -> list[str]:
    exe = Path(sys.executable).parent / "ptopt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return cmd + (["--no-python", str(exe)] if exe.exists() else ["-m", "ptopt.cli.main"])


@pytest.mark.slow
def test_data_parallel_two_cpu_processes(tmp_path, digits_small):
    """torchrun --nproc_per_node 2 --no-python ptopt distill ...: gloo, DDP, only rank 0 writes."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    load_data("builtin:digits:train").take(64).save(tmp_path / "train.pt")
    load_data("builtin:digits:test").take(32).save(tmp_path / "eval.pt")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
    )
    args = [
        "distill",
        "--teacher",
        "tests.helpers:tiny_cnn",
        "--student",
        "tests.compress.distill_helpers:tiny_student",
        "--train-data",
        tmp_path / "train.pt",
        "--eval-data",
        tmp_path / "eval.pt",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--device",
        "cpu",
        "--no-progress",
        "--checkpoint-dir",
        tmp_path / "ck",
        "--log-dir",
        tmp_path / "logs",
        "-o",
        tmp_path / "out" / "student.pt",
    ]
    proc = subprocess.run(
        _torchrun() + [str(a) for a in args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("student:") == 1  # rank 0 reports, rank 1 stays quiet
    side = json.loads((tmp_path / "out" / "student.pt.ptopt.json").read_text())
    assert side["extra"]["world_size"] == 2 and len(side["extra"]["history"]) == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["student.pt", "student.pt.ptopt.json"]
    ckpt = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)
    assert ckpt["fingerprint"]["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert len((tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()) == 2
    torch.jit.load(str(tmp_path / "out" / "student.pt"))
    shutil.rmtree(tmp_path / "ck")
