"""``quantize --mode weight-only`` of a mixture of experts: transformers 5 keeps each layer's experts in
fused 3-D Parameters (``gate_up_proj``, ``down_proj``), not nn.Linear layers, so they stay float; the
record and the command say so, with their share of the model's parameters (the folder's byte ratio
was printed with ``float_layers: {}`` and no word about them). Tiny Mixtral built from its config."""

from __future__ import annotations

import pytest

import ptopt
from tests.export.lm_models import build, save

EXPERTS = [f"model.layers.{i}.mlp.experts.{p}" for i in (0, 1) for p in ("gate_up_proj", "down_proj")]


@pytest.mark.parametrize("bits", [8, 4])
def test_api_record_names_the_float_expert_tensors(bits):
    model = build("mixtral", layers=2)
    res = ptopt.quantize(model, "weight-only", bits=bits, group_size=32 if bits == 4 else None)
    rec = res.extra["weight_only"]
    tensors = rec["float_tensors"]
    for name in EXPERTS:
        assert tensors[name]["params"] == model.get_parameter(name).numel()
        assert "fused expert weights" in tensors[name]["why"]
    assert "model.embed_tokens.weight" in tensors  # untied: it stays float too, and is said so
    assert not any("q_proj" in n or "lm_head" in n for n in tensors)  # the quantized Linear layers
    assert rec["parameters"] == sum(p.numel() for p in model.parameters())
    quantized = res.model.get_submodule("model.layers.0.self_attn.q_proj").weight
    assert type(quantized).__name__ != "Parameter"  # a torchao tensor
    assert type(res.model.get_parameter(EXPERTS[0])).__name__ == "Parameter"  # float, as recorded


def test_cli_says_what_stayed_float_and_its_share(cli, tmp_path):
    folder = save("mixtral", tmp_path / "mixtral", layers=2)
    code, out, err = cli(
        "quantize", f"hf:{folder}", "--mode", "weight-only", "--bits", "8", "-o", tmp_path / "q"
    )
    assert code == 0, err
    model = build("mixtral", layers=2)
    experts = sum(model.get_parameter(n).numel() for n in EXPERTS if n.endswith("gate_up_proj"))
    assert (
        f"float: model.layers.*.mlp.experts.gate_up_proj (2 tensors, {experts:,} parameters): fused expert"
        in out
    )
    total = sum(p.numel() for p in model.parameters())
    assert "float outside Linear layers: " in out and f"of {total:,} parameters" in out


def test_api_openvino_engine_compresses_the_experts(tmp_path):
    """``--engine openvino`` converts the experts (``formats.lm_experts``; was exit 2, OpConversionFailure)
    and NNCF compresses each expert's matrix: 2 layers x 4 experts x 2 beside the 8 attention matrices,
    2 routers, the embedding and the output layer."""
    folder = save("mixtral", tmp_path / "mixtral", layers=2)
    res = ptopt.quantize(f"hf:{folder}", "weight-only", bits=8, engine="openvino")
    assert sum(res.extra["weight_only"]["compressed_matrices"].values()) == 16 + 8 + 2 + 2


def test_inspect_lists_the_experts_and_what_acts_on_them(cli, tmp_path):
    """``inspect`` listed attention and the output layer alone: a mixture's experts (most of a real
    MoE's parameters) were not in its table."""
    from ptopt.core.inspect import inspect_model

    folder = save("mixtral", tmp_path / "mixtral", layers=2)
    rows = {r["name"]: r for r in inspect_model(f"hf:{folder}")["layers"]}
    model = build("mixtral", layers=2)
    experts = rows["model.layers.1.mlp.experts"]
    assert experts["type"] == "MixtralExperts"
    assert experts["params"] == sum(
        p.numel() for p in model.get_submodule("model.layers.1.mlp.experts").parameters()
    )
    assert experts["techniques"] == ["weight-only (openvino)"] and "leave them float" in experts["notes"][0]
    code, out, err = cli("inspect", f"hf:{folder}")
    assert code == 0 and "MixtralExperts" in out, err


def test_a_class_token_left_float_is_not_called_an_expert_tensor():
    """``float_tensors`` and prune's expert count read fused experts one way (``core.lm.expert_tensors``): a
    ViT's ``[1, 1, D]`` class token, 3-D like an expert tensor, was named "fused expert weights"."""
    import torch

    from ptopt.compress.quantize.weight_only import FUSED_EXPERTS, float_tensors

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 8))
            self.gate_up_proj = torch.nn.Parameter(torch.zeros(4, 8, 16))

    found = float_tensors(Holder())
    assert found["gate_up_proj"]["why"] == FUSED_EXPERTS
    assert found["cls_token"]["why"] != FUSED_EXPERTS and "3-D Parameter" in found["cls_token"]["why"]
