"""LSTM classifier: a 32×32 digit read as 32 rows of 32 pixels."""

from __future__ import annotations

import torch
from torch import nn


class LSTMClassifier(nn.Module):
    def __init__(
        self,
        input_size: int = 32,
        hidden: int = 768,
        layers: int = 1,
        num_classes: int = 10,
        seq_len: int = 32,
    ):
        super().__init__()
        self.input_size, self.seq_len = input_size, seq_len
        self.lstm = nn.LSTM(input_size, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])

    def example_inputs(self, batch: int = 1) -> torch.Tensor:
        return torch.randn(batch, self.seq_len, self.input_size, generator=torch.Generator().manual_seed(0))


def lstm() -> LSTMClassifier:
    """The zoo's LSTM classifier: one layer of 768 (2.5 M parameters).

    Sized so that dynamic int8 pays off at batch 1 with 2 threads, as it does for the speech and
    text LSTMs people quantize, while its trained weights still ship with ptopt (4.9 MB as float16).
    Smaller LSTMs are dominated by the per-step elementwise work of torch's quantized LSTM (about 20
    ops per step, against oneDNN's fused fp32 kernel), and gain less; larger ones gain more as their
    fp32 weights leave the cache. Measured with random weights (2 threads, p50 of 15 interleaved
    rounds, traced fp32 vs traced dynamic int8; AMD EPYC with avx2, avx512f, avx512_vnni):
    1×640 2.45x at batch 1, 1.27x at batch 32; 1×768 2.64x / 1.36x; 1×1152 3.67x / 2.21x. On an
    AVX2-only EPYC earlier: 2×512 1.52x, 1×1024 2.15-2.24x at batch 1.
    """
    return LSTMClassifier()
