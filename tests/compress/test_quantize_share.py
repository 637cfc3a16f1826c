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
