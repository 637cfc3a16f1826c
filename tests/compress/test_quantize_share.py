"""What is really int8: the share of layers, parameters and multiply-accumulates (printed and in the
sidecar), static int8 refused when it would leave nearly everything float, and blocks whose own
parameters are quantized by the graph not reported as float."""

from __future__ import annotations

import json
import shlex

from tests.helpers import assert_refused


def test_static_lstm_is_refused_and_the_suggested_mode_works(cli, tmp_path):
    args = ["quantize", "tests.compress.quant_models:tiny_lstm", "--mode", "static"]
    rest = ["--calib-data", "builtin:digits:train", "-o", str(tmp_path / "l.pt")]
    message = assert_refused(
        cli, *args, *rest, where=tmp_path, match=("static int8 would quantize only", "Use --mode dynamic")
    )
    assert "lstm" in message and "gru" in message
    # the suggestion, followed: the same command with --mode dynamic
    code, stdout, err = cli(*shlex.split(" ".join(args).replace("--mode static", "--mode dynamic")), *rest)
    assert code == 0, err
    side = json.loads((tmp_path / "l.pt.ptopt.json").read_text())
    share = side["extra"]["int8_share"]
    assert share["layers"] == share["of_layers"] == 3 and share["parameters"] == 1.0
    assert "int8: 3 of 3 layers with weights, 100.0% of their parameters" in stdout


def test_a_block_whose_own_parameter_the_graph_quantizes_is_not_listed_float(cli, tmp_path):
    out = tmp_path / "s.pt"
    code, stdout, err = cli(
        "quantize", "tests.compress.quant_models:scaled_net", "--mode", "static",
        "--calib-data", "builtin:digits:train", "-o", out,
    )  # fmt: skip
    assert code == 0, err
    side = json.loads((tmp_path / "s.pt.ptopt.json").read_text())
    assert side["extra"]["float_layers"] == {}  # blocks.N.layer_scale enters the graph quantized
    assert side["extra"]["int8_share"]["macs"] == 1.0 and "every layer with weights is int8" in stdout


def test_share_counts_what_stays_float():
    import torch

    import ptopt
    from tests.compress.quant_models import scaled_net

    x = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    res = ptopt.quantize(scaled_net(), "static", calib_data=x, exclude=["fc"])
    share = res.extra["int8_share"]
    assert share["layers"] == 5 and share["of_layers"] == 6 and 0.8 < share["parameters"] < 1.0
    assert res.extra["float_layers"]["fc"].startswith("excluded")


def test_a_weight_normed_layer_is_one_layer_and_its_float_reason_is_true(cli, tmp_path):
    """wav2vec2's positional Conv1d is weight-normalised: its ``parametrizations.weight`` (a
    ParametrizationList) was listed as a float layer of its own and counted twice; PT2E's reason said the
    quantizer makes convolutions int8 while a Conv1d stayed float."""
    code, stdout, err = cli(
        "quantize", "tests.compress.quant_models:weight_normed", "--mode", "static", "--engine", "pt2e",
        "--no-compile", "--calib-data", "tests.compress.quant_models:sequences16", "-o", tmp_path / "w.pt2",
    )  # fmt: skip
    assert code == 0, err
    side = json.loads((tmp_path / "w.pt2.ptopt.json").read_text())
    assert list(side["extra"]["float_layers"]) == ["conv"] and "ParametrizationList" not in stdout
    assert "makes Linear and Conv2d int8" in side["extra"]["float_layers"]["conv"]
    assert "int8: 1 of 2 layers with weights" in stdout


def test_weight_layers_folds_parametrizations_into_their_layer():
    import torch

    from ptopt.compress.quantize.measure import int8_share, weight_layers
    from tests.compress.quant_models import weight_normed

    model = weight_normed()
    layers = weight_layers(model)
    assert list(layers) == ["conv", "fc"] and layers["conv"][1] == 8 * 4 * 3 + 3 + 8  # v, g (per step), bias
    share = int8_share(model, torch.randn(2, 4, 16), {"conv": "float"})
    assert (share["layers"], share["of_layers"]) == (1, 2)
