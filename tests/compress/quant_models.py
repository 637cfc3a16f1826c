"""Tiny models for the quantization tests, importable as ``tests.compress.quant_models:NAME``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TinyLSTM(nn.Module):
    """An 8×8 digit read as 8 rows of 8 pixels (takes the N×1×8×8 tensors of builtin:digits)."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.lstm = nn.LSTM(8, hidden, batch_first=True)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x.reshape(x.shape[0], 8, 8))
        out, _ = self.gru(out)
        return self.fc(out[:, -1])

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.rand(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def tiny_lstm() -> TinyLSTM:
    torch.manual_seed(0)
    return TinyLSTM()


class Gate(nn.Module):
    """Branches on the data: symbolic tracing (FX) cannot follow it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.gate = Gate()
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(x))
        x = self.gate(x)
        return self.fc(torch.flatten(x, 1))

    def example_inputs(self, batch: int = 2) -> torch.Tensor:
        return torch.rand(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def untraceable() -> Untraceable:
    torch.manual_seed(0)
    return Untraceable()


class OutlierMLP(nn.Module):
    """A transformer-style MLP block with one "massive activation" channel (as LLMs and ViTs have):
    channel 0 of ``block.fc1`` is ~1000× the others, and ``block.fc2`` barely reads it. Per-tensor
    int8 activations take their range from that channel, so every other channel rounds to zero:
    the int8 model's outputs no longer follow fp32's. Keeping the block's two Linears float fixes it.
    Takes N×16 features (``outlier_data``)."""

    def __init__(self, dim: int = 16, hidden: int = 64):
        super().__init__()
        self.embed = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.block = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.head = nn.Linear(dim, 10)
        with torch.no_grad():
            self.block[0].weight[0] *= 1000.0
            self.block[0].bias[0] = 2000.0
            self.block[2].weight[:, 0] *= 1e-4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(x))
        return self.head(h + self.block(h))


def outlier_mlp() -> OutlierMLP:
    torch.manual_seed(0)
    return OutlierMLP().eval()


def outlier_data(n: int = 128) -> torch.Tensor:
    return torch.randn(n, 16, generator=torch.Generator().manual_seed(1))


def outlier_calib() -> dict:
    """``outlier_data`` as a DATA reference (``tests.compress.quant_models:outlier_calib``)."""
    return {"x": outlier_data()}


def tiny_linear() -> nn.Module:
    """One 4×4 Linear: its int8 file (packed weights and their metadata) is larger than the fp32 one."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4)).eval()


def features4() -> dict:
    """16 samples of 4 features (DATA for ``tiny_linear``)."""
    return {"x": torch.randn(16, 4, generator=torch.Generator().manual_seed(0))}


class ScaledBlock(nn.Module):
    """A ConvNeXt-style residual block with a parameter of its own (``layer_scale``), used as a tensor."""

    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.layer_scale = nn.Parameter(torch.full((c, 1, 1), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layer_scale * F.relu(self.conv(x))


class ScaledNet(nn.Module):
    """Stem conv, two ``ScaledBlock``s, global pool, Linear: N×1×8×8 digits."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1)
        self.blocks = nn.Sequential(ScaledBlock(16), ScaledBlock(16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.stem(x)))
        return self.fc(x.mean((2, 3)))


def scaled_net() -> ScaledNet:
    torch.manual_seed(0)
    return ScaledNet().eval()


class RankBranch(nn.Module):
    """Branches on its input's rank: torch.fx cannot follow that (``x.dim()`` is a Proxy), torch.export
    can (the rank is static), so static int8 runs on ``--engine pt2e`` only."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:
            x = x.flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


def rank_branch() -> RankBranch:
    torch.manual_seed(0)
    return RankBranch().eval()


def features16() -> dict:
    """64 samples of 16 features (DATA for ``rank_branch``)."""
    return {"x": torch.randn(64, 16, generator=torch.Generator().manual_seed(0))}


class TiedLM(nn.Module):
    """A tiny language model whose output layer is its embedding (``lm_head.weight is embed.weight``),
    as GPT-2, BERT's MLM head and most decoders tie them."""

    def __init__(self, vocab: int = 600, dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return self.lm_head(h + self.mlp(h))


def tied_lm() -> TiedLM:
    torch.manual_seed(0)
    return TiedLM().eval()


def tied_tokens(n: int = 16, seq: int = 12) -> dict:
    return {"x": torch.randint(0, 600, (n, seq), generator=torch.Generator().manual_seed(1))}


class SharedVocab(nn.Module):
    """One matrix held by three embeddings and the output layer, as T5 ties ``shared``, the encoder's
    and the decoder's ``embed_tokens`` and ``lm_head``."""

    def __init__(self, vocab: int = 600, dim: int = 64):
        super().__init__()
        self.shared = nn.Embedding(vocab, dim)
        self.enc_embed = nn.Embedding(vocab, dim)
        self.dec_embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.enc_embed.weight = self.dec_embed.weight = self.lm_head.weight = self.shared.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.mix(self.enc_embed(ids) + self.dec_embed(ids.flip(1))))


def shared_vocab() -> SharedVocab:
    torch.manual_seed(0)
    return SharedVocab().eval()


@torch.fx.wrap
def _signed(x: torch.Tensor) -> torch.Tensor:
    """Data-dependent: torch.fx calls it as one function (wrapped), torch.export cannot capture it."""
    return x if bool(x.sum() >= 0) else -x


class GatedOneLayer(nn.Module):
    """One Linear whose input has a massive channel it barely reads: int8 of its input rounds every other
    channel to zero, and with its only layer float nothing is int8. Behind ``_signed``: fx only."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 10)
        with torch.no_grad():
            self.fc.weight[:, 0] *= 1e-4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.cat([torch.full((1,), 1000.0), torch.ones(15)])
        return self.fc(_signed(x))


def gated_one_layer() -> GatedOneLayer:
    torch.manual_seed(0)
    return GatedOneLayer().eval()


class RobertaPositions(nn.Module):
    """What broke PT2E on real models, small: position ids counted from the token ids (RoBERTa's
    ``cumsum(ids != pad) + pad``, an integer add the quantizer used to observe) and a residual block
    that applies one ReLU module twice (torchvision's BasicBlock: one partition with two outputs)."""

    def __init__(self, vocab: int = 50, dim: int = 8):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(64, dim)
        self.conv1 = nn.Conv1d(dim, dim, 3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(dim, 3)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mask = input_ids.ne(1).int()
        pos = torch.cumsum(mask, dim=1) * mask + 1
        h = (self.tokens(input_ids) + self.positions(pos)).transpose(1, 2)
        out = self.relu(self.conv1(h))
        out = self.relu(self.conv2(out) + h)
        return self.fc(out.mean(2))


def roberta_positions() -> RobertaPositions:
    torch.manual_seed(0)
    return RobertaPositions().eval()


def position_tokens() -> dict:
    """32 sequences of 12 token ids, the last ones padding (id 1)."""
    ids = torch.randint(2, 50, (32, 12), generator=torch.Generator().manual_seed(0))
    ids[:, 9:] = 1
    return {"x": ids}


class ReadsWeight(nn.Module):
    """torchvision's Swin attention, small: the parent reads ``self.qkv.weight`` and calls ``F.linear``
    itself (the layer is never called); dynamic int8 must leave that layer float."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.qkv = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(F.linear(x, self.qkv.weight, self.qkv.bias)))


def reads_weight() -> ReadsWeight:
    torch.manual_seed(0)
    return ReadsWeight().eval()


class SamePadConv(nn.Conv2d):
    """A convolution subclass with "same" padding of its own (EfficientNet-Lite's
    ``Conv2dStaticSamePadding``): it pads, then calls ``F.conv2d`` itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.pad(x, (1, 1, 1, 1)), self.weight, self.bias, self.stride, 0)


class SamePadNet(nn.Module):
    """Two ``SamePadConv`` layers and a Linear head over N×1×8×8 digits."""

    def __init__(self):
        super().__init__()
        self.conv1 = SamePadConv(1, 8, 3)
        self.conv2 = SamePadConv(8, 8, 3)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


def same_pad_net() -> SamePadNet:
    torch.manual_seed(0)
    return SamePadNet().eval()


class WeightNormed(nn.Module):
    """A weight-normalised Conv1d (wav2vec2's positional convolution: ``parametrizations.weight`` holds
    ``original0`` / ``original1``) before a Linear: PT2E's x86 quantizer leaves the Conv1d float."""

    def __init__(self):
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 8, 3, padding=1), dim=2)
        self.fc = nn.Linear(8 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def weight_normed() -> WeightNormed:
    torch.manual_seed(0)
    return WeightNormed().eval()


def sequences16() -> dict:
    """64 samples of 4 channels x 16 steps for ``weight_normed``."""
    return {"x": torch.randn(64, 4, 16, generator=torch.Generator().manual_seed(0))}
