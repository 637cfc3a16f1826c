"""The trainer reads a model's primary output (``core.tensors.primary_output``): a Hugging Face
classifier's ``SequenceClassifierOutput`` is scored and trained on through its ``logits`` (pruning
a BertForSequenceClassification with eval or fine-tune data was an internal error)."""

from __future__ import annotations

import pytest
import torch

import ptopt

MODEL = "tests.compress.hf_models:bert"
DATA = "tests.compress.hf_models:bert_labelled"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_evaluation_and_training_losses_read_the_logits():
    pytest.importorskip("transformers")
    from ptopt.compress.quantize.techniques.qat_fx import distill_loss
    from ptopt.compress.trainer import TrainConfig, cross_entropy_loss, evaluate_accuracy, train
    from ptopt.core.data import load_data
    from tests.compress.hf_models import bert

    model, ds = bert(), load_data(DATA)
    assert evaluate_accuracy(model, ds) == 1.0  # the labels are its own predictions
    batch = ds.first_batch(8)
    for loss_fn in (cross_entropy_loss, distill_loss(bert())):
        loss, logits = loss_fn(model, batch)
        assert loss.dim() == 0 and torch.isfinite(loss) and logits.shape == (8, 3)
    result = train(model, ds, TrainConfig(epochs=1, max_steps=1, batch_size=16), eval_data=ds, progress=False)
    assert result.history[-1]["eval_accuracy"] is not None


def test_prune_a_hf_classifier_with_eval_and_fine_tune_data(cli, tmp_path):
    pytest.importorskip("transformers")
    args = ("prune", MODEL, "--method", "structured", "--amount", "0.3", "--eval-data", DATA)
    code, out, err = cli(*args, "--fine-tune-data", DATA, "--epochs", "1", "-o", tmp_path / "b.pt")
    assert code == 0, err
    assert "internal error" not in err and "accuracy:   100.00% →" in out


def test_prune_api_takes_a_hf_classifier_with_in_memory_labels():
    pytest.importorskip("transformers")
    from tests.compress.hf_models import bert, bert_labelled

    d = bert_labelled()
    result = ptopt.prune(bert(), "structured", 0.3, eval_data=(d["x"], d["y"]), fine_tune_data=d, epochs=1)
    assert result.metrics["accuracy_before"] == 1.0 and result.metrics["accuracy_after"] is not None
