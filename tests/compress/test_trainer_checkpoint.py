"""The shared trainer's additions: checkpoints and exact resume (after an epoch or inside one), mixed
precision, logs. Several processes: ``test_distill_processes.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ptopt.compress.checkpoint import latest_checkpoint
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
    cfg = TrainConfig(epochs=2, batch_size=16, lr=3e-3, grad_accum_steps=2, seed=3)
    whole = train(factory(), train_ds, cfg, eval_data=eval_ds, progress=False, checkpoint_dir=tmp_path / "a")

    with pytest.raises(Killed):
        train(
            factory(),
            train_ds,
            cfg,
            eval_data=eval_ds,
            progress=False,
            checkpoint_dir=tmp_path / "b",
            epoch_hooks=[_kill_at(1)],
        )
    ckpt = torch.load(latest_checkpoint(tmp_path / "b") / "trainer.pt", weights_only=True)
    assert ckpt["position"] == {"epoch": 1, "batch": 0, "step": 3}
    resumed = train(
        factory(),
        train_ds,
        cfg,
        eval_data=eval_ds,
        progress=False,
        checkpoint_dir=tmp_path / "b",
        resume=True,
    )
    assert resumed.resumed_from_epoch == 1
    _state_equal(whole.model.state_dict(), resumed.model.state_dict())
    measured = ("samples_per_s", "peak_rss_mb")  # of the process, not of the run
    assert [{k: v for k, v in r.items() if k not in measured} for r in resumed.history] == [
        {k: v for k, v in r.items() if k not in measured} for r in whole.history
    ]
    assert resumed.step_losses == whole.step_losses and len(whole.step_losses) == 6
    assert (resumed.best_epoch, resumed.best_accuracy) == (whole.best_epoch, whole.best_accuracy)


def test_resume_inside_an_epoch_from_a_step_checkpoint(tmp_path, data):
    """``checkpoint_every``: a run killed in the middle of an epoch resumes at the batch after its last
    step checkpoint and ends with the uninterrupted run's weights, step losses and history."""
    from ptopt.compress.trainer import cross_entropy_loss

    cfg = TrainConfig(epochs=2, batch_size=16, lr=3e-3, seed=1, checkpoint_every=2)
    whole = train(dropout_mlp(), data[0], cfg, progress=False, checkpoint_dir=tmp_path / "a")
    calls = 0

    def killed_at_call_10(model, batch):
        nonlocal calls
        calls += 1
        if calls == 10:  # epoch 2, batch 4: the last checkpoint is step 8 (epoch 2, batch 2)
            raise Killed
        return cross_entropy_loss(model, batch)

    with pytest.raises(Killed):
        train(
            dropout_mlp(),
            data[0],
            cfg,
            loss_fn=killed_at_call_10,
            progress=False,
            checkpoint_dir=tmp_path / "b",
        )
    assert latest_checkpoint(tmp_path / "b").name == "step-00000008"
    (tmp_path / "b" / ".tmp-step-00000009").mkdir()  # a writer killed mid-write: cleared by the next save
    resumed = train(dropout_mlp(), data[0], cfg, progress=False, checkpoint_dir=tmp_path / "b", resume=True)
    assert not list((tmp_path / "b").glob(".tmp-*"))
    assert (resumed.resumed_from_epoch, resumed.resumed_from_step) == (1, 8)
    _state_equal(whole.model.state_dict(), resumed.model.state_dict())
    assert resumed.step_losses == whole.step_losses
    assert resumed.history[-1]["loss"] == whole.history[-1]["loss"]  # the epoch's sums crossed the kill


def test_resume_without_checkpoint_starts_from_scratch(tmp_path, data, capsys):
    cfg = TrainConfig(epochs=1, batch_size=32)
    r = train(tiny_cnn(), data[0], cfg, progress=False, checkpoint_dir=tmp_path / "ck", resume=True)
    assert r.resumed_from_epoch is None and (tmp_path / "ck" / "step-00000003" / "trainer.pt").is_file()
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


def test_resumed_run_keeps_the_checkpoints_last_step_in_tensorboard(tmp_path, data):
    """The resumed run purges the killed run's events after the checkpoint's step, not at it: every
    step's loss is in the logs once (step 3, the checkpoint's, was purged)."""
    from tensorboard.backend.event_processing import event_accumulator

    cfg = TrainConfig(epochs=2, batch_size=32)
    common = dict(progress=False, checkpoint_dir=tmp_path / "ck", log_dir=tmp_path / "logs")
    with pytest.raises(Killed):
        train(tiny_cnn(), data[0], cfg, epoch_hooks=[_kill_at(1)], **common)
    train(tiny_cnn(), data[0], cfg, resume=True, **common)
    logs = event_accumulator.EventAccumulator(str(tmp_path / "logs"))
    logs.Reload()
    assert [e.step for e in logs.Scalars("train/loss_step")] == [1, 2, 3, 4, 5, 6]
    # epoch scalars at the step each epoch ended (epoch/index says which epoch)
    assert [e.step for e in logs.Scalars("epoch/loss")] == [3, 6]
    assert [e.value for e in logs.Scalars("epoch/index")] == [1, 2]


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


def test_a_checkpoint_index_that_would_run_code_is_refused():
    """DCP's ``.metadata`` is a pickle: only DCP's own classes (and a few torch/pathlib types) load; a
    dotted name reached through an admitted module (``filesystem`` + ``os.system``) or a function does
    not, so ``--resume`` of a folder a user was handed runs nothing."""
    import io
    import pickle

    from ptopt.compress.checkpoint import _MetadataUnpickler
    from ptopt.core.errors import UsageError

    def crafted(module: str, name: str) -> bytes:  # protocol 4: GLOBAL by module and (dotted) name
        return b"\x80\x04" + b"c" + module.encode() + b"\n" + name.encode() + b"\n" + b"(S'true'\ntR."

    for module, name in [
        ("torch.distributed.checkpoint.filesystem", "os.system"),
        ("torch.distributed.checkpoint.filesystem", "cast"),
        ("os", "system"),
    ]:
        with pytest.raises(UsageError, match="refused to load"):
            _MetadataUnpickler(io.BytesIO(crafted(module, name))).load()
    from torch.distributed.checkpoint.metadata import Metadata

    ok = pickle.dumps(Metadata(state_dict_metadata={}), protocol=4)
    assert isinstance(_MetadataUnpickler(io.BytesIO(ok)).load(), Metadata)


def test_tensorboard_logs_the_learning_rate_each_step_used(tmp_path, data):
    """Step 1 of a 2-step warmup runs at half the peak rate; the log said the peak (the rate after the
    step: step N's entry was step N+1's rate, and the last step read 0)."""
    from tensorboard.backend.event_processing import event_accumulator

    from ptopt.compress.trainer import warmup_cosine

    cfg = TrainConfig(epochs=2, batch_size=32, lr=1e-2, warmup_fraction=0.4)  # 6 steps, 2 warming up
    train(tiny_cnn(), data[0], cfg, progress=False, log_dir=tmp_path / "logs")
    logs = event_accumulator.EventAccumulator(str(tmp_path / "logs"))
    logs.Reload()
    factor = warmup_cosine(6, 2)
    logged = [(e.step, e.value) for e in logs.Scalars("train/lr")]
    assert logged == [(s + 1, pytest.approx(1e-2 * factor(s))) for s in range(6)]
    assert logged[0][1] == pytest.approx(5e-3) and logged[-1][1] > 0


def test_a_longer_max_steps_resumes_inside_the_epoch_the_shorter_one_ended(tmp_path, data):
    """--max-steps 3 ends the first epoch (6 batches) at batch 3; resumed with max_steps 5, steps 4-5
    train on its batches 4-5, as an unbroken 5-step run does (they took the next epoch's first batches,
    and the rest of the first epoch's data was never seen); one record for the epoch, its sums whole."""
    from ptopt.compress.trainer import cross_entropy_loss

    def recording(seen):
        def loss(model, batch):
            seen.append(float(batch.x.sum()))
            return cross_entropy_loss(model, batch)

        return loss

    cfg = TrainConfig(epochs=2, batch_size=16, max_steps=5)
    whole_seen, resumed_seen = [], []
    train(tiny_cnn(), data[0], cfg, loss_fn=recording(whole_seen), progress=False)
    common = dict(progress=False, checkpoint_dir=tmp_path / "ck", log_dir=tmp_path / "logs")
    train(tiny_cnn(), data[0], TrainConfig(epochs=2, batch_size=16, max_steps=3), **common)
    resumed = train(tiny_cnn(), data[0], cfg, loss_fn=recording(resumed_seen), resume=True, **common)
    assert resumed_seen == whole_seen[3:]
    from tensorboard.backend.event_processing import event_accumulator

    logs = event_accumulator.EventAccumulator(str(tmp_path / "logs"))
    logs.Reload()  # the cut epoch at step 3, then as the resume ended it at step 5 (it was epoch 1 twice)
    assert [(e.step, e.value) for e in logs.Scalars("epoch/index")] == [(3, 1.0), (5, 1.0)]
    assert [e.step for e in logs.Scalars("epoch/loss")] == [3, 5]
    assert [r["epoch"] for r in resumed.history] == [1] and resumed.history[0]["steps"] == 5
    assert len(resumed.step_losses) == 5  # the epoch's loss: all 5 batches of 16 (3 carried over)
    assert resumed.history[0]["loss"] == pytest.approx(sum(resumed.step_losses) / 5, rel=1e-6)
    done = train(tiny_cnn(), data[0], cfg, resume=True, **common)  # the run reached 5: nothing trained
    assert [r["epoch"] for r in done.history] == [1] and done.resumed_from_step == 5


def test_a_refusal_says_what_a_differing_digest_stands_for():
    from ptopt.compress.checkpoint import describe_differences

    saved = {"train_data": {"samples": 3, "sha": "x"}, "eval_data": {"samples": 3, "sha": "e"}}
    now = {"train_data": {"samples": 3, "sha": "y"}, "eval_data": None}
    assert describe_differences(saved, now) == [
        "eval_data.samples: checkpoint 3, now '(unset)'",
        "eval_data.sha: checkpoint 'e', now '(unset)'",  # gone, not 'other' data: the values say it
        "train_data.sha: other training data (its values differ) (checkpoint 'x', now 'y')",
    ]
