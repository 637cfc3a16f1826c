"""The trainer's progress line: throughput with its unit."""

from __future__ import annotations

import torch

from ptopt.compress import trainer
from ptopt.core.data import Batch


def _stats(batch: Batch) -> trainer._EpochStats:
    stats = trainer._EpochStats()
    stats.add(batch, torch.tensor(1.0), None, weight=1.0)
    stats.t0 -= 10.0  # as if the batch took ten seconds
    return stats


def test_a_language_models_rate_is_in_tokens_not_a_rounded_zero():
    """Four windows of 64 tokens in ten seconds read '0/s' (samples, no decimals)."""
    ids = torch.ones(4, 64, dtype=torch.long)
    text = trainer._rate(_stats(Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, None)), 1)
    assert text.endswith(" tokens/s") and 20 <= float(text.split()[0]) <= 26


def test_a_slow_classifiers_rate_keeps_two_digits_and_says_samples():
    text = trainer._rate(_stats(Batch(torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long))), 2)
    assert text.endswith(" samples/s") and 0.7 <= float(text.split()[0]) <= 0.8  # 8 samples over 2 ranks


def test_evaluation_and_checkpoint_writes_are_steps_a_heartbeat_names(monkeypatch, tmp_path):
    """Between epochs the heartbeat repeated the epoch's last batch count ('23/46 batches') while the
    held-out data was scored or a checkpoint written, as if training had stalled."""
    from ptopt.core import progress
    from ptopt.core.data import load_data
    from tests.helpers import tiny_cnn

    titles, real = [], progress.step

    def recording(title, *args, **kwargs):
        titles.append(title)
        return real(title, *args, **kwargs)

    monkeypatch.setattr(progress, "step", recording)
    data = load_data("builtin:digits:train").take(32)
    config = trainer.TrainConfig(epochs=1, batch_size=16)
    trainer.train(tiny_cnn(), data, config, eval_data=data, progress=False, checkpoint_dir=tmp_path / "ck")
    assert f"evaluating epoch 1 on {data.name} (32 samples)" in titles
    assert f"writing checkpoint step-00000002 in {tmp_path / 'ck'}" in titles


def test_a_resumed_epochs_rate_counts_the_carried_samples_once():
    """A mid-epoch checkpoint of 2 processes carries every rank's sums on rank 0: the rate multiplied them
    by the world size again (100 carried + 50 per rank since, over 10 s: 20 samples/s, not 30)."""
    stats = trainer._EpochStats(seen=100, carried=(100, 0))
    stats.t0 -= 10.0
    stats.seen += 50
    assert trainer._rate(stats, 2) == "20 samples/s"


class _Bar:
    def __init__(self) -> None:
        self.described: list[str] = []

    def add_task(self, description: str, total: int, completed: int) -> int:
        return 0

    def update(self, task: int, advance: int, description: str) -> None:
        self.described.append(description)


def test_the_bar_counts_the_epochs_max_steps_lets_the_run_reach():
    """--epochs 4 --max-steps 10 of 46 steps an epoch ended in epoch 1, which the line called 'epoch 1/4'."""
    from types import SimpleNamespace

    config = SimpleNamespace(epochs=4, grad_accum_steps=1)
    for total, said in (
        (10, "epoch 1/1 (--max-steps 10) loss"),
        (184, "epoch 1/4 loss"),
        (60, "epoch 1/2 ("),
    ):
        run = SimpleNamespace(config=config, n_batches=46, steps_per_epoch=46, total_steps=total, step_no=0)
        bar = _Bar()
        trainer._EpochBar(bar, "distill", run).advance(0, _stats(Batch(torch.zeros(4, 3), None)), 1)
        assert bar.described[0].startswith(f"distill {said}"), bar.described
