"""A text-and-image model (CLIP: input_ids, attention_mask and pixel_values in one call) through dynamic
int8: its output holds each tower's whole output as a nested ModelOutput, which torch.jit.trace cannot
type ("Tracer cannot infer type of CLIPOutput", exit 2). The int8 TorchScript now returns one flat dict
of every output tensor, named as ptopt's comparisons name them (``formats.capture.flat_tensors``)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")


def test_cli_clip_dynamic_int8_returns_every_output_tensor_flat(cli, tmp_path):
    from tests.compat.prune_families import clip

    out_path = tmp_path / "clip.int8.pt"
    code, out, err = cli("quantize", "tests.compat.prune_families:clip", "--mode", "dynamic", "-o", out_path)
    assert code == 0, out + err
    names = [
        s["name"] for s in json.loads(out_path.with_name("clip.int8.pt.ptopt.json").read_text())["inputs"]
    ]
    assert names == ["input_ids", "attention_mask", "pixel_values"]
    g = torch.Generator().manual_seed(0)
    x = {"input_ids": torch.randint(0, 100, (3, 9), generator=g), "attention_mask": torch.ones(3, 9, dtype=torch.long),
         "pixel_values": torch.randn(3, 3, 32, 32, generator=g)}  # fmt: skip
    got = torch.jit.load(str(out_path))(**x)
    with torch.no_grad():
        ref = clip()(**x)
    assert {"logits_per_image", "text_embeds", "text_model_output.pooler_output"} <= set(got)
    cos = torch.nn.functional.cosine_similarity(got["image_embeds"], ref.image_embeds, dim=-1)
    assert float(cos.min()) > 0.98, cos
