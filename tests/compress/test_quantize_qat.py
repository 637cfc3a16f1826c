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
        "--no-progress",
        "-o",
        out,
    )
    assert code == 0, stderr
    assert "QAT: 2 epoch(s)" in stdout
    art = Artifact.load(out)
    assert art.config["type"] == "quantize-qat" and art.config["train_data"] == str(tmp_path / "train.pt")
    tr = art.extra["training"]
    assert [h["epoch"] for h in tr["history"]] == [1, 2] and "eval_accuracy" in tr["history"][-1]
    # 2 epochs of 10 steps: BatchNorm frozen after half of them, observers after three quarters
    assert tr["bn_frozen_at_step"] == 10 and tr["observers_frozen_at_step"] == 15
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
