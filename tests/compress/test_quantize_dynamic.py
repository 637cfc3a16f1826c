"""Dynamic int8 (Linear / LSTM / GRU): CLI and Python twin, recurrent and keyword-input models."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ptopt.core.artifact import Artifact


def _jit_load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))


def test_dynamic_cli_lstm_gru(cli, tmp_path: Path) -> None:
    out = tmp_path / "lstm.int8.pt"
    code, stdout, stderr = cli(
        "quantize",
        "tests.compress.quant_models:tiny_lstm",
        "--mode",
        "dynamic",
        "--eval-data",
        "builtin:digits:test",
        "-o",
        out,
    )
    assert code == 0, stderr
    assert "every layer with weights is int8" in stdout
    art = Artifact.load(out)
    assert (
        art.precision == "int8"
        and art.config["mode"] == "dynamic"
        and art.config["type"] == "quantize-dynamic"
    )
    assert art.extra["dynamic"]["quantized_layers"] == ["fc", "gru", "lstm"]
    assert art.extra["onnx_quantization"]["method"] == "quantize_dynamic"
    assert art.metrics["eval_samples"] == 359 and "int8_accuracy" in art.metrics
    m = _jit_load(out)
    graph = str(m.inlined_graph)
    assert "quantized_lstm" in graph and "linear_dynamic" in graph
    assert m(torch.rand(7, 1, 8, 8)).shape == (7, 10)


def test_dynamic_python_api_layers_and_per_tensor(tmp_path: Path) -> None:
    from ptopt.compress.quantize import quantize
    from tests.compress.quant_models import tiny_lstm

    art = quantize(tiny_lstm(), "dynamic", tmp_path / "q.pt", layers=("linear",), per_channel=False)
    assert art.config["per_channel"] is False and art.config["layers"] == ["linear"]
    assert set(art.extra["float_layers"]) == {"lstm", "gru"}
    assert "not selected" in art.extra["float_layers"]["lstm"]


def test_dynamic_leaves_convolutions_float(tmp_path: Path) -> None:
    from ptopt.compress.quantize import quantize

    art = quantize("tests.helpers:tiny_cnn", "dynamic", tmp_path / "q.pt")
    assert set(art.extra["float_layers"]) == {"conv1", "bn1", "conv2", "bn2"}
    assert "--mode static" in art.extra["float_layers"]["conv1"]


def test_dynamic_transformer_keyword_inputs(tmp_path: Path) -> None:
    """nn.TransformerEncoder crashes under dynamic int8 with the MHA fast path on; ptopt turns it off."""
    from ptopt.compress.quantize import quantize
    from ptopt.models.transformer import transformer

    model = transformer().eval()
    out = tmp_path / "tr.pt"
    art = quantize(model, "dynamic", out)
    assert art.input_style == "keyword" and [s.name for s in art.inputs] == ["input_ids", "attention_mask"]
    floats = art.extra["float_layers"]
    assert "out_proj" in next(k for k in floats if k.endswith("self_attn.out_proj"))
    assert "encoder.layers.0.linear1" not in floats and "fc" not in floats
    assert torch.backends.mha.get_fastpath_enabled()  # restored
    m = _jit_load(out)
    x = model.example_inputs(batch=3)
    x["attention_mask"][:, -5:] = 0
    with torch.no_grad():
        ref = model(**x)
    assert torch.allclose(m(**x), ref, atol=0.1)


def test_dynamic_two_input_model(cli, tmp_path: Path) -> None:
    ids = torch.randint(1, 18, (20, 12), generator=torch.Generator().manual_seed(0))
    torch.save(
        {"x": {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, "y": torch.arange(20) % 10},
        tmp_path / "tokens.pt",
    )
    code, stdout, stderr = cli(
        "quantize",
        "tests.helpers:two_input",
        "--mode",
        "dynamic",
        "--eval-data",
        tmp_path / "tokens.pt",
        "-o",
        tmp_path / "q.pt",
    )
    assert code == 0, stderr
    art = Artifact.load(tmp_path / "q.pt")
    # embeddings are int8 too (weight-only rows); the printed report says what is float, if anything
    assert "embed" in art.extra["dynamic"]["quantized_layers"] and "embed" not in art.extra["float_layers"]
    assert art.input_style == "keyword" and art.metrics["top1_agreement"] == 1.0
    m = _jit_load(tmp_path / "q.pt")
    assert m(input_ids=ids[:4], attention_mask=torch.ones_like(ids[:4])).shape == (4, 10)


def test_a_module_holding_its_own_parameter_is_named_for_what_it_is():
    """wav2vec2's ``Wav2Vec2Model`` holds ``masked_spec_embed`` beside its layers: the report said
    "Wav2Vec2Model has no dynamic int8 kernel: runs in float", as if the whole model were one float layer."""
    import ptopt

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.scale = torch.nn.Linear(4, 4), torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            return self.fc(x) * self.scale

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = Holder(), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.block(x))

    res = ptopt.quantize(Outer(), mode="dynamic", input_shapes=("1x4",))
    assert res.template.extra["float_layers"] == {
        "block": "Holder holds scale itself (a parameter its code reads, not a layer): stays float"
    }
