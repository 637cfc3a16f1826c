"""LSTM classifier: a 32×32 digit read as 32 rows of 32 pixels."""

from __future__ import annotations

import torch
from torch import nn


class LSTMClassifier(nn.Module):
    def __init__(
        self,
        input_size: int = 32,
        hidden: int = 1152,
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
    """The zoo's LSTM classifier: one layer of 1152 (5.5 M parameters).

    Sized so that dynamic int8 pays off at batch 1 with 2 threads, as it does for the speech and
    text LSTMs people quantize: its fp32 weights (22 MB) crowd a shared 32 MB L3, int8 weights
    (5.5 MB) don't. Smaller LSTMs are dominated by the per-step elementwise work of torch's
    quantized LSTM (about 20 ops per step, against oneDNN's fused fp32 kernel), and gain less.
    Sizes tried here with random weights (2 threads, p50, interleaved, fp32 eager vs traced dynamic
    int8, batch 1): 2×512 1.52x, 1×1024 2.15-2.24x, 2×1024 2.15x, 1×1152 3.05x, 1×1280 3.25x,
    1×1536 5.56x. The trained 1×1152 in benchmarks/bench_quantize.py: 2.29-2.34x.
    """
    return LSTMClassifier()
