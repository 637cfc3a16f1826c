"""LSTM classifier: a 32×32 digit read as 32 rows of 32 pixels."""

from __future__ import annotations

import torch
from torch import nn


class LSTMClassifier(nn.Module):
    def __init__(self, input_size: int = 32, hidden: int = 512, layers: int = 2, num_classes: int = 10,
                 seq_len: int = 32):
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
    # 2 layers of 512: smaller LSTMs are dominated by per-step overhead and dynamic int8 gains < 2x at
    # batch 1 (measured here with 2 threads, p50: 512×1 1.45x, 1024×1 2.0x, 768×2 2.31x, 512×2 2.63x)
    return LSTMClassifier()
