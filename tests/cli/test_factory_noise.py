"""A factory of the user's that calls transformers' from_pretrained printed its tqdm bar through the
CLI ('Loading weights: 100%|####| 41/41'): ptopt reports progress itself, so the CLI turns the bars off."""

from __future__ import annotations

FACTORY = """
from transformers import BertForSequenceClassification

def bert():
    return BertForSequenceClassification.from_pretrained(r"{folder}").eval()
"""


def test_a_factorys_from_pretrained_prints_no_tqdm_bar(run_ptopt, tmp_path, monkeypatch):
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    config = tf.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, num_labels=3)  # fmt: skip
    tf.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    (tmp_path / "encfac.py").write_text(FACTORY.format(folder=tmp_path / "bert"))
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    out = run_ptopt("inspect", "encfac:bert", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "input_ids" in out.stdout
    assert "Loading weights" not in out.stderr and "it/s]" not in out.stderr, out.stderr
