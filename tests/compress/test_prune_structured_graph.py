"""Structured pruning beyond torch.fx (issue 18): the torch.export ATen graph, squeeze-excitation,
stochastic depth, GroupNorm / grouped convs (whole groups), concatenation offsets, attention heads
and FFN neurons in Hugging Face BERT and timm ViT, ``nn.MultiheadAttention`` kept whole."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from ptopt.compress.prune import PruneWarning, prune
from ptopt.compress.prune.techniques.structured import analyse, structured_prune
from ptopt.core.errors import UnsupportedModelError
from tests.compress import prune_graph_models as G
from tests.compress import prune_models
from tests.helpers import assert_refused

BERT = "tests.compress.prune_graph_models:tiny_bert"


def _needs(module: str) -> None:
    from tests.compat.models import ensure_torchvision_ops

    ensure_torchvision_ops()  # transformers and timm import torchvision, a CUDA build here
    pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[compat]')")


def _partition(model, x, graph):
    _, groups, _ = analyse(model, x, prune_first_last=True, graph=graph)
    return sorted((tuple(sorted(g.producers)), g.size, g.units, g.prunable) for g in groups if g.producers)


@pytest.mark.parametrize(
    "factory", [G.se_block, prune_models.tiny_mobile, prune_models.concat], ids=lambda f: f.__name__
)
def test_fx_and_export_graphs_agree(factory):
    """Where torch.fx can trace, the ATen analysis finds the same groups (the auto choice is sound)."""
    _needs("torchvision")
    model = factory()
    x = model.example_inputs()
    assert _partition(model, x, "fx") == _partition(model, x, "export")


@pytest.mark.parametrize("graph", ["fx", "export"])
def test_squeeze_excitation_stochastic_depth_groupnorm_grouped(graph):
    _needs("torchvision")
    model = G.se_block()
    x = model.example_inputs()
    pruned, report = structured_prune(model, x, 0.5, prune_first_last=True, graph=graph)
    assert report["graph"] == graph
    # expand's channels run through depthwise and the SE gate (x * scale): one group, pruned together
    assert pruned.expand.out_channels == pruned.se_expand.out_channels == pruned.dw.groups == 8
    assert pruned.se_reduce.in_channels == pruned.project.in_channels == 8
    assert pruned.se_reduce.out_channels == 2
    # GroupNorm (2 channels per group) and the grouped conv (4 per group) go in whole groups of 4
    assert pruned.stem.out_channels == pruned.project.out_channels == 4
    assert (pruned.gn.num_groups, pruned.gn.num_channels) == (2, 4)
    assert (pruned.grouped.groups, pruned.grouped.in_channels, pruned.grouped.out_channels) == (1, 4, 4)
    assert pruned.fc.in_features == 4 and pruned.fc.out_features == 10
    assert pruned(x).shape == (2, 10)


def _zero_half(model, skip):
    with torch.no_grad():
        for name, m in model.named_modules():
            if name not in skip and isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
                c = m.weight.shape[0] // 2
                m.weight[:c] = 0
                m.bias[:c] = 0
    return model


def test_concatenated_channels_are_pruned_at_their_offsets():
    model = _zero_half(prune_models.concat(), {"fc"})
    x = model.example_inputs()
    pruned, report = structured_prune(model, x, 0.5, prune_first_last=True)
    assert pruned.a.out_channels == 3 and pruned.b.out_channels == 3
    # mix reads a's kept channels at offset 0 and b's at offset 6
    assert pruned.mix.in_channels == 6 and pruned.mix.out_channels == 6 and pruned.stem.out_channels == 4
    assert report["layers"]["a"]["kept_reason"] is None
    torch.testing.assert_close(pruned(x), model(x))


def _zero_heads_and_neurons(layers, heads, head_dim, width):
    """Head 0 of every attention (q, k and v rows) and the first quarter of every FFN's neurons
    are exactly zero: pruning 25% must remove exactly them and leave the outputs unchanged."""
    with torch.no_grad():
        for qkv, fc1 in layers:
            for lin, offset in qkv:
                lin.weight[offset : offset + head_dim] = 0
                lin.bias[offset : offset + head_dim] = 0
            fc1.weight[: fc1.out_features // 4] = 0
            fc1.bias[: fc1.out_features // 4] = 0


def test_bert_heads_and_ffn_neurons_exact():
    _needs("transformers")
    model = G.tiny_bert()
    layers = []
    for layer in model.bert.encoder.layer:
        s = layer.attention.self
        layers.append((((s.query, 0), (s.key, 0), (s.value, 0)), layer.intermediate.dense))
    _zero_heads_and_neurons(layers, 4, 8, 32)
    with torch.no_grad():
        model.bert.pooler.dense.weight[:8] = 0
        model.bert.pooler.dense.bias[:8] = 0
    x = G.token_batch()
    pruned, report = structured_prune(model, x, 0.25, hidden=False)  # heads and neurons only
    assert report["graph"] == "export"  # torch.fx cannot trace BERT
    s = pruned.bert.encoder.layer[0].attention.self
    assert (s.num_attention_heads, s.all_head_size, s.query.out_features, s.value.out_features) == (
        3,
        24,
        24,
        24,
    )
    assert pruned.bert.encoder.layer[0].attention.output.dense.in_features == 24
    assert pruned.bert.encoder.layer[1].intermediate.dense.out_features == 48
    assert pruned.bert.encoder.layer[1].output.dense.in_features == 48
    assert pruned.bert.pooler.dense.out_features == 24 and pruned.classifier.in_features == 24
    assert pruned.bert.embeddings.word_embeddings.embedding_dim == 32  # the hidden size stays
    torch.testing.assert_close(pruned(**x).logits, model(**x).logits)


def test_timm_vit_heads_and_mlp_exact():
    _needs("timm")
    model = G.tiny_vit()
    layers = [(((b.attn.qkv, 0), (b.attn.qkv, 32), (b.attn.qkv, 64)), b.mlp.fc1) for b in model.blocks]
    _zero_heads_and_neurons(layers, 4, 8, 32)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    pruned, report = structured_prune(model, x, 0.25)
    a = pruned.blocks[0].attn
    assert (a.num_heads, a.attn_dim, a.qkv.out_features, a.proj.in_features) == (3, 24, 72, 24)
    assert pruned.blocks[1].mlp.fc1.out_features == 48 and pruned.blocks[1].mlp.fc2.in_features == 48
    assert "patch_embed.proj" in report["default_excluded"]
    torch.testing.assert_close(pruned(x), model(x))


def test_layers_kept_whole_for_one_reason_are_one_warning():
    """torchvision's ViT: one nn.MultiheadAttention per block printed one identical warning each (12 for
    vit_b_16); one warning names them all with a glob and a count."""
    from tests.compat.models import ensure_torchvision_ops

    ensure_torchvision_ops()
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(image_size=16, patch_size=8, num_layers=3, num_heads=2, hidden_dim=16,
                              mlp_dim=32, num_classes=3).eval()  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        structured_prune(model, torch.randn(2, 3, 16, 16), 0.5)
    kept = [str(w.message) for w in caught if "kept whole" in str(w.message)]
    assert kept == [
        "encoder.layers.*.self_attention (3 modules) kept whole: nn.MultiheadAttention derives head_dim from "
        "embed_dim, the width of its input: its heads cannot be removed without changing the model's hidden size"
    ]


@pytest.mark.parametrize("graph", ["fx", "export"])
def test_multihead_attention_is_kept_whole_with_a_note(graph):
    model = G.mha_encoder()
    x = model.example_inputs()
    with pytest.warns(PruneWarning, match="attn kept whole: nn.MultiheadAttention derives head_dim"):
        pruned, report = structured_prune(model, x, 0.5, graph=graph)
    assert pruned.attn.in_proj_weight.shape == (48, 16)
    assert pruned.fc1.out_features == 16 and pruned.fc2.in_features == 16
    assert pruned(x).shape == (2, 3)
    assert report["notes"] and report["graph"] == graph


def test_bert_python_api_and_gradual_rounds():
    _needs("transformers")
    res = prune(G.tiny_bert(), "structured", 0.5, steps=2, input_shapes=("input_ids=2x8:int64",))
    rows = {r["layer"]: r for r in res.extra["layers"]}
    # two rounds (to 0.25, then 0.5 of the heads the model started with) end where one would
    assert rows["bert.encoder.layer.0.attention.self.query"]["channels_after"] == 16
    assert rows["bert.encoder.layer.0.intermediate.dense"]["channels_after"] == 32
    assert res.metrics["parameter_ratio"] < 0.85
    x = G.token_batch()
    assert res.model(**x).logits.shape == (3, 3)


def test_cli_bert_structured(cli, tmp_path):
    _needs("transformers")
    code, out, err = cli("prune", BERT, "--method", "structured", "--amount", "0.3", "-o", tmp_path / "b.pt")
    assert code == 0, err
    assert "64 → 45" in out and "32 → 24" in out and "parameters:" in out
    loaded = torch.jit.load(str(tmp_path / "b.pt"))
    x = G.token_batch()
    # the spec from its config: input_ids and the padding mask its forward takes
    assert loaded(x["input_ids"], x["attention_mask"])["logits"].shape == (3, 3)


# -- refused: one line, exit 2 ------------------------------------------------------------------------


def test_fx_forced_on_bert_refuses():
    _needs("transformers")
    assert_refused(
        structured_prune, G.tiny_bert(), G.token_batch(), 0.3, graph="fx", match="torch.fx cannot trace"
    )


def test_nothing_prunable_names_why(tmp_path):
    class OnlyAttention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    assert_refused(
        structured_prune,
        OnlyAttention().eval(),
        torch.randn(2, 4, 8),
        0.5,
        match=("no layer whose output channels can be removed", "attn kept whole"),
        where=tmp_path,
        error=UnsupportedModelError,
    )


def test_a_module_type_kept_whole_is_refused_with_its_reason():
    """When nothing can be pruned, the refusal says why a module type was kept whole, once, first
    (all-MiniLM-L6-v2: "Block kept whole" per layer, never why, and cut mid-word at 600 characters)."""
    import types

    from ptopt.compress.prune.techniques.structured import _refuse_if_nothing

    g = types.SimpleNamespace(notes=[])
    why = "its forward fails with fewer channels (shape '[2, 32, 8, 48]' is invalid for input of size 16384)"
    with pytest.raises(UnsupportedModelError) as e:
        _refuse_if_nothing(g, [], {"Block": why})
    assert f"removed: Block kept whole ({why})" in str(e.value)


def test_a_split_size_the_module_holds_follows_the_cut_channels(cli, tmp_path):
    """timm cspresnet50 was refused ("ConvNormAct kept whole"): ``CrossStage`` splits its expanded channels at
    ``self.expand_chs // 2``, which stayed at the old width. Its attribute now follows (16 -> 12 here, both
    halves cut alike) and the model, checked against the unpruned one with the removed channels masked,
    is pruned."""
    res = prune(G.csp_net(), "structured", 0.3, input_shapes=("1x3x16x16",))
    stage = res.model.stages[0]
    assert stage.expand_chs == stage.conv_exp.conv.out_channels == 2 * stage.blocks[0].conv.in_channels < 16
    assert f"stages.0.expand_chs: 16 → {stage.expand_chs}" in res.extra["heads"]
    assert res.model(torch.randn(3, 3, 20, 20)).shape == (3, 5)
    code, out, err = cli(
        "prune", "tests.compress.prune_graph_models:csp_net", "--method", "structured", "--amount", "0.3",
        "--input-shape", "1x3x16x16", "-o", tmp_path / "p.pt",
    )  # fmt: skip
    assert code == 0, err
    side = json.loads((tmp_path / "p.pt.ptopt.json").read_text())
    assert f"stages.1.expand_chs: 16 → {stage.expand_chs}" in json.dumps(side, ensure_ascii=False)


def test_the_module_whose_code_sized_the_failing_input_is_kept_whole(cli, tmp_path):
    """Where no attribute can follow (a split at a number written in the code), the module kept whole is the
    one whose own code sized what the failing layer was given, not the wrapper that handed it on (timm
    cspresnet50 named ``ConvNormAct``, a convolution with its norm: every convolution stayed)."""
    why = ("LiteralCrossStage kept whole (its forward fails with fewer channels: its own code sizes the input "
           "of stages.0.blocks.0.conv")  # fmt: skip
    message = assert_refused(
        prune, G.csp_net_literal(), "structured", 0.3, input_shapes=("1x3x16x16",), match=why,
        error=UnsupportedModelError,
    )  # fmt: skip
    assert "ConvNormAct" not in message
    model = "tests.compress.prune_graph_models:csp_net_literal"
    assert_refused(
        cli, "prune", model, "--method", "structured", "--amount", "0.3", "--input-shape", "1x3x16x16",
        "-o", tmp_path / "p.pt", match=why, where=tmp_path,
    )  # fmt: skip


def test_the_failing_chain_follows_an_input_handed_on_unchanged():
    """``prune.culprit.maker``: a wrapper whose forward hands its input to the failing layer is passed over;
    a module whose own code made that input is the one; a forward that runs names nothing."""
    from ptopt.compress.prune.culprit import maker

    model = G.csp_net()
    model.stages[0].blocks[0].conv = torch.nn.Conv2d(5, 8, 3, padding=1)  # reads 5 channels, is given 8
    ours = {
        id(m) for m in model.modules() if m is not model and not type(m).__module__.startswith("torch.nn")
    }
    x = torch.randn(2, 3, 16, 16)
    made = maker(model, x, ours)
    assert made is not None and made[0] is model.stages[0] and made[1] == "stages.0.blocks.0.conv"
    assert maker(G.csp_net(), x, ours) is None  # it runs


# -- a forward that derives sizes from its input's width (all-MiniLM-L6-v2's plain-PyTorch port) --------


def test_block_deriving_head_size_from_its_width_cuts_heads_and_width_together():
    """``Block.forward`` splits q/k/v into ``d // self.heads`` with ``d`` its input's width: fewer heads
    alone, or a narrower stream alone, break it (it was kept whole: nothing pruned, exit 2). Its heads and
    the stream are cut together (kept heads x head size); with the stream kept (--no-prune-hidden) its
    heads stay and its feed-forward still shrinks."""
    from ptopt.models.minilm import minilm_tiny

    model = minilm_tiny().eval()
    x = model.example_inputs()
    orig = model.layers[0]
    with pytest.warns(PruneWarning) as caught:
        pruned, report = structured_prune(model, x, 0.3)
    notes = " | ".join(str(w.message) for w in caught)
    assert "Block: heads and the width it reads cut together" in notes and "kept whole" not in notes
    block = pruned.layers[0]
    assert block.heads == 3 and block.q.out_features == 3 * (orig.q.out_features // orig.heads)
    assert pruned.tok.embedding_dim == block.q.in_features == block.q.out_features  # width = heads x 8
    assert block.ff1.out_features == 45 and report["checked"]  # the masked unpruned model's output
    assert pruned(**x).shape == (2, block.q.out_features)
    with pytest.warns(PruneWarning) as caught:
        kept, report = structured_prune(model, x, 0.3, hidden=False)
    assert "Block keeps its attention heads: its forward derives the head size" in str(caught[0].message)
    assert kept.layers[0].heads == orig.heads and kept.layers[0].ff1.out_features == 45
    assert kept(**x).shape == model(**x).shape and report["checked"]


def test_cli_sentence_encoder_with_unlabelled_eval_data(cli, tmp_path):
    """A sentence encoder's held-out sentences have no labels: the cosine to the unpruned model on
    them is the figure (it was refused: "has no labels (y)")."""
    code, out, err = cli(
        "prune", "ptopt.models.minilm:minilm_tiny", "--method", "structured", "--amount", "0.3",
        "--no-prune-hidden", "--eval-data", "ptopt.models.minilm:heldout_sentences", "-o", tmp_path / "m.pt",
    )  # fmt: skip
    assert code == 0, err
    assert "64 → 45" in out and "32 → 32" in out  # the embedding width kept: the cosine is measurable
    assert "samples of minilm:heldout-sentences" in out and "accuracy" not in out
    assert (tmp_path / "m.pt").exists()
    code, out, err = cli("prune", "ptopt.models.minilm:minilm_tiny", "--method", "structured", "--amount", "0.3",
                         "--eval-data", "ptopt.models.minilm:heldout_sentences", "-o", tmp_path / "n.pt")  # fmt: skip
    assert code == 0, err  # the stream pruned: 32 -> 24 wide embeddings, not comparable (it said nothing)
    assert "vs unpruned: not compared: the output is narrower" in out
    side = json.loads((tmp_path / "n.pt.ptopt.json").read_text())
    assert any("output is narrower" in n for n in side["extra"]["notes"])


def test_an_embedding_row_added_to_the_hidden_stream_is_cut_with_it():
    """``h = tok(ids) + typ.weight[0]`` (a token-type row added by hand): the row is a parameter seen
    through an index, cut with the hidden size (it kept the hidden size: "a tensor no layer made")."""

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.typ = torch.nn.Embedding(50, 16), torch.nn.Embedding(2, 16)
            self.ff1, self.ff2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
            self.head = torch.nn.Linear(16, 4)

        def forward(self, ids):
            h = self.tok(ids) + self.typ.weight[0]
            h = h + self.ff2(torch.relu(self.ff1(h)))
            return self.head(h.mean(1))

    model = Encoder().eval()
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    pruned, report = structured_prune(model, ids, 0.5)
    assert pruned.tok.embedding_dim == pruned.typ.weight.shape[1] == pruned.ff2.out_features == 8
    assert report["checked"] and pruned(ids).shape == (2, 4)


@pytest.mark.parametrize(
    ("index", "rank", "expected"),
    [
        (0, 2, {1: 0}),
        ((None, slice(None)), 2, {0: 1, 1: 2}),
        ((Ellipsis, 0), 3, {0: 0, 1: 1}),
        ((slice(None), None, 1), 3, {0: 0, 2: 2}),
        ([0, 1], 2, None),
    ],
)
def test_basic_index_dims(index, rank, expected):
    from ptopt.compress.prune.rules import _basic_index_dims

    assert _basic_index_dims(index, rank) == expected


def test_distilling_a_base_model_keeps_its_output_width():
    """Pruning the hidden size narrows a base model's output (32 -> 16 here): distillation from the
    unpruned model then compared tensors of different widths (an internal error). The hidden size is
    kept, with a warning, and the notes of the dropped attempt are not shown."""
    from ptopt.models.minilm import minilm_tiny

    model = minilm_tiny().eval()
    with pytest.warns(PruneWarning) as caught:
        res = prune(model, "structured", 0.5, teacher="self", epochs=1, batch_size=64,
                    fine_tune_data="ptopt.models.minilm:tuning_sentences")  # fmt: skip
    notes = [str(w.message) for w in caught]
    assert any("the hidden size kept: distilling from the teacher needs its output width" in n for n in notes)
    assert not any("output is narrower" in n for n in notes)
    x = model.example_inputs()
    assert res.model(**x).shape == model(**x).shape and res.model.layers[0].ff1.out_features == 32
    assert res.metrics["vs_source"]["mean_cosine"] > 0.9


def test_a_causal_lm_is_judged_by_perplexity_on_its_eval_text(cli, tmp_path):
    """A language model's --eval-data is text (token ids here): perplexity before and after pruning, the
    figure LLM pruning is judged by (the ids were read as 1200 one-token samples: 'does not fit')."""
    from ptopt.core.lm import perplexity
    from tests.compress.hf_models import llama

    llama(512).save_pretrained(tmp_path / "llama")
    ids = torch.randint(1, 512, (600,), generator=torch.Generator().manual_seed(3))
    torch.save(ids, tmp_path / "eval.pt")
    code, out, err = cli("prune", f"hf:{tmp_path / 'llama'}", "--method", "structured", "--amount", "0.3",
                         "--eval-data", tmp_path / "eval.pt", "-o", tmp_path / "pruned")  # fmt: skip
    assert code == 0, err
    assert "perplexity: " in out and "on 599 tokens of " in out and "eval.pt (context 512, stride 256)" in out
    # vs unpruned on the eval text's windows (it was the 2-sample random example batch)
    assert "on 4 samples of " in out and "eval.pt (4 windows of 128 tokens)" in out, out
    res = prune(f"hf:{tmp_path / 'llama'}", "structured", 0.3, eval_data=tmp_path / "eval.pt")
    m = res.metrics
    assert m["perplexity_after"] == pytest.approx(perplexity(res.model, ids)["perplexity"], rel=1e-9)
    assert m["perplexity_increase_pct"] == pytest.approx(
        100 * (m["perplexity_after"] / m["perplexity_before"] - 1)
    )


def test_torchvision_swin_cuts_heads_and_stage_widths_together():
    """torchvision's ``shifted_window_attention`` reshapes by ``C // num_heads``: its heads and each
    stage's width are cut together (it was kept whole: 0.82 of the parameters at 0.3, over the 0.75
    bound). A stage whose width cannot shrink (the first: the patch convolution is the first layer)
    keeps its heads."""
    _needs("torchvision")
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.swin_transformer.SwinTransformer(
        patch_size=[4, 4], embed_dim=48, depths=[2, 2], num_heads=[3, 6], window_size=[4, 4], num_classes=10
    ).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    before = sum(p.numel() for p in model.parameters())
    with pytest.warns(
        PruneWarning, match="ShiftedWindowAttention: heads and the width it reads cut together"
    ):
        pruned, _ = structured_prune(model, x, 0.3)
    assert sum(p.numel() for p in pruned.parameters()) / before < 0.6
    stage2 = pruned.features[3][0]
    assert stage2.attn.num_heads == 4 and stage2.attn.qkv.in_features == 4 * 16  # kept heads x head size
    assert pruned.features[1][0].attn.num_heads == 3  # the first stage's width is the first layer's: kept
    assert pruned(x).shape == (2, 10)


def test_keeping_the_hidden_size_lets_the_heads_go_again():
    """A block whose head size is fixed but whose width is written in its forward breaks with a narrower
    stream, not with fewer heads: the retries kept its heads first and never let them go once the hidden
    size was kept (4 of 4 heads, where 2 of 4 run)."""
    import math

    class Block(torch.nn.Module):
        def __init__(self, dim=32, heads=4):
            super().__init__()
            self.heads, self.head_dim, self.dim = heads, dim // heads, dim
            self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim) for _ in range(4))

        def forward(self, h):
            n, t, _ = h.shape
            split = lambda x: x.view(n, t, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
            q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), -1)
            h = h + self.o((att @ v).transpose(1, 2).reshape(n, t, self.heads * self.head_dim))
            return h.reshape(n, t, self.dim)  # the width, written down

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.tok, self.block, self.head = torch.nn.Embedding(100, 32), Block(), torch.nn.Linear(32, 3)

        def forward(self, ids):
            return self.head(self.block(self.tok(ids)).mean(1))

    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.warns(PruneWarning, match="the hidden size kept: Block"):
        pruned, report = structured_prune(Encoder().eval(), ids, 0.5)
    assert pruned.block.heads == 2 and pruned.tok.embedding_dim == 32 and report["checked"]


def test_the_python_twin_never_writes_over_the_folder_it_pruned(tmp_path):
    """ptopt.prune('hf:P', ..., output=P) of an earlier ptopt output P (its folder check lets a previous
    artifact be replaced) wrote the pruned model over its own source: only files were kept from it."""
    from ptopt.core.errors import UsageError
    from tests.compress.hf_models import llama

    llama(512).save_pretrained(tmp_path / "llama")
    prune(f"hf:{tmp_path / 'llama'}", "l1-unstructured", 0.3, output=tmp_path / "p", progress=False)
    before = (tmp_path / "p" / "model.safetensors").read_bytes()
    with pytest.raises(UsageError, match="would overwrite"):
        prune(f"hf:{tmp_path / 'p'}", "l1-unstructured", 0.3, output=tmp_path / "p", progress=False)
    assert (tmp_path / "p" / "model.safetensors").read_bytes() == before


def test_split_sizes_follow_only_what_they_match():
    """``prune.split_sizes.follow_splits``: the old total and the old piece size follow; a bool, a private
    attribute and other numbers stay; two splits asking different values of one attribute set nothing."""
    import types

    from ptopt.compress.prune.split_sizes import follow_splits

    mod = types.SimpleNamespace(expand_chs=16, half=8, other=5, flag=True, _cache=16)
    done = follow_splits({"s": mod}, [("s", 8, 2, 6)])
    assert (mod.expand_chs, mod.half, mod.other, mod.flag, mod._cache) == (12, 6, 5, True, 16)
    assert done == ["s.expand_chs: 16 → 12", "s.half: 8 → 6"]
    clash = types.SimpleNamespace(width=16)
    assert follow_splits({"s": clash}, [("s", 8, 2, 6), ("s", 16, 1, 10)]) == [] and clash.width == 16


def test_the_failing_chain_drops_calls_whose_error_was_caught():
    """A forward that catches an error of one of its layers and goes on leaves no trace in the chain."""
    from ptopt.compress.prune.culprit import _failing_chain

    class Tolerant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bad, self.good = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)

        def forward(self, x):
            try:
                self.bad(x)  # 4 features given to a layer that reads 3: caught
            except RuntimeError:
                pass
            return self.good(x.T.T)[:, :5] @ torch.ones(3, 1)  # fails in the model's own code

    model = Tolerant()
    chain = _failing_chain(model, torch.randn(2, 4))
    assert [m for m, _ in chain] == [model]
