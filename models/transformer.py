"""A small transformer-encoder classifier taking ``input_ids`` + ``attention_mask`` (keyword inputs)."""

from __future__ import annotations

import torch
from torch import nn


class TransformerClassifier(nn.Module):
    def __init__(
        self,
        vocab: int = 1 + 64 * 17,
        seq_len: int = 72,
        d_model: int = 64,
        heads: int = 4,
        layers: int = 2,
        ff: int = 128,
        num_classes: int = 10,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.vocab, self.seq_len = vocab, seq_len
        self.embed = nn.Embedding(vocab, d_model, padding_idx=0)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout, batch_first=True, norm_first=True)
        # nested tensors would make outputs depend on the padding layout; keep dense math
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, num_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos[:, : input_ids.shape[1]]
        h = self.encoder(h, src_key_padding_mask=attention_mask == 0)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (self.norm(h) * m).sum(1) / m.sum(1).clamp(min=1.0)  # mean over real tokens
        return self.fc(pooled)

    def example_inputs(self, batch: int = 1) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1, self.vocab, (batch, self.seq_len), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def transformer() -> TransformerClassifier:
    return TransformerClassifier()
