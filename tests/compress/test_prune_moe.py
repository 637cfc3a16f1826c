"""``prune`` of a mixture of experts: the experts' fused 3-D Parameters (transformers 5's
``mlp.experts.gate_up_proj`` / ``down_proj``) are no layer pruning takes; they were left whole without a
word (``--amount 0.5``: 1.00x and a table of attention layers). The metrics and the command name them
and their share. Tiny Mixtral built from its config."""

from __future__ import annotations

import pytest

import ptopt
from tests.export.lm_models import build, save

EXPERTS = [f"model.layers.{i}.mlp.experts.{p}" for i in (0, 1) for p in ("gate_up_proj", "down_proj")]


@pytest.mark.parametrize("method", ["structured", "l1-unstructured"])
def test_api_names_the_unpruned_expert_tensors(method):
    model = build("mixtral", layers=2)
    res = ptopt.prune(model, method=method, amount=0.5, input_shapes=("input_ids=1x8",))
    got = res.metrics["unpruned_experts"]
    assert got["tensors"] == EXPERTS
    assert got["parameters"] == sum(model.get_parameter(n).numel() for n in EXPERTS)


def test_api_a_dense_model_has_no_such_entry():
    res = ptopt.prune(
        build("llama", layers=1), method="l1-unstructured", amount=0.5, input_shapes=("input_ids=1x8",)
    )
    assert "unpruned_experts" not in res.metrics


def test_cli_says_the_experts_were_not_pruned(cli, tmp_path):
    folder = save("mixtral", tmp_path / "mixtral", layers=2)
    code, out, err = cli(
        "prune", f"hf:{folder}", "--method", "structured", "--amount", "0.5", "-o", tmp_path / "p"
    )
    assert code == 0, err
    assert "not pruned: 4 fused expert tensors (model.layers.*.mlp.experts.gate_up_proj, " in out
    assert "3-D Parameters" in out


def test_cli_qwen2_moe_shared_expert_prunes_into_a_folder(cli, tmp_path):
    """Was exit 2, 'Qwen2MoeConfig cannot describe fewer heads (...shared_expert.gate_proj.weight is [32, 32]
    but Qwen2MoeConfig builds [64, 32])': the shared expert's width is ``shared_expert_intermediate_size``."""
    import json

    from ptopt.core.hf import load_causal_lm

    folder = save("qwen2_moe", tmp_path / "q", layers=2)
    out = tmp_path / "p"
    code, stdout, err = cli("prune", f"hf:{folder}", "--method", "structured", "--amount", "0.5", "-o", out)
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["shared_expert_intermediate_size"] == 32 and config["num_attention_heads"] == 2
    pruned = load_causal_lm(out)
    assert pruned.get_submodule("model.layers.1.mlp.shared_expert.up_proj").out_features == 32
    assert "not pruned: 4 fused expert tensors" in stdout


@pytest.mark.parametrize("family", ["vit_hf", "wav2vec2"])
def test_a_class_token_or_a_weight_norm_is_no_expert_tensor(family):
    """A ViT's ``[1, 1, D]`` class token and ``[1, N, D]`` position table, and wav2vec2's weight-normed
    positional conv (``parametrizations.weight.original0/1``), are 3-D Parameters but no experts: prune
    said 'not pruned: 2 fused expert tensors (...embeddings.cls_token ...): ... not a mixture of experts'
    3-D Parameters' of a plain HF ViT (BEiT, DINOv2, SigLIP and HuBERT alike)."""
    pytest.importorskip("transformers")
    from ptopt.core.lm import expert_tensors
    from tests.compat import prune_families as F

    model = getattr(F, family)()
    assert any(p.dim() == 3 for p in model.parameters())  # what was taken for experts is there
    assert expert_tensors(model) == {}


def test_cli_prune_of_a_vit_says_nothing_of_experts(cli):
    pytest.importorskip("transformers")
    code, out, err = cli("prune", "tests.compat.prune_families:vit_hf", "--method", "l1-unstructured",
                         "--amount", "0.3", "-o", "v.pt")  # fmt: skip
    assert code == 0, err
    assert "expert" not in out + err
