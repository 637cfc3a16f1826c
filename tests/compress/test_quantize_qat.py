"""QAT: fake-quant fine-tuning with the shared trainer, freezing late in training, then int8."""

from __future__ import annotations

from pathlib import Path

from ptopt.core.artifact import Artifact


def test_qat_cli(cli, tmp_path: Path) -> None:
    from ptopt.core.data import load_data

    load_data("builtin:digits:train").take(640).save(tmp_path / "train.pt")
    out = tmp_path / "qat.pt"
    code, stdout, stderr = cli(
        "quantize",
        "tests.helpers:tiny_cnn",
        "--mode",
        "qat",
        "--train-data",
        tmp_path / "train.pt",
        "--eval-data",
        "builtin:digits:test",
        "--epochs",
        "2",
        "--lr",
        "5e-3",
        "--batch-size",
        "64",
        "--max-steps",
        "16",
        "--no-progress",
        "-o",
        out,
    )
    assert code == 0, stderr
    # --max-steps 16 of the 2 epochs' 20 steps: it read "QAT: 2 epoch(s)", as if both ran through
    assert "QAT: 16 optimizer steps of 64 samples (--max-steps, within epoch 2) on 640 samples of" in stdout
    art = Artifact.load(out)
    assert art.config["type"] == "quantize-qat" and art.config["train_data"] == str(tmp_path / "train.pt")
    tr = art.extra["training"]
    assert [h["epoch"] for h in tr["history"]] == [1, 2] and "eval_accuracy" in tr["history"][-1]
    # 2 epochs of 10 steps cut at 16: BatchNorm frozen after half of them, observers after three quarters
    assert tr["max_steps"] == 16 and tr["bn_frozen_at_step"] == 8 and tr["observers_frozen_at_step"] == 12
    assert art.metrics["int8_accuracy"] > 0.3  # an untrained tiny CNN starts learning digits in QAT
    assert art.extra["float_layers"] == {}


def test_qat_without_labels_matches_fp32(tmp_path: Path) -> None:
    from ptopt.compress.quantize import quantize
    from ptopt.core.data import Dataset, load_data

    ds = load_data("builtin:digits:train").take(128)
    art = quantize(
        "tests.helpers:tiny_cnn", "qat", tmp_path / "q.pt", train_data=Dataset(ds.x), progress=False
    )
    assert art.extra["training"]["loss"] == "kl_to_fp32"
    assert art.extra["training"]["observers_frozen_at_step"] == 1  # 2 steps in one epoch


def test_freeze_schedule_within_one_epoch() -> None:
    from ptopt.compress.quantize import QATConfig
    from ptopt.compress.quantize.techniques.qat_fx import FreezeSchedule

    s = FreezeSchedule(QATConfig(epochs=1), steps_per_epoch=10)
    assert (s.bn_step, s.observer_step) == (5, 7)
    s = FreezeSchedule(
        QATConfig(epochs=4, freeze_bn_after=0.5, freeze_observers_after=0.75), steps_per_epoch=10
    )
    assert (s.bn_step, s.observer_step) == (20, 30)


def test_max_steps_bounds_the_freeze_schedule_and_is_checked(cli, tmp_path: Path) -> None:
    from ptopt.compress.quantize import QATConfig, quantize
    from ptopt.compress.quantize.techniques.qat_fx import FreezeSchedule
    from tests.helpers import assert_refused

    s = FreezeSchedule(QATConfig(epochs=2, max_steps=8), steps_per_epoch=10)
    assert (s.bn_step, s.observer_step) == (4, 6)
    s = FreezeSchedule(QATConfig(epochs=1, max_steps=80), steps_per_epoch=10)  # more than the epochs hold
    assert (s.bn_step, s.observer_step) == (5, 7)
    assert_refused(
        cli, "quantize", "tests.helpers:tiny_cnn", "--mode", "qat", "--train-data", "builtin:digits:train",
        "--max-steps", "0", "-o", tmp_path / "r.pt", match="--max-steps must be >= 1", where=tmp_path,
    )  # fmt: skip
    assert_refused(
        quantize, "tests.helpers:tiny_cnn", "qat", tmp_path / "r.pt", train_data="builtin:digits:train",
        max_steps=0, match="--max-steps must be >= 1", where=tmp_path,
    )  # fmt: skip
