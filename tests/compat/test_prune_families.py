"""Structured pruning across architecture families (``tests.compat.prune_families``), a Hugging Face
model pruned into a Hugging Face folder, and ``inspect``'s guess of a Hugging Face model's input."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from tests.compat import prune_families as F
from tests.helpers import assert_refused

pytestmark = pytest.mark.compat


def _needs(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[compat]')")


#: family -> (library, the most parameters kept at --amount 0.3 (measured + 0.03), a layer that must
#: shrink, whether the pruned model is checked against the masked unpruned one: not when a LayerNorm /
#: GroupNorm normalizes over pruned channels, as ConvNeXt's, Swin's and wav2vec2's feature stream)
CASES = {
    "shufflenet": ("torchvision", 0.77, "stage2.0.branch2.0", True),  # read through the channel shuffle
    "mobilenet_timm": ("timm", 0.54, "blocks.1.0.conv_pw", True),  # BatchNormAct2d follows
    "convnext_timm": ("timm", 0.56, "stages.0.blocks.0.mlp.fc1", False),  # channels-last, layer scale
    "swin": ("timm", 0.61, "layers.0.blocks.0.attn.qkv", False),  # heads whole, bias table per head
    "distilbert": ("transformers", 0.84, "distilbert.transformer.layer.0.attention.q_lin", True),
    "t5_encoder": ("transformers", 0.83, "encoder.block.0.layer.0.SelfAttention.q", True),
    "wav2vec2": ("transformers", 0.80, "wav2vec2.encoder.layers.0.attention.q_proj", False),
    "llama": ("transformers", 0.81, "model.layers.0.self_attn.k_proj", True),  # grouped-query kv heads
}


@pytest.mark.parametrize("name", list(CASES))
def test_family_prunes(name):
    """Each family prunes at 0.3 below its bound, the named layer shrinks, and where masking is exact
    the pruned model was checked against the unpruned one with the removed channels masked."""
    library, bound, layer, exact = CASES[name]
    _needs(library)
    res, kept = F.prune_family(name)
    assert kept <= bound, f"{name} keeps {kept:.3f} > {bound}"
    rows = {r["layer"]: r for r in res.extra["layers"]}
    assert rows[layer]["channels_after"] < rows[layer]["channels_before"], rows[layer]
    assert res.extra["checked_vs_masked"] is exact


def test_llama_prunes_into_a_hugging_face_folder(tmp_path):
    """GQA heads go in step (4 q / 2 kv -> 2 / 1), the config says so, and the folder reloads with
    ``from_pretrained`` as the pruned model, generating with its key/value cache."""
    _needs("transformers")
    from transformers import AutoModelForCausalLM

    import ptopt

    res = ptopt.prune(F.llama(), "structured", 0.3, output=tmp_path / "pruned")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
    c = back.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.head_dim) == (2, 1, 45, 8)
    assert c.use_cache is True and json.loads((tmp_path / "pruned.ptopt.json").read_text())["format"] == "hf"
    x = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, res.model(x).logits)
        assert back.generate(x, max_new_tokens=3, do_sample=False).shape == (2, 9)


def test_cli_bert_into_a_folder_keeps_heads_its_config_cannot_say(cli, tmp_path):
    """BERT's config derives the head size from hidden / heads: with a folder as output its heads stay
    and its FFN neurons go."""
    _needs("transformers")
    from transformers import AutoModelForSequenceClassification

    code, out, err = cli("prune", "tests.compat.models:bert", "--method", "structured", "--amount", "0.3",
                         "-o", tmp_path / "b")  # fmt: skip
    assert code == 0, err
    c = AutoModelForSequenceClassification.from_pretrained(tmp_path / "b").config
    assert (c.num_attention_heads, c.intermediate_size) == (2, 90) and "128 → 90" in out


@pytest.mark.parametrize(
    "ref,output,match",
    [
        ("tests.helpers:tiny_cnn", "d", "a folder is written for Hugging Face models"),
        ("tests.helpers:tiny_cnn", "d.onnx", ".pt2"),
    ],
)
def test_cli_folder_output_refusals(cli, tmp_path, ref, output, match):
    assert_refused(cli, "prune", ref, "--method", "structured", "--amount", "0.3", "-o", tmp_path / output,
                   match=match, where=tmp_path)  # fmt: skip


def test_saving_a_pruned_non_hf_model_into_a_folder_is_refused(tmp_path):
    import ptopt
    from tests.helpers import tiny_cnn

    res = ptopt.prune(tiny_cnn(), "structured", 0.3, input_shapes=("1x1x8x8",), prune_first_last=True)
    assert_refused(
        res.save, tmp_path / "d", match="a folder is written for Hugging Face models", where=tmp_path
    )


@pytest.mark.parametrize(
    "factory,line",
    [
        ("vit_hf", "pixel_values: [1..64]x3x32x32 float32"),  # was exit 3
        ("roberta", "input_ids: [1..64]x18 int64"),  # 20 positions from padding_idx + 1
        ("wav2vec2", "input_values: [1..64]x16000 float32"),  # a second at 16 kHz
    ],
)
def test_inspect_guesses_a_hugging_face_main_input(cli, factory, line):
    _needs("transformers")
    code, out, err = cli("inspect", f"tests.compat.prune_families:{factory}")
    assert code == 0, err
    assert line in out, out
