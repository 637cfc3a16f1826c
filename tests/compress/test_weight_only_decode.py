"""``quantize --mode weight-only --decode-step N``: the decode step as a torch.export ExportedProgram
with a static KV cache, written into the weight-only folder after a replay check (issue 28). A
small random-weight Llama from a config: these tests check the mechanics, not accuracy."""

from __future__ import annotations

import json

import pytest
import torch

import ptopt
from ptopt.core.hf import import_transformers
from ptopt.core.modelref import load_model
from ptopt.formats.hf_decode import DECODE_FILE
from tests.helpers import assert_refused, torchao

VOCAB = 256


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    tf = import_transformers()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("llama") / "llama"
    tf.LlamaForCausalLM(cfg).eval().save_pretrained(path)
    return path


def _replay(step, ids):
    with torch.inference_mode():
        return torch.stack(
            [
                step(input_ids=ids[:, i : i + 1], cache_position=torch.tensor([i]))[0, -1]
                for i in range(ids.shape[1])
            ]
        ).float()


def test_api_writes_a_decode_step_that_replays_the_folders_model(lm_dir, tmp_path):
    out = tmp_path / "llama.int8"
    res = ptopt.quantize(f"hf:{lm_dir}", "weight-only", out, decode_step=32, group_size=32)
    step_rec = res.extra["weight_only"]["decode_step"]
    assert step_rec["file"] == DECODE_FILE and step_rec["max_cache_len"] == 32
    assert step_rec["check"]["worst_cosine"] >= 0.999 and step_rec["check"]["tokens"] == 16
    assert json.loads((out / "quantization.json").read_text())["decode_step"]["max_cache_len"] == 32
    # a user's own loop: torchao first, then plain torch.export.load; same logits as the folder's model
    torchao()

    step = torch.export.load(out / DECODE_FILE).module()
    model = load_model(out).module
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        ref = model(input_ids=ids).logits[0].float()
    got = _replay(step, ids)
    assert float(torch.nn.functional.cosine_similarity(got, ref, dim=-1).min()) > 0.999
    # without the option the folder has no decode step
    plain = ptopt.quantize(f"hf:{lm_dir}", "weight-only", tmp_path / "plain", group_size=32)
    assert "decode_step" not in plain.extra["weight_only"] and not (tmp_path / "plain" / DECODE_FILE).exists()


def test_cli_int4_decode_step_is_reported(cli, lm_dir, tmp_path):
    out = tmp_path / "llama.int4"
    code, stdout, stderr = cli(
        "quantize", lm_dir, "--mode", "weight-only", "--bits", "4", "--group-size", "32",
        "--decode-step", "24", "-o", out,
    )  # fmt: skip
    assert code == 0, stderr
    assert f"decode step: {out}/{DECODE_FILE} (ExportedProgram, static KV cache of 24 tokens" in stdout
    assert (out / DECODE_FILE).stat().st_size > 0
    sidecar = json.loads((tmp_path / "llama.int4.ptopt.json").read_text())
    assert sidecar["extra"]["weight_only"]["decode_step"]["max_cache_len"] == 24
    assert f"llama.int4/{DECODE_FILE}" in sidecar["files"]  # hashed with the folder: a stale copy is caught


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--decode-step", "1"), "KV cache's length in tokens (>= 2)"),
        (("--decode-step", "-4"), "KV cache's length in tokens (>= 2)"),
        (("--decode-step", "500"), "the model's positions end at 128"),
    ],
    ids=["one", "negative", "past-positions"],
)
def test_cli_decode_step_refusals_write_nothing(cli, lm_dir, tmp_path, args, match):
    assert_refused(cli, "quantize", lm_dir, "--mode", "weight-only", *args, "-o", tmp_path / "never",
                   match=match, where=tmp_path)  # fmt: skip


def test_decode_step_belongs_to_weight_only(cli, lm_dir, tmp_path):
    assert_refused(cli, "quantize", lm_dir, "--mode", "dynamic", "--decode-step", "16", "-o", tmp_path / "x.pt",
                   match="--decode-step applies to --mode weight-only", where=tmp_path)  # fmt: skip
    assert_refused(ptopt.quantize, lm_dir, "dynamic", decode_step=16, match="--decode-step applies to")
