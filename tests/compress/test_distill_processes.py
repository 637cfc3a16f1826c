"""Distillation across 2 processes (torchrun, gloo on the CPU): DDP and FSDP2 train the same model as
one process does (same seed, global batch and order: the step losses agree within 1e-4 relative), only
rank 0 writes the output, every rank writes its shard of a checkpoint, and a checkpoint written by 2
processes resumes in 1 to where the uninterrupted run ends. One torchrun launch runs every case
(``distill_worker.py``); the one-process references run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptopt.compress.distill import distill
from ptopt.core.data import load_data
from tests.compress.distill_worker import lm_config
from tests.compress.lm_pair import make_pair

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    root = tmp_path_factory.mktemp("procs")
    make_pair(root)
    load_data("builtin:digits:train").take(64).save(root / "digits.pt")
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "tests" / "compress" / "distill_worker.py"), str(root)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root, proc


def _single(root: Path, **kw):
    common = dict(seq_len=16, progress=False, temperature=2.0, alpha=0.5)
    return distill(
        f"hf:{root / 'teacher'}",
        f"hf:{root / 'student'}",
        root / "train.pt",
        train_config=lm_config("none"),
        **common,
        **kw,
    )


def _close(a: list[float], b: list[float], rel: float = 1e-4) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def single(launched):
    return _single(launched[0])


def test_ddp_and_fsdp_losses_are_the_single_process_losses(launched, single):
    root, proc = launched
    ddp = json.loads((root / "ddp.json").read_text())["extra"]
    fsdp = json.loads((root / "fsdp.ptopt.json").read_text())["extra"]
    for run in (ddp, fsdp):
        assert run["world_size"] == 2 and run["steps"] == single.extra["steps"] == 8
        assert _close([run["final_step_loss"]], [single.extra["final_step_loss"]])
        assert _close([r["loss"] for r in run["history"]], [r["loss"] for r in single.extra["history"]])
    assert (ddp["strategy"], fsdp["strategy"]) == ("ddp", "fsdp")
    # FSDP read the teacher's safetensors in shards (the student, a fresh config, was built whole)
    assert fsdp["loaded_in_shards"] == ["teacher"] and ddp["loaded_in_shards"] == []
    assert len(fsdp["history"][-1]["peak_rss_mb"]) == 2 and fsdp["history"][-1]["tokens_per_s"] > 0


def test_only_rank_0_writes_and_reports(launched):
    root, proc = launched
    assert proc.stdout.count("student:") == 1 and "trained on 2 processes (fsdp)" in proc.stdout
    names = sorted(p.name for p in (root / "fsdp").iterdir())
    assert "model.safetensors" in names and "config.json" in names and "tokenizer.json" in names
    side = json.loads((root / "fsdp.ptopt.json").read_text())
    assert side["metrics"]["perplexity"] > 0 and side["config"]["train"]["shard_modules"] == [
        "model.layers.*"
    ]
    assert len((root / "logs" / "metrics.jsonl").read_text().splitlines()) == 2
    cnn = json.loads((root / "cnn.json").read_text())
    assert cnn["metrics"]["eval_accuracy"] is not None and cnn["metrics"]["teacher_eval_accuracy"] is not None
    assert cnn["extra"]["strategy"] == "fsdp" and torch.jit.load(str(root / "cnn.pt"))(
        torch.zeros(2, 1, 8, 8)
    ).shape == (2, 10)


def test_qat_across_processes(launched):
    """An LM's QAT under FSDP (``distill --qat``) and a classifier's under DDP (``quantize --mode qat``)."""
    root, _ = launched
    lm = json.loads((root / "qat.json").read_text())
    assert lm["extra"]["strategy"] == "fsdp" and lm["extra"]["weight_only"]["scheme"] == "8da8w"
    assert (root / "qat" / "quantization.json").is_file() and (root / "qat.ptopt.json").is_file()
    cnn = json.loads((root / "cnn_qat.json").read_text())
    assert cnn["config"]["type"] == "quantize-qat" and (root / "cnn.int8.pt.ptopt.json").is_file()
    assert torch.jit.load(str(root / "cnn.int8.pt"))(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_a_two_process_checkpoint_resumes_in_one_process(launched, single):
    root, _ = launched
    folder = root / "ck" / "step-00000004"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "trainer.pt"} <= {p.name for p in folder.iterdir()}
    resumed = _single(root, checkpoint_dir=root / "ck", resume=True)
    assert resumed.extra["resumed_from_step"] == 4 and resumed.extra["steps"] == 8
    assert _close([resumed.extra["final_step_loss"]], [single.extra["final_step_loss"]])


def test_a_classifier_fsdp_checkpoint_resumes_in_one_process(launched):
    """FSDP runs the teacher per batch, one process caches its logits: the same logits, so the
    checkpoint of the one resumes in the other (it was refused: teacher_logits 'per batch' / 'cached')."""
    root, _ = launched
    resumed = distill("tests.helpers:tiny_cnn", "tests.compress.distill_helpers:tiny_student", root / "digits.pt",
                      eval_data=root / "digits.pt", epochs=2, batch_size=16, device="cpu", progress=False,
                      checkpoint_dir=root / "cnn_ck", resume=True)  # fmt: skip
    assert resumed.extra["resumed_from_step"] == 4 and resumed.extra["steps"] == 8


def test_a_mid_epoch_checkpoint_carries_every_ranks_running_sums(launched):
    """A 2-process run killed inside its epoch and resumed reports the epoch's loss and accuracy of the
    unbroken run, on 2 processes and on 1 (the checkpoint held rank 0's sums alone: the resumed epoch
    counted rank 0's first half twice and rank 1's not at all)."""
    from ptopt.compress.trainer import train
    from tests.compress.distill_helpers import plain_mlp
    from tests.compress.distill_worker import mid_epoch_config

    root, _ = launched
    mid = json.loads((root / "mid.json").read_text())
    whole, resumed = mid["whole"][-1], mid["resumed"][-1]
    assert mid["resumed_step"] == 2 and resumed["steps"] == whole["steps"] == 4
    assert (
        _close([resumed["loss"]], [whole["loss"]], 1e-6)
        and resumed["train_accuracy"] == whole["train_accuracy"]
    )
    one = train(plain_mlp(), load_data(root / "digits.pt"), mid_epoch_config("none"), progress=False,
                checkpoint_dir=root / "mid_ck1", resume=True).history[-1]  # fmt: skip
    assert _close([one["loss"]], [whole["loss"]], 1e-5) and one["train_accuracy"] == whole["train_accuracy"]
