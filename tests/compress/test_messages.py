"""Every suggestion an error makes is a command that works: each test pastes the suggestion and runs it."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import assert_refused


def test_prune_without_a_shape_names_options_prune_has(cli, tmp_path):
    ref = "tests.compress.prune_models:gru_classifier"
    args = ["prune", ref, "--method", "structured", "--amount", "0.5", "-o", str(tmp_path / "g.pt")]
    message = assert_refused(cli, *args, where=tmp_path, match=("--input-shape", "--eval-data"))
    assert "--data " not in message and "--data or" not in message
    # the suggestion with this model's shape (8 steps of 8 features)
    code, stdout, err = cli(*args, "--input-shape", "1x8x8")
    assert code == 0, err
    # the GRU runs first: head.0 is not "the first layer", and it is pruned
    assert "head.0 is the first layer" not in stdout and "32 → 16" in stdout


def test_structured_pruning_names_every_kept_group_at_once(cli, tmp_path):
    ref = "tests.compress.prune_models:rolled_stack"
    args = ["prune", ref, "--method", "structured", "--amount", "0.5", "-o", str(tmp_path / "r.pt")]
    code, stdout, err = cli(*args)
    assert code == 0, err
    warning = next(line for line in err.splitlines() if "kept the output channels" in line)
    assert "3 layer group(s)" in warning and "'channel_shuffle'" in warning
    assert all(f"blocks.{i}.expand" in warning for i in range(3))
    assert "conv             │ 16 → 8" in stdout  # the rest is pruned


def test_torchao_and_pytree_noise_is_silenced(run_ptopt, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torchao")
    out = run_ptopt(
        "quantize", "tests.compress.hf_models:gpt2", "--mode", "dynamic",
        "--calib-data", "tests.compress.hf_models:gpt2_tokens", "-o", tmp_path / "g.pt",
        "--no-progress",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for noise in (
        "Failed to load",
        "_C_mxfp8",
        "_pytree.py",
        "register_constant",
        "Skipping import of cpp",
        "loss_type",
    ):
        assert noise not in out.stderr + out.stdout, noise
    assert "wrote " in out.stdout


def test_the_torchao_notices_would_be_printed_without_the_boundary(tmp_path):
    """The test above can fail: torchao does print them when nothing quiets it."""
    pytest.importorskip("torchao")
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TORCHAO_FORCE_SKIP_LOADING_SO_FILES"}
    code = "import torchao"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert "Failed to load" in out.stderr or "_pytree.py" in out.stderr


def test_dynamic_int8_of_a_cnn_warns_it_is_nearly_all_fp32(cli, tmp_path):
    """Dynamic int8 of a CNN touches only its Linear head: written, but said loudly (issue 21)."""
    code, out, err = cli("quantize", "zoo:resnet", "--mode", "dynamic", "-o", tmp_path / "m.pt")
    assert code == 0, err
    assert "warning: only 0.4% of the parameters are int8" in err and "use --mode static" in err
    data = "builtin:digits-seq:test"  # the zoo's LSTM, untrained: the warning is about parameters
    code, out, err = cli(
        "quantize",
        "ptopt.models.lstm:lstm",
        "--mode",
        "dynamic",
        "--eval-data",
        data,
        "-o",
        tmp_path / "l.pt",
    )
    assert code == 0, err
    assert "warning: only" not in err
