"""validate judges an output per token ([N, T, ...], a sentence encoder's last_hidden_state) at the real
tokens of the data's attention_mask: all-MiniLM-L6-v2's OpenVINO int8 IR scored a worst cosine of 0.576
with its padding (the figure that export, judging real tokens, reported as 0.995) and 0.992 without."""

from __future__ import annotations

import torch
from torch import nn

from ptopt.validate.metrics import agreement

LATENCY = {"min_iters": 2, "min_seconds": 0.01, "rounds": 2}


class Encoder(nn.Module):
    def __init__(self, noise: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 8)
        self.noise = noise

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(input_ids)
        garbage = torch.sin(h * 1000 + 1) * self.noise  # what a lossy runtime leaves where nothing reads
        return torch.where((attention_mask == 0).unsqueeze(-1), h + garbage, h)


def _data() -> dict:
    ids = torch.randint(0, 50, (8, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(8, 6, dtype=torch.int64)
    mask[:, 3:] = 0
    return {"x": {"input_ids": ids, "attention_mask": mask}}


def test_api_per_token_outputs_are_judged_at_the_real_tokens():
    import ptopt

    res = ptopt.validate(
        Encoder().eval(), [Encoder(noise=5.0).eval()], _data(), batch_sizes=[2], threads=1, latency=LATENCY
    ).to_dict()
    agr = res["artifacts"][0]["agreement"]
    assert agr["min_cosine"] > 0.9999 and agr["max_abs_diff"] == 0.0, agr


def test_agreement_without_a_mask_or_per_sample_outputs_keeps_every_value():
    ref, out = torch.ones(2, 3, 4), torch.ones(2, 3, 4)
    out[:, 2] = -1.0
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert agreement(ref, out, mask=None)["min_cosine"] < 0.5
    assert agreement(ref, out, mask=mask)["min_cosine"] > 1 - 1e-12
    # [N, classes] scores: no tokens to mask, even when the classes number the tokens
    assert agreement(ref[:, 0, :3], -ref[:, 0, :3], mask=mask)["min_cosine"] < -1 + 1e-12


def test_isa_child_judges_per_token_outputs_at_the_real_tokens():
    """validate --isa / optimize's per-level figures (agreement, each sample's cosine) are those of the
    main table: a level's row showed the padding's cosine beside the native row's real-token one."""
    from ptopt.core.data import Dataset
    from ptopt.validate.api import evaluate_outputs
    from ptopt.validate.isa_child import _accuracy

    data = _data()
    ds = Dataset(data["x"], name="tokens")
    ref = Encoder().eval()
    job = {"allow_pickle": False, "threads": 1, "eval_batch_size": 4, "cosines": True}
    ref_out = evaluate_outputs(_runner(ref), ds, 4)
    fig = _accuracy(
        {"ref": Encoder(noise=5.0).eval(), "name": "noisy", "role": "artifact"}, job, ds, ref_out, None
    )
    assert fig["agreement"]["min_cosine"] > 0.9999 and fig["agreement"]["max_abs_diff"] == 0.0, fig
    assert min(fig["cosines"]) > 0.9999, fig["cosines"]


def _runner(module):
    from ptopt.validate.runners import open_runner

    runner = open_runner(module, "reference")
    runner.prepare(1)
    return runner
