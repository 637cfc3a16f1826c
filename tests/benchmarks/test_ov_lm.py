"""benchmarks/ov_lm.py (bench_llm's NNCF + OpenVINO peer) on a tiny random Llama: the converted IR,
made stateful, computes what the torch model computes (perplexity, greedy tokens with the cache, a
second sequence after the first), and NNCF's int8 weights shrink it."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.conftest import REPO

pytest.importorskip("openvino")
pytest.importorskip("nncf")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    spec = importlib.util.spec_from_file_location("ptopt_ov_lm_under_test", REPO / "benchmarks" / "ov_lm.py")
    ov_lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ov_lm)
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    model = tf.LlamaForCausalLM(cfg).eval()
    ir = ov_lm.convert(model, tmp_path_factory.mktemp("ov") / "tiny.xml")
    return ov_lm, model, ir


def _greedy(module, prompt, new):
    from ptopt.core.lm import cache_keyword

    key, tokens = cache_keyword(module), []
    with torch.inference_mode():
        out = module(input_ids=prompt, use_cache=True)
        for _ in range(new):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(int(nxt))
            out = module(input_ids=nxt, use_cache=True, **{key: out[key]})
    return tokens


def test_the_ir_computes_what_the_model_computes_with_and_without_the_cache(tiny):
    from ptopt.core.lm import generation_speed, perplexity

    ov_lm, model, ir = tiny
    ids = torch.randint(0, 300, (200,), generator=torch.Generator().manual_seed(1))
    runner = ov_lm.OpenVINOLM(ir, model.config, threads=1, precision="f32")
    got, want = perplexity(runner, ids, context=64, stride=32), perplexity(model, ids, context=64, stride=32)
    assert got["tokens"] == want["tokens"] and got["perplexity"] == pytest.approx(
        want["perplexity"], rel=1e-4
    )
    for start in (0, 20):  # a second sequence starts from an empty cache
        prompt = ids[start : start + 12].reshape(1, -1)
        assert _greedy(runner, prompt, 8) == _greedy(model, prompt, 8)
    with pytest.raises(ValueError, match="one sequence at a time"):
        runner(input_ids=ids[:1].reshape(1, 1), use_cache=True, past_key_values=3)
    assert generation_speed(runner, ids[:12], 4)["decode_tokens_per_s"] > 0
    assert runner.precision == "f32" and runner.file_bytes() > ov_lm.constant_bytes(ir) > 0


def test_nncf_int8_weights_are_smaller_and_close(tiny, tmp_path):
    from ptopt.core.lm import perplexity

    ov_lm, model, ir = tiny
    int8 = ov_lm.compress(ir, tmp_path / "int8.xml", "int8_asym")
    assert ov_lm.constant_bytes(int8) < 0.35 * ov_lm.constant_bytes(ir)
    ids = torch.randint(0, 300, (128,), generator=torch.Generator().manual_seed(2))
    got = perplexity(
        ov_lm.OpenVINOLM(int8, model.config, threads=1, precision="f32"), ids, context=64, stride=32
    )
    assert got["perplexity"] == pytest.approx(
        perplexity(model, ids, context=64, stride=32)["perplexity"], rel=0.02
    )
