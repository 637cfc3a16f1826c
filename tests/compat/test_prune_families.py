"""Structured pruning across architecture families (``tests.compat.prune_families``), a Hugging Face
model pruned into a Hugging Face folder, and ``inspect``'s guess of a Hugging Face model's input."""

from __future__ import annotations

import importlib.util
import json
import warnings

import pytest
import torch

from ptopt.compress.prune.config import PruneWarning
from tests.compat import prune_families as F
from tests.helpers import assert_refused

pytestmark = pytest.mark.compat


def _needs(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[compat]')")


#: family -> (library, the most parameters kept at --amount 0.3 (measured + 0.03), a layer that must
#: shrink, whether the pruned model is checked against the masked unpruned one: not when a GroupNorm or a
#: channels-first LayerNorm normalizes over pruned channels, as ConvNeXt's and wav2vec2's feature stream;
#: a transformer's hidden size, Swin's too, is checked with its norms run on the kept channels alone)
CASES = {
    "shufflenet": ("torchvision", 0.77, "stage2.0.branch2.0", True),  # read through the channel shuffle
    "mobilenet_timm": ("timm", 0.54, "blocks.1.0.conv_pw", True),  # BatchNormAct2d follows
    "convnext_timm": ("timm", 0.56, "stages.0.blocks.0.mlp.fc1", False),  # channels-last, layer scale
    "swin": ("timm", 0.61, "layers.0.blocks.0.attn.qkv", True),  # bias table per head; LayerNorms on kept
    "distilbert": ("transformers", 0.60, "distilbert.embeddings.word_embeddings", True),  # hidden size
    "t5_encoder": ("transformers", 0.59, "encoder.embed_tokens", True),  # shared table, output narrower
    "wav2vec2": ("transformers", 0.63, "wav2vec2.feature_projection.projection", False),  # weight-norm conv
    "llama": ("transformers", 0.57, "model.layers.0.self_attn.k_proj", True),  # grouped-query kv heads
    "csp_timm": ("timm", 0.52, "stages.0.conv_exp.conv", True),  # refused before expand_chs followed
}


@pytest.mark.parametrize("name", list(CASES))
def test_family_prunes(name):
    """Each family prunes at 0.3 below its bound, the named layer shrinks, and where masking is exact
    the pruned model was checked against the unpruned one with the removed channels masked."""
    library, bound, layer, exact = CASES[name]
    _needs(library)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PruneWarning)
        res, kept = F.prune_family(name)
    assert kept <= bound, f"{name} keeps {kept:.3f} > {bound}"
    rows = {r["layer"]: r for r in res.extra["layers"]}
    assert rows[layer]["channels_after"] < rows[layer]["channels_before"], rows[layer]
    assert res.extra["checked_vs_masked"] is exact
    narrower = [str(w.message) for w in caught if "output is narrower" in str(w.message)]
    assert bool(narrower) is (name == "t5_encoder"), narrower  # only the base model outputs the hidden size


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
    assert c.hidden_size == 22 == back.model.embed_tokens.embedding_dim  # the hidden size, one group
    assert c.use_cache is True and json.loads((tmp_path / "pruned.ptopt.json").read_text())["format"] == "hf"
    x = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, res.model(x).logits)
        assert back.generate(x, max_new_tokens=3, do_sample=False).shape == (2, 9)


def test_llama_whose_pruned_hidden_size_its_config_refuses_keeps_it_in_a_folder(tmp_path):
    """Hidden 64 -> 45 with 2 heads left: transformers 5 validates ``hidden_size % num_attention_heads``
    in ``save_pretrained``; that was an internal error after pruning. The hidden size is kept instead,
    the table says why, and the folder reloads."""
    _needs("transformers")
    from transformers import AutoModelForCausalLM

    import ptopt

    model = F._hf("LlamaConfig", "LlamaForCausalLM", hidden_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=100)  # fmt: skip
    res = ptopt.prune(model, "structured", 0.3, output=tmp_path / "pruned")
    c = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").config
    assert (c.hidden_size, c.num_attention_heads, c.intermediate_size) == (64, 2, 90)  # heads, FFN still go
    why = {row["layer"]: row.get("kept_reason") for row in res.extra["layers"]}["model.embed_tokens"]
    assert "not a multiple of the number of attention heads" in why


def test_tied_embedding_stays_tied_through_the_hidden_size_and_the_folder(tmp_path):
    """The hidden size goes as one group: the embedding and the output head tied to it stay one
    parameter, the norms and every projection follow, the config says the new width, and the folder
    reloads (tied) as the pruned model; the check against the masked unpruned model ran."""
    _needs("transformers")
    from transformers import AutoModelForCausalLM

    import ptopt

    model = F._hf("LlamaConfig", "LlamaForCausalLM", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True, **F._TEXT)  # fmt: skip
    res = ptopt.prune(model, "structured", 0.3, output=tmp_path / "tied")
    m = res.model
    assert m.lm_head.weight is m.model.embed_tokens.weight
    width = m.config.hidden_size
    assert width == m.model.embed_tokens.embedding_dim == m.model.norm.weight.shape[0] == 22
    assert (
        m.model.layers[0].self_attn.q_proj.in_features
        == m.model.layers[0].mlp.down_proj.out_features
        == width
    )
    assert res.extra["checked_vs_masked"] is True
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "tied").eval()
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    x = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, m(x).logits)


@pytest.mark.parametrize("flags,width", [((), 22), (("--no-prune-hidden",), 32)])
def test_cli_prune_hidden_of_a_base_model_into_a_folder(cli, tmp_path, flags, width):
    """A base model outputs its hidden size: pruned by default (the CLI says the output is narrower),
    kept with --no-prune-hidden; either way the folder loads with from_pretrained."""
    _needs("transformers")
    from transformers import T5EncoderModel

    code, out, err = cli("prune", "tests.compat.prune_families:t5_encoder", "--method", "structured",
                         "--amount", "0.3", *flags, "-o", tmp_path / "t5")  # fmt: skip
    assert code == 0, err
    back = T5EncoderModel.from_pretrained(tmp_path / "t5")
    assert back.config.d_model == width == back.shared.embedding_dim and back.config.num_heads == 3
    assert ("output is narrower" in out + err) is (width < 32)


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
    # named as what it is (it was "warning: * kept whole: BertConfig cannot describe fewer heads")
    assert "warning: every attention module keeps its heads: BertConfig cannot describe fewer heads" in err
    assert "* kept whole" not in err


def test_cli_albert_into_a_folder_prunes_its_shared_ffn(cli, tmp_path):
    """ALBERT projects its embeddings (32) to the hidden size (64); its config can say neither a narrower
    hidden size nor fewer heads, but it can say the FFN width of its one shared layer. Every layer whose
    input came from the narrower hidden size was kept too (the FFN among them) and the folder was refused:
    'found no layer whose output channels can be removed'."""
    _needs("transformers")
    from transformers import AlbertForSequenceClassification

    code, out, err = cli("prune", "tests.compat.prune_families:albert", "--method", "structured", "--amount",
                         "0.3", "-o", tmp_path / "a")  # fmt: skip
    assert code == 0, err
    back = AlbertForSequenceClassification.from_pretrained(tmp_path / "a").eval()
    c = back.config
    assert (c.hidden_size, c.embedding_size, c.num_attention_heads, c.intermediate_size) == (64, 32, 4, 90)
    assert back.albert.encoder.albert_layer_groups[0].albert_layers[0].ffn.out_features == 90
    assert "128 → 90" in out


@pytest.mark.parametrize("family,checked", [("wav2vec2", False), ("distilbert", True)])
def test_cli_says_when_the_pruned_model_was_not_checked(cli, tmp_path, family, checked):
    """wav2vec2's feature stream has GroupNorms over pruned channels (ConvNeXtV2's and HuBERT's alike): the
    check against the masked model is skipped by design, which only the sidecar said."""
    _needs("transformers")
    code, out, err = cli("prune", f"tests.compat.prune_families:{family}", "--method", "structured",
                         "--amount", "0.3", "-o", tmp_path / "p.pt")  # fmt: skip
    assert code == 0, err
    side = json.loads((tmp_path / "p.pt.ptopt.json").read_text())
    assert side["extra"]["checked_vs_masked"] is checked
    said = "the pruned model is not checked against the unpruned one" in " ".join(out.split())
    assert said is not checked, out


def test_a_pruned_classifier_folder_loads_and_validates(cli, tmp_path):
    """A folder ptopt wrote of a classifier (prune -o DIR) has a sidecar, which routed it to the language-model
    loader: inspect / validate of it were exit 2, 'has no causal language model head ... hf:DIR loads causal
    language models', though hf:DIR of its source loads. It loads as its module, with the sidecar's inputs."""
    _needs("transformers")
    ids = torch.randint(3, 100, (16, 12), generator=torch.Generator().manual_seed(0))
    torch.save({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, tmp_path / "ids.pt")
    code, _, err = cli("prune", "tests.compat.prune_families:albert", "--method", "structured", "--amount", "0.3",
                       "--eval-data", tmp_path / "ids.pt", "-o", tmp_path / "p")  # fmt: skip
    assert code == 0, err
    code, out, err = cli("inspect", tmp_path / "p")
    assert code == 0, err
    assert "AlbertForSequenceClassification" in out or "input_ids" in out
    code, out, err = cli("validate", "tests.compat.prune_families:albert", tmp_path / "p", "--data",
                         tmp_path / "ids.pt", "--batch-sizes", "1",
                         "--min-iters", "3", "--min-seconds", "0.01", "--rounds", "1")  # fmt: skip
    assert code == 0, err


def test_dinov2_into_a_folder_loses_heads_its_config_can_say(tmp_path):
    """DINOv2's config cannot say a narrower FFN (``mlp_ratio``) but can say fewer heads (``head_dim``): the
    FFN's mismatch was blamed on the heads ('Dinov2Config cannot describe fewer heads (...mlp.fc1.weight
    is [90, 64]...)'), both were kept and the folder refused. The FFN is kept, the heads go."""
    _needs("transformers")
    from transformers import Dinov2ForImageClassification

    import ptopt

    res = ptopt.prune(F.dinov2(), "structured", 0.3, input_shapes=("pixel_values=1x3x32x32",),
                      output=tmp_path / "d")  # fmt: skip
    back = Dinov2ForImageClassification.from_pretrained(tmp_path / "d").eval()
    assert back.config.num_attention_heads == 3 and back.dinov2.encoder.layer[0].mlp.fc1.out_features == 128
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, res.model(x).logits)


def test_modernbert_into_a_folder_says_its_gated_ffn_width(tmp_path):
    """ModernBERT's ``Wi`` makes the FFN input and its gate (2 x intermediate_size, chunked): the config's
    width is half the layer's. It was named a layer whose size the config cannot say, and the folder
    refused; now intermediate_size says it and the folder reloads as the pruned model."""
    _needs("transformers")
    from transformers import ModernBertForSequenceClassification

    import ptopt

    with pytest.warns(PruneWarning, match="keeps its heads"):
        res = ptopt.prune(F.modernbert(), "structured", 0.3, output=tmp_path / "m")
    back = ModernBertForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    wi = back.model.layers[0].mlp.Wi.out_features
    assert wi < 128 and back.config.intermediate_size * 2 == wi
    x = torch.randint(3, 100, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, res.model(x).logits)


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


def test_a_folder_its_config_cannot_prune_points_at_pt(tmp_path):
    """Hugging Face Swin: SwinConfig says neither fewer heads nor an FFN width (mlp_ratio), so into a folder
    nothing can go; the refusal said only 'use --method global or l1-unstructured', though .pt prunes it."""
    _needs("transformers")
    import ptopt

    model = F._hf("SwinConfig", "SwinForImageClassification", image_size=32, patch_size=4, embed_dim=16,
                  depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=3)  # fmt: skip
    assert_refused(ptopt.prune, model, "structured", 0.3, output=tmp_path / "d", where=tmp_path,
                   match="the output is a Hugging Face folder, which holds only the sizes its config can say: "
                   "write .pt or .pt2 to prune more")  # fmt: skip
    assert ptopt.prune(model, "structured", 0.3).metrics["parameter_ratio"] < 0.9


def test_cli_prunes_into_a_folder_again_and_never_over_its_source(cli, tmp_path):
    """-o DIR of an existing folder was click's 'File ... is a directory' (and no rerun of the same
    command), while the twin writes over an earlier ptopt folder; its source folder stays refused."""
    _needs("transformers")
    F.llama().save_pretrained(tmp_path / "src")
    args = ("prune", f"hf:{tmp_path / 'src'}", "--method", "structured", "--amount", "0.3", "-o")
    for _ in range(2):
        code, out, err = cli(*args, tmp_path / "p")
        assert code == 0 and "wrote" in out, err
    assert_refused(cli, *args, tmp_path / "src", match="would overwrite MODEL", where=tmp_path)


@pytest.mark.parametrize("method", ["l1-unstructured", "global"])
def test_unstructured_prunes_gpt2_conv1d_layers(method):
    """GPT-2's projections are transformers' Conv1D: unstructured pruning zeroed only lm_head (its tied
    token embedding) and left every transformer block dense, unsaid."""
    _needs("transformers")
    import ptopt
    from tests.compat.models import gpt2

    res = ptopt.prune(gpt2(), method, 0.5)
    rows = {r["layer"]: r for r in res.extra["layers"]}
    assert rows["transformer.h.0.attn.c_attn"]["type"] == "Conv1D" and len(rows) == 9  # 4 per block + lm_head
    w = res.model.transformer.h[1].mlp.c_fc.weight
    assert float((w == 0).float().mean()) > 0.1 and res.metrics["sparsity"] == pytest.approx(0.5, abs=0.01)


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
        ("roberta", "input_ids: [1..64]x[1..18] int64"),  # 20 positions from padding_idx + 1
        ("wav2vec2", "input_values: [1..64]x16000 float32"),  # a second at 16 kHz
        ("clip", "pixel_values: [1..64]x3x32x32 float32"),  # beside input_ids: was exit 3 (None.shape)
        ("clip", "input_ids: [1..64]x[1..16] int64"),  # text_config's 16 positions, not 128
    ],
)
def test_inspect_guesses_a_hugging_face_main_input(cli, factory, line):
    _needs("transformers")
    code, out, err = cli("inspect", f"tests.compat.prune_families:{factory}")
    assert code == 0, err
    assert line in out, out


def test_cli_clip_into_a_folder_prunes_each_towers_ffn_in_its_sub_config(cli, tmp_path):
    """CLIP states each tower's sizes in text_config / vision_config: the folder was refused ('found no
    layer whose output channels can be removed ... CLIPConfig cannot describe ...'): the top-level config
    has no intermediate_size. Each tower's FFN width is now set in its own sub-config."""
    _needs("transformers")
    from transformers import CLIPModel

    code, out, err = cli("prune", "tests.compat.prune_families:clip", "--method", "structured", "--amount",
                         "0.3", "-o", tmp_path / "c")  # fmt: skip
    assert code == 0, err
    back = CLIPModel.from_pretrained(tmp_path / "c").eval()
    assert back.config.text_config.intermediate_size < 64 and back.config.vision_config.intermediate_size < 64
    assert back.text_model.encoder.layers[0].mlp.fc1.out_features == back.config.text_config.intermediate_size
    assert "text_model.encoder.layers.0.mlp.fc1" in out and "64 → " in out, out
