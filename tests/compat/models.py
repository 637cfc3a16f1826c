"""Real-world architectures with random weights at small sizes: factories for ``pkg.module:factory``.

``tests.compat.models:resnet18`` and friends build torchvision, timm and Hugging Face transformers
models from their libraries' configs (no download), small enough for CI: 32-64 px images, 2-layer
transformers with hidden size 64-128. None declares ``example_inputs()``: the Hugging Face models are described by their
config, the vision models by their first layer (see ``ptopt.core.modelref``).
"""

from __future__ import annotations

import glob
import importlib.util
import os

import torch
from torch import nn

#: image side of the vision models (keeps every stage of the suite fast on 2 cores)
IMAGE = 32
#: image side of the bigger vision models (ResNet-50, ConvNeXt-Tiny)
LARGE_IMAGE = 64
#: sequence length and vocabulary of the text models
SEQ = 16
VOCAB = 512


def ensure_torchvision_ops() -> None:
    """Make ``import torchvision`` work beside the CPU torch.

    PyPI's torchvision 0.28.0 is a CUDA build: its C++ ops (``_C.so``) need ``libtorch_cuda.so``, and
    without them ``import torchvision`` dies registering fake kernels for ``torchvision::nms``. The
    classification models use none of those ops, so defining the two op names (and nothing else)
    before the first import is enough. Where the extension does load (a CPU build), it is used as is.
    """
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None or hasattr(torch.ops.torchvision, "nms"):
        return
    for so in glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so")):
        try:
            torch.ops.load_library(so)
            return
        except OSError:
            break
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBS.append(lib)


_LIBS: list = []  # a Library deregisters its ops when garbage-collected


def settle_batchnorm(model: nn.Module, batches: int = 4, image: int = IMAGE) -> nn.Module:
    """Give BatchNorm the statistics of its inputs, as training would (random-init running stats
    make MobileNetV3 and EfficientNet output ~1e-10: nothing to compare). Returns it in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches below
    g = torch.Generator().manual_seed(1)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(16, 3, image, image, generator=g))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def _torchvision():
    ensure_torchvision_ops()
    import torchvision

    return torchvision


def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return settle_batchnorm(_torchvision().models.resnet18(num_classes=10))


def mobilenet_v3_small() -> nn.Module:
    torch.manual_seed(0)
    return settle_batchnorm(_torchvision().models.mobilenet_v3_small(num_classes=10))


def efficientnet_b0() -> nn.Module:
    torch.manual_seed(0)
    return settle_batchnorm(_torchvision().models.efficientnet_b0(num_classes=10))


def resnet50() -> nn.Module:
    """torchvision's ResNet-50, run at ``LARGE_IMAGE`` px (matrix script only: too slow for CI)."""
    torch.manual_seed(0)
    return settle_batchnorm(_torchvision().models.resnet50(num_classes=10), image=LARGE_IMAGE)


def convnext_tiny() -> nn.Module:
    """torchvision's ConvNeXt-Tiny (LayerNorm, no BatchNorm), run at ``LARGE_IMAGE`` px."""
    torch.manual_seed(0)
    return _torchvision().models.convnext_tiny(num_classes=10).eval()


def vit_tiny() -> nn.Module:
    """timm's ViT-Tiny at 32 px, patch 8, 2 blocks."""
    ensure_torchvision_ops()
    import timm

    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=IMAGE, patch_size=8, depth=2, num_classes=10
    ).eval()


def bert_classifier(
    vocab: int, hidden: int, layers: int, heads: int, ffn: int, positions: int, labels: int = 3
) -> nn.Module:
    """A random-weight Hugging Face BertForSequenceClassification of these sizes (seed 0), in eval mode:
    the one BERT builder of the tests and benchmarks."""
    ensure_torchvision_ops()
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=positions,
        num_labels=labels,
    )
    return BertForSequenceClassification(cfg).eval()


def bert() -> nn.Module:
    """A 2-layer BertForSequenceClassification, hidden 64."""
    return bert_classifier(VOCAB, hidden=64, layers=2, heads=2, ffn=128, positions=64)


def gpt2() -> nn.Module:
    """A 2-layer GPT2LMHeadModel, hidden 64, without the key/value cache (one forward per batch)."""
    ensure_torchvision_ops()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=2,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return GPT2LMHeadModel(cfg).eval()


class RNNClassifier(nn.Module):
    """Token ids → embedding → one LSTM or GRU layer → a two-layer head on the last step: the text
    classifier people write by hand (a plain tensor of ids in, no attention mask)."""

    def __init__(self, cell: str = "lstm", vocab: int = VOCAB, dim: int = 32, hidden: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(dim, hidden, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return self.head(out[:, -1])


def lstm_classifier() -> nn.Module:
    torch.manual_seed(0)
    return RNNClassifier("lstm").eval()


def gru_classifier() -> nn.Module:
    torch.manual_seed(0)
    return RNNClassifier("gru").eval()


# -- small models of the same shapes, for the shape-inference tests -----------------------------------


class PooledCNN(nn.Module):
    """Conv → global average pool → Linear: runs at any image size (what ``1x3x224x224`` suggests)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=4, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def pooled_cnn() -> nn.Module:
    torch.manual_seed(0)
    return PooledCNN().eval()


class TokenClassifier(nn.Module):
    """Token ids (one positional input) → embedding with learned positions → mean → Linear.

    ``forward`` reshapes the ids first (``view``), as GPT-2 does, before the embedding sees them.
    """

    def __init__(self, vocab: int = 100, positions: int = 64, dim: int = 16):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(positions, dim)
        self.fc = nn.Linear(dim, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.view(-1, ids.shape[-1])
        h = self.tokens(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.fc(h.mean(1))


def token_classifier() -> nn.Module:
    torch.manual_seed(0)
    return TokenClassifier().eval()
