"""Structured pruning of Swin at small images and in shallow configs: every Swin attention used to keep
its heads (0.83x of the parameters at 0.3, "the model with fewer heads does not compute what the
original computes without them (max difference 0.007)"), though the pruned heads were right.

Two causes, neither in the heads: the check's reference was wrong where a stream is pruned into a
patch merging (its LayerNorm normalises four concatenated copies of the stream: a concatenation is no
group's member, so that norm was never replayed on the kept channels), and a stream crossing a shifted
window was never pruned at all (``roll(x, shifts, dims)``: the shifts were read as the dims, and a
shift of 3 or -1 on a rank-4 tensor named the channel dim). Small images meet the first because a
feature map no larger than the window is not shifted (two such stages in a row: a patch merging
between pruned streams); at 224 the second hid it (only the last, unshifted, stage lost channels)."""

from __future__ import annotations

import re
import warnings

import torch

from ptopt.compress.prune.techniques.structured import analyse, structured_prune
from tests.compress.test_prune_structured_graph import _needs


def shallow_swin() -> torch.nn.Module:
    """One block per stage (none shifted) and 2x2-window-sized maps at 32x32: stages 2 and 3 both lose
    channels, with a patch merging between them."""
    _needs("torchvision")
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.swin_transformer.SwinTransformer(
        patch_size=[4, 4],
        embed_dim=32,
        depths=[1, 1, 1],
        num_heads=[2, 4, 8],
        window_size=[4, 4],
        num_classes=10,
    ).eval()


def _prune(model, x):
    before = sum(p.numel() for p in model.parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pruned, report = structured_prune(model, x, 0.3)
    notes = [str(w.message) for w in caught]
    return pruned, report, sum(p.numel() for p in pruned.parameters()) / before, notes


def _image(size: int) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))


def test_a_norm_over_concatenated_channels_is_replayed_on_the_kept_ones():
    """torchvision Swin's patch merging: ``cat([x0, x1, x2, x3], -1)`` then LayerNorm(4C). The check ran
    that norm over the removed channels too, differed by 0.007 and kept every head (0.83x)."""
    model, x = shallow_swin(), _image(32)
    _, groups, _ = analyse(model, x, hidden=True)
    stage2 = next(g for g in groups if "features.3.0.attn.proj" in g.producers)
    assert stage2.inexact and "features.4.norm" in [n[0] for n in stage2.norms]
    pruned, report, ratio, notes = _prune(model, x)
    assert not any("keeps its heads" in n or "keeps its attention heads" in n for n in notes), notes
    assert report["checked"] is True and ratio < 0.6  # it was 0.830
    assert [pruned.features[i][0].attn.num_heads for i in (1, 3, 5)] == [2, 3, 6]
    assert pruned.features[4].norm.normalized_shape == (4 * pruned.features[3][0].attn.qkv.in_features,)
    assert pruned(x).shape == (2, 10)
    for i in (3, 5):
        _assert_whole_heads_removed(model.features[i][0].attn, pruned.features[i][0].attn)


def _assert_whole_heads_removed(a, b) -> None:
    """``b`` (pruned) holds exactly the q/k/v rows, the relative-position-bias column and the proj input
    columns of the heads it kept (found by their bias columns), at the input channels it kept."""
    table, kept = a.relative_position_bias_table, b.relative_position_bias_table
    heads = [
        next(j for j in range(a.num_heads) if torch.equal(table[:, j], kept[:, i]))
        for i in range(b.num_heads)
    ]
    width, size = a.qkv.in_features, a.qkv.in_features // a.num_heads
    inner = [h * size + r for h in heads for r in range(size)]
    rows = [part * width + c for part in range(3) for c in inner]
    w = a.qkv.weight[rows]
    cols = [
        next(j for j in range(width) if torch.equal(w[:, j], b.qkv.weight[:, i]))
        for i in range(b.qkv.in_features)
    ]
    assert b.num_heads < a.num_heads and len(set(heads)) == b.num_heads
    assert torch.equal(b.qkv.weight, w[:, cols]) and torch.equal(b.qkv.bias, a.qkv.bias[rows])
    assert torch.equal(b.proj.weight, a.proj.weight[cols][:, inner]) and torch.equal(
        b.proj.bias, a.proj.bias[cols]
    )


def test_a_stream_across_shifted_windows_is_pruned():
    """``torch.roll(x, shifts=(1, 1), dims=(1, 2))`` on (B, H, W, C): shift 1 read as a dim is -1 % 4 = the
    channel dim, so every stage with shifted windows kept its width (0.83x here)."""
    _needs("torchvision")
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.swin_transformer.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[3, 3], num_classes=10
    ).eval()
    x = _image(32)  # 8x8 and 4x4 maps: both stages shift by 1
    _, groups, _ = analyse(model, x, hidden=True)
    stage2 = next(g for g in groups if "features.3.1.attn.proj" in g.producers)
    assert stage2.prunable and not any("roll" in why for why in stage2.frozen), stage2.frozen
    pruned, report, ratio, _ = _prune(model, x)
    assert report["checked"] is True and ratio < 0.7  # it was 0.826
    assert pruned.features[3][1].attn.num_heads == 3 and pruned.features[3][1].attn.qkv.in_features == 24


class _Rolled(torch.nn.Module):
    def __init__(self, flat: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.flat = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4), flat

    def forward(self, x):  # (B, T, 8)
        h = self.fc1(x)
        if self.flat == "dim0":  # an explicit dims=0, not "no dims"
            return self.fc2(torch.roll(h, 1, 0))
        return self.fc2(torch.roll(h, 1) if self.flat else torch.roll(h, 2, 1))  # shifts 2 along dim 1


def test_roll_moves_positions_not_channels():
    """``roll(h, 2, 1)``: positional shifts 2 are not dim 2 (the channels); ``roll(h, 1)`` with no dims
    rolls the flattened tensor, mixing channels with positions: those stay."""
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2))
    for graph in ("fx", "export"):
        _, groups, _ = analyse(_Rolled(), x, prune_first_last=True, graph=graph)
        assert next(g for g in groups if g.producers == ["fc1"]).prunable, graph
        _, groups, _ = analyse(_Rolled(flat=True), x, prune_first_last=True, graph=graph)
        assert not next(g for g in groups if g.producers == ["fc1"]).prunable, graph
    pruned, _ = structured_prune(_Rolled(), x, 0.5, prune_first_last=True)
    assert pruned.fc1.out_features == 8 and pruned(x).shape == (2, 5, 4)


def test_roll_along_dim_0_moves_positions_not_channels():
    """``roll(h, 1, 0)``: dims=0 was read as no dims at all (``0 or every dim``) on the FX graph, so the
    channels counted as mixed and fc1 kept them all."""
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2))
    for graph in ("fx", "export"):
        _, groups, _ = analyse(_Rolled(flat="dim0"), x, prune_first_last=True, graph=graph)
        assert next(g for g in groups if g.producers == ["fc1"]).prunable, graph


def test_hugging_face_swin_with_unshifted_stages_prunes():
    """Hugging Face Swin (one block per stage): its patch merging is a concatenation too; structured
    pruning refused it ("the model with fewer heads does not compute ... (max difference 0.0016)")."""
    _needs("transformers")
    import transformers

    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1, 1],
                                     num_heads=[1, 2, 4], window_size=4, num_labels=3)  # fmt: skip
    model = transformers.SwinForImageClassification(config).eval()
    _, report, ratio, _ = _prune(model, _image(64))
    assert report["checked"] is True and ratio < 0.6


def test_timm_swin_patch_merging_norm_is_checked():
    """timm's patch merging flattens four copies of the stream (``reshape``, ``permute``, ``flatten(3)``)
    before its LayerNorm(4C): the norm was recorded as C wide, its replay never ran, and the pruned model
    went unchecked (``checked: False``) wherever a stream into a patch merging lost channels."""
    _needs("timm")
    import timm

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=10, img_size=32,
                              depths=(1, 1, 1), embed_dim=16, num_heads=(1, 2, 4)).eval()  # fmt: skip
    pruned, report, ratio, _ = _prune(model, _image(32))
    assert report["checked"] is True and ratio < 0.65
    assert (
        pruned.layers[2].downsample.norm.normalized_shape[0]
        == 4 * pruned.layers[1].blocks[0].attn.qkv.in_features
    )


def test_cli_prunes_a_shallow_swin_with_its_heads(cli, tmp_path):
    code, out, err = cli("prune", "tests.compress.test_prune_swin:shallow_swin", "--method", "structured",
                         "--amount", "0.3", "--input-shape", "1x3x32x32", "-o", tmp_path / "s.pt")  # fmt: skip
    assert code == 0, err
    assert "keeps its heads" not in out + err and "keeps its attention heads" not in out + err
    ratio = float(re.search(r"parameters: [\d,]+ → [\d,]+ \(([\d.]+)×", out).group(1))
    assert ratio < 0.6, out
