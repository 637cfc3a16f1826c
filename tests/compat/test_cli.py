"""A few cells through the CLI, with ``pkg.module:factory`` references to tests/compat/models.py,
as a user would type them (no --input-shape where the model's config says what it takes)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.compat


def _needs(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[compat]')")


def test_bert_dynamic_int8_without_a_shape(cli, tmp_path):
    """A Hugging Face model needs no --input-shape: its config gives input_ids (int64, its vocab) and the
    attention_mask its forward takes, at any length up to its positions (64)."""
    _needs("transformers")
    code, out, err = cli("quantize", "tests.compat.models:bert", "--mode", "dynamic", "-o", "bert.int8.pt")
    assert code == 0, err
    code, out, err = cli("inspect", "bert.int8.pt")
    assert code == 0, err
    assert "input_ids: [1..64]x[1..64] int64" in out and "attention_mask: [1..64]x[1..64] int64" in out


def test_gpt2_torchscript_with_typed_shapes(cli, tmp_path):
    _needs("transformers")
    code, out, err = cli(
        "export",
        "tests.compat.models:gpt2",
        "--target",
        "torchscript",
        "--min-shape",
        "input_ids=1x8:int64",
        "--opt-shape",
        "input_ids=2x16:int64",
        "--max-shape",
        "input_ids=4x32:int64",
        "-o",
        "gpt2.pt",
    )
    assert code == 0, err
    assert "input_ids: [1..4]x[8..32] int64" in out


def test_bert_structured_pruning_without_a_shape(cli, tmp_path):
    """torch.fx cannot trace BERT: the channel analysis reads torch.export's graph (heads, FFN)."""
    _needs("transformers")
    code, out, err = cli(
        "prune", "tests.compat.models:bert", "--method", "structured", "--amount", "0.3", "-o", "b.pt"
    )
    assert code == 0, err
    assert "64 → 32" in out and "128 → 90" in out  # 2 heads → 1; FFN neurons 128 → 90


def test_gpt2_structured_pruning_through_conv1d(cli, tmp_path):
    """GPT-2's layers are transformers' Conv1D (``addmm`` on a transposed weight, a fused q/k/v split
    by ``split_size``): heads go whole (2 -> 1) and FFN neurons go."""
    _needs("transformers")
    code, out, err = cli(
        "prune", "tests.compat.models:gpt2", "--method", "structured", "--amount", "0.3", "-o", tmp_path / "g.pt"
    )  # fmt: skip
    assert code == 0, err
    assert "192 → 96" in out and "256 → 179" in out  # c_attn: 2 heads of q, k, v -> 1; c_fc


def test_resnet_suggests_a_shape_in_a_fresh_process(run_ptopt, tmp_path):
    """The factory module makes torchvision importable by itself (a subprocess has no conftest)."""
    _needs("torchvision")
    proc = run_ptopt("inspect", "tests.compat.models:resnet18", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "its first layer suggests --input-shape 1x3x224x224" in proc.stdout


def test_lstm_onnx_with_a_dynamic_sequence_length(cli, tmp_path):
    """torch.export fixes an LSTM's length; ptopt exports it with ONNX's LSTM op (TorchScript exporter)."""
    code, out, err = cli(
        "export",
        "tests.compat.models:lstm_classifier",
        "--target",
        "onnx",
        "--min-shape",
        "1x4:int64",
        "--opt-shape",
        "2x16:int64",
        "--max-shape",
        "8x32:int64",
        "-o",
        "lstm.onnx",
    )
    assert code == 0, err
    assert (
        "[1..8]x[4..32] int64" in out
        and "TorchScript exporter" in (tmp_path / "lstm.onnx.ptopt.json").read_text()
    )
