"""Structured pruning across architecture families: tiny random-weight models built from their
libraries' configs, each exercising ops the channel analysis must follow.

| family | what it exercises |
| --- | --- |
| ``shufflenet`` | torchvision ShuffleNetV2: channel shuffle (``view``/``transpose``/``view``), ``chunk``, ``cat`` |
| ``mobilenet_timm`` | timm MobileNetV3: ``BatchNormAct2d`` (a BatchNorm subclass), depthwise convs, SE |
| ``convnext_timm`` | timm ConvNeXt: ``permute`` to channels-last, LayerNorm, layer scale (a parameter) |
| ``swin`` | timm Swin: windows (``view``/``permute``), per-head relative position bias table |
| ``distilbert`` | Hugging Face DistilBERT: q/k/v ``view`` into heads, ``transpose``, masks |
| ``t5_encoder`` | Hugging Face T5 encoder: RMS norm written in Python, relative position bias |
| ``wav2vec2`` | Hugging Face wav2vec2: conv feature extractor, GroupNorm, grouped positional conv |
| ``llama`` | Hugging Face Llama: grouped-query attention (``repeat_kv``), rotary slices, gated MLP |
| ``csp_timm`` | timm CS3DarkNet: ``CrossStage3`` splits its channels at ``self.expand_chs // 2`` (followed) |

``FAMILIES`` maps a name to (factory, input shape or None: the model's config says). The test
``tests/compat/test_prune_families.py`` runs them; ``python -m tests.compat.prune_families`` prints
each one's parameters kept at ``--amount 0.3`` (with ``--no-prune-hidden`` and by default), whether
the pruned model was checked against the masked unpruned one, and seconds.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.compat.models import ensure_torchvision_ops


def _timm(name: str, **kw) -> nn.Module:
    ensure_torchvision_ops()
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10, **kw).eval()


def _hf(config: str, model: str, **kw) -> nn.Module:
    ensure_torchvision_ops()
    import transformers

    torch.manual_seed(0)
    return getattr(transformers, model)(getattr(transformers, config)(**kw)).eval()


def shufflenet() -> nn.Module:
    ensure_torchvision_ops()
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=10)
    return m.eval()


def mobilenet_timm() -> nn.Module:
    return _timm("mobilenetv3_small_050")


def csp_timm() -> nn.Module:
    return _timm("cs3darknet_s")


def convnext_timm() -> nn.Module:
    return _timm("convnext_atto", depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), ls_init_value=0.5)


def swin() -> nn.Module:
    return _timm(
        "swin_tiny_patch4_window7_224",
        img_size=56,
        depths=(1, 1),
        embed_dim=16,
        num_heads=(2, 4),
    )


_TEXT = dict(vocab_size=100, max_position_embeddings=32)


def distilbert() -> nn.Module:
    return _hf(
        "DistilBertConfig",
        "DistilBertForSequenceClassification",
        dim=32,
        n_layers=1,
        n_heads=4,
        hidden_dim=64,
        **_TEXT,
    )


def t5_encoder() -> nn.Module:
    return _hf(
        "T5Config", "T5EncoderModel", vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4
    )


def wav2vec2() -> nn.Module:
    return _hf(
        "Wav2Vec2Config",
        "Wav2Vec2ForSequenceClassification",
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4,
        classifier_proj_size=16,
    )


def llama() -> nn.Module:
    return _hf(
        "LlamaConfig",
        "LlamaForCausalLM",
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        **_TEXT,
    )


def albert() -> nn.Module:
    """ALBERT: one layer's weights shared by both passes; the embeddings (32) projected to the hidden size (64)."""
    return _hf(
        "AlbertConfig",
        "AlbertForSequenceClassification",
        hidden_size=64,
        embedding_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        **_TEXT,
    )


def modernbert() -> nn.Module:
    """ModernBERT: one ``Wi`` makes the FFN's input and gate (2 x ``intermediate_size``), rotary attention."""
    return _hf(
        "ModernBertConfig",
        "ModernBertForSequenceClassification",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        global_attn_every_n_layers=2,
        local_attention=8,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        **_TEXT,
    )


def dinov2() -> nn.Module:
    """DINOv2: its config says the FFN width only as ``mlp_ratio`` (no per-layer width), its head size as
    ``head_dim``."""
    return _hf(
        "Dinov2Config",
        "Dinov2ForImageClassification",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        mlp_ratio=2,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )


def vit_hf() -> nn.Module:
    """A Hugging Face ViT image classifier (``pixel_values``; not in ``FAMILIES``: for ``inspect``)."""
    return _hf(
        "ViTConfig",
        "ViTForImageClassification",
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=10,
    )


def clip() -> nn.Module:
    """A Hugging Face CLIP (texts and images in one call; each tower's sizes in its own sub-config; not in
    ``FAMILIES``: for ``inspect`` and pruning into a folder)."""
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    return _hf(
        "CLIPConfig",
        "CLIPModel",
        text_config=dict(tower, vocab_size=100, max_position_embeddings=16, bos_token_id=0, eos_token_id=2),
        vision_config=dict(tower, image_size=32, patch_size=8),
        projection_dim=16,
    )


def roberta() -> nn.Module:
    """A RoBERTa classifier with a 20-row position table (positions start past ``padding_idx``:
    18 tokens fit; not in ``FAMILIES``: for ``inspect``)."""
    return _hf(
        "RobertaConfig",
        "RobertaForSequenceClassification",
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=20,
    )


#: name -> (factory, --input-shape or None when the model's config says)
FAMILIES = {
    "shufflenet": (shufflenet, "1x3x32x32"),
    "mobilenet_timm": (mobilenet_timm, "1x3x32x32"),
    "convnext_timm": (convnext_timm, "1x3x32x32"),
    "swin": (swin, "1x3x56x56"),
    "distilbert": (distilbert, None),
    "t5_encoder": (t5_encoder, None),
    "wav2vec2": (wav2vec2, None),
    "llama": (llama, None),
    "csp_timm": (csp_timm, "1x3x32x32"),
}


def prune_family(name: str, amount: float = 0.3, **options):
    """(the Result of ``ptopt.prune(model, "structured", amount, **options)``, the parameters kept as a
    fraction)."""
    import ptopt

    factory, shape = FAMILIES[name]
    model = factory()
    before = sum(p.numel() for p in model.parameters())
    res = ptopt.prune(model, "structured", amount, input_shapes=(shape,) if shape else (), **options)
    return res, sum(p.numel() for p in res.model.parameters()) / before


def main() -> int:
    import time
    import warnings

    warnings.simplefilter("ignore")
    print("| family | kept, --no-prune-hidden | kept (default) | checked | seconds |")
    print("| --- | --- | --- | --- | --- |")
    for name in FAMILIES:
        _, kept_hidden = prune_family(name, prune_hidden=False)
        t = time.perf_counter()
        res, kept = prune_family(name)
        checked = "yes" if res.extra["checked_vs_masked"] else "no"
        print(
            f"| {name} | {kept_hidden:.3f} | {kept:.3f} | {checked} | {time.perf_counter() - t:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
