"""``ptopt export`` of causal language models with their KV cache as explicit inputs and outputs (issue 41):
ONNX in optimum's layout for four families, ExportedProgram, OpenVINO's stateful IR; each checked against
transformers' greedy generation at export, read back by plain runtimes, scored by ``ptopt validate``; bad
input refused. Tiny random-weight decoders (``tests.export.lm_models``); the check's generation is short
where the test is about something else."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import ptopt
from ptopt.core.errors import UnsupportedModelError, UsageError
from ptopt.core.hf import load_causal_lm
from tests.export.lm_models import FAMILIES, POSITIONS, VOCAB, save
from tests.helpers import assert_refused

NEW = 8  # greedy tokens checked at export where the test is not about the check itself
FAST = {"rounds": 1, "prompt_tokens": 16, "new_tokens": 3, "progress": None}


@pytest.fixture(scope="module")
def lms(tmp_path_factory):
    """{family: folder} for the four families (Llama with two layers), a sliding-window Mistral folder,
    token ids and the same ids as text (the folders' word tokenizer reads ``w7`` as id 7)."""
    root = tmp_path_factory.mktemp("lms")
    out = {f: save(f, root / f, layers=2 if f == "llama" else 1) for f in FAMILIES}
    out["mistral"] = save("mistral", root / "mistral")
    ids = torch.randint(3, VOCAB, (300,), generator=torch.Generator().manual_seed(5))
    torch.save(ids, root / "ids.pt")
    (root / "text.txt").write_text(" ".join(f"w{i}" for i in ids.tolist()), encoding="utf-8")
    return out | {"ids": root / "ids.pt", "text": root / "text.txt", "root": root}


@pytest.fixture(scope="module")
def llama_onnx(lms):
    """The two-layer Llama exported to ONNX (32 greedy tokens checked: the default), saved."""
    path = lms["root"] / "llama-onnx"
    res = ptopt.export(f"hf:{lms['llama']}", "onnx", path)
    return res, path


def _names(layers: int) -> tuple[list[str], list[str]]:
    kv = [(i, k) for i in range(layers) for k in ("key", "value")]
    return (["input_ids", "attention_mask", "position_ids"] + [f"past_key_values.{i}.{k}" for i, k in kv],
            ["logits"] + [f"present.{i}.{k}" for i, k in kv])  # fmt: skip


def test_api_onnx_llama_is_optimums_layout_and_matches_transformers(lms, llama_onnx):
    """The default check (32 greedy tokens) passed; plain ONNX Runtime sees optimum's names and dims and runs
    a prefill from an empty past then a decode step that reproduce transformers' logits; ``ptopt validate``
    scores the folder in ONNX Runtime at transformers' perplexity."""
    import onnxruntime as ort

    res, path = llama_onnx
    assert res.metrics["greedy"]["equal"] and res.metrics["greedy"]["new_tokens"] == 32
    assert res.metrics["parity"]["passed"] and res.metrics["batch"]["passed"]
    assert res.artifact.format == "onnx_lm" and res.artifact.precision == "fp32"
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json", "genai_config.json", "generation_config.json", "model.onnx", "ptopt_lm.json",
        "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    sess = ort.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs, outputs = _names(2)
    assert [i.name for i in sess.get_inputs()] == inputs and [o.name for o in sess.get_outputs()] == outputs
    shapes = {i.name: i.shape for i in sess.get_inputs()} | {o.name: o.shape for o in sess.get_outputs()}
    assert shapes["input_ids"] == ["batch_size", "sequence_length"]
    assert shapes["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 8]
    assert shapes["present.0.key"] == ["batch_size", 2, "past_sequence_length + sequence_length", 8]
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    empty = np.zeros((1, 2, 0, 8), np.float32)
    feed = {"input_ids": ids.numpy()[:, :5], "attention_mask": np.ones((1, 5), np.int64),
            "position_ids": np.arange(5)[None]} | {n: empty for n in inputs[3:]}  # fmt: skip
    first = sess.run(None, feed)
    feed = {"input_ids": ids.numpy()[:, 5:], "attention_mask": np.ones((1, 6), np.int64),
            "position_ids": np.array([[5]])} | dict(zip(inputs[3:], first[1:], strict=True))  # fmt: skip
    second = sess.run(None, feed)
    with torch.inference_mode():
        want = load_causal_lm(lms["llama"])(input_ids=ids).logits
    got = np.concatenate([first[0], second[0]], axis=1)
    assert np.abs(got - want.numpy()).max() < 1e-4 and second[1].shape == (1, 2, 6, 8)
    report = ptopt.validate(lms["llama"], [path], lms["ids"], **FAST)
    entry = report.entry("llama-onnx")
    assert entry["runtime"] == "onnxruntime" and entry["precision"] == "fp32" and entry["format"] == "onnx_lm"
    assert entry["lm"]["perplexity"] == pytest.approx(report.reference["lm"]["perplexity"], rel=1e-5)
    assert entry["lm"]["decode_tokens_per_s"] > 0


def test_api_onnx_qwen2_in_memory_generates_as_transformers(lms):
    """Another family, not saved: ``.model`` generates transformers' greedy tokens for another prompt."""
    res = ptopt.export(f"hf:{lms['qwen2']}", "onnx", dynamic_batch="1:1:2", new_tokens=NEW)
    assert (
        res.metrics["greedy"]["equal"] and res.metrics["parity"]["passed"] and res.metrics["batch"]["passed"]
    )
    prompt = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    from ptopt.export.lm_check import greedy_reference

    want = greedy_reference(load_causal_lm(lms["qwen2"]), prompt, 10)  # no token stops or is forbidden
    assert torch.equal(res.model.generate(prompt, 10), want)


def test_cli_exported_program_with_text_prompt_loads_in_plain_torch(cli, lms, tmp_path):
    out = tmp_path / "phi3-ep"
    out.mkdir()  # an empty folder made for it is taken (click refused any existing folder as "-o")
    code, stdout, err = cli("export", f"hf:{lms['phi3']}", "--target", "exported_program", "--data",
                            lms["text"], "--new-tokens", NEW, "--dynamic-batch", "1:1:4", "-o", out)  # fmt: skip
    assert code == 0, err
    assert f"wrote {out}/ (exported_program_lm, fp32" in stdout
    assert (
        "past_key_values.0..0.key/value -> logits, present.0..0.key/value ([batch, 2, seq, 8]); batch 1..4"
        in stdout
    )
    assert f"greedy tokens equal to transformers' for {NEW} new tokens after a 16-token prompt" in stdout
    side = json.loads((tmp_path / "phi3-ep.ptopt.json").read_text())
    assert side["format"] == "exported_program_lm" and side["config"]["new_tokens"] == NEW
    record = json.loads((out / "ptopt_lm.json").read_text())
    text_ids = torch.load(lms["ids"])[:16].tolist()
    assert record["check"]["greedy"]["prompt_tokens"] == 16 and record["batch"] == [1, 4]
    step = torch.export.load(str(out / "model.pt2")).module()  # plain torch, no ptopt
    ids = torch.tensor([text_ids[:3]])
    kv = [torch.zeros(1, 2, 0, 8) for _ in range(2)]
    logits, *present = step(ids, torch.ones(1, 3, dtype=torch.int64), torch.arange(3)[None], *kv)
    with torch.inference_mode():
        want = load_causal_lm(lms["phi3"])(input_ids=ids).logits
    assert torch.allclose(logits, want, atol=1e-5) and present[0].shape == (1, 2, 3, 8)


def test_api_openvino_gpt2_is_stateful_and_validate_scores_it(lms, tmp_path):
    """GPT-2 (Conv1D, learned positions) to OpenVINO's stateful IR (batch 1): the check passes, plain
    OpenVINO reads two inputs, ``ptopt validate`` scores it at transformers' perplexity."""
    import openvino as ov

    out = tmp_path / "gpt2-ov"
    res = ptopt.export(lms["gpt2"], "openvino", out, new_tokens=NEW)
    assert res.metrics["greedy"]["equal"] and res.metrics["parity"]["passed"] and "batch" not in res.metrics
    ir = ov.Core().read_model(str(out / "openvino_model.xml"))
    assert [p.get_any_name() for p in ir.inputs] == ["input_ids", "attention_mask"]
    assert json.loads((out / "openvino_lm.json").read_text())["inference_precision"] == "f32"
    report = ptopt.validate(lms["gpt2"], [out], lms["ids"], **FAST)
    entry = report.entry("gpt2-ov")
    assert entry["runtime"] == "openvino" and entry["precision"] == "fp32"
    assert entry["lm"]["perplexity"] == pytest.approx(report.reference["lm"]["perplexity"], rel=1e-4)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("tests.helpers:tiny_cnn", "--target", "onnx", "--new-tokens", "4"), "--new-tokens applies to a causal"),
        (("{llama}", "--target", "onnx", "--new-tokens", "60"), "the model covers 64 positions"),
        (("{llama}", "--target", "torchscript"), "--target torchscript does not take a causal language model"),
        (("{llama}", "--target", "onnx", "--precision", "int8"), "ptopt quantize hf:DIR --mode weight-only"),
        (("{llama}", "--target", "onnx", "--opt-shape", "input_ids=1x8"), "give the batch range with --dynamic-batch"),
        (("{llama}", "--target", "openvino", "--dynamic-batch", "1:2:4"), "batch 1 only"),
        (("{llama}", "--target", "onnx", "--dynamic-batch", "4:2"), "--dynamic-batch '4:2'"),
        (("{mistral}", "--target", "onnx"), "DynamicSlidingWindowLayer"),
    ],
    ids=["not-an-lm", "too-long", "torchscript", "int8", "shapes", "openvino-batch", "bad-batch", "sliding-window"],
)  # fmt: skip
def test_cli_bad_input_exits_2(cli, lms, tmp_path, args, match):
    args = [a.format(llama=f"hf:{lms['llama']}", mistral=f"hf:{lms['mistral']}") for a in args]
    out = tmp_path / ("out" if args[0].startswith("hf:") else "out.onnx")  # an LM's folder; a model's file
    assert_refused(cli, "export", *args, "-o", out, match=match, where=tmp_path)


def test_api_bad_input_same_refusals(lms, tmp_path):
    assert_refused(ptopt.export, f"hf:{lms['llama']}", "onnx", new_tokens=POSITIONS, error=UsageError,
                   match="covers 64 positions")  # fmt: skip
    assert_refused(ptopt.export, load_causal_lm(lms["mistral"]), "onnx", error=UnsupportedModelError,
                   match="sliding-window")  # fmt: skip
    assert_refused(ptopt.export, "tests.helpers:tiny_cnn", "onnx", new_tokens=4, error=UsageError)


def test_a_state_space_model_is_refused_for_what_it_is(cli, tmp_path):
    """Mamba has no attention: its cache is convolution and SSM states. The refusal says so and that no
    setting changes it (before, it was lumped with sliding-window models and advised setting
    sliding_window to null, which Mamba has no use for); the API refuses the same."""
    folder = save("mamba", tmp_path / "mamba")
    message = assert_refused(
        cli, "export", f"hf:{folder}", "--target", "onnx", "-o", tmp_path / "out", where=tmp_path,
        match=("MambaForCausalLM has state-space (recurrent) layers", "SSM states", "no config.json setting"),
    )  # fmt: skip
    assert "sliding" not in message
    assert_refused(ptopt.export, load_causal_lm(folder), "exported_program", error=UnsupportedModelError,
                   match="state-space")  # fmt: skip


def test_falcon_caches_the_heads_its_attention_caches(tmp_path):
    """Falcon names its key/value heads its own way (``num_kv_heads``, ``multi_query``,
    ``new_decoder_architecture``): the cache inputs have the heads transformers' FalconAttention caches,
    and a multi-query Falcon exports with greedy tokens equal to transformers' (the export's own check;
    before, torch.export failed on 4 heads of cache against 1)."""
    from ptopt.core.hf import import_transformers
    from ptopt.formats.lm_graph import layout
    from tests.export.lm_models import build
    from tests.export.lm_models import save as save_lm

    tf = import_transformers()
    kw = dict(hidden_size=32, num_attention_heads=8, num_kv_heads=2)
    assert layout(tf.FalconConfig(multi_query=True, new_decoder_architecture=False, **kw))["kv_heads"] == 1
    assert layout(tf.FalconConfig(multi_query=False, new_decoder_architecture=False, **kw))["kv_heads"] == 2
    assert layout(tf.FalconConfig(new_decoder_architecture=True, **kw))["kv_heads"] == 8
    assert layout(build("falcon").config)["kv_heads"] == 1
    res = ptopt.export(
        f"hf:{save_lm('falcon', tmp_path / 'falcon')}", "onnx", tmp_path / "falcon.onnx", new_tokens=8
    )
    assert res.metrics["greedy"]["equal"] and res.metrics["parity"]["passed"], res.metrics


def test_the_reference_generation_neither_stops_at_nor_forbids_the_end_token():
    """The check's reference is transformers' greedy generation with no token stopping or suppressed:
    with ``min_new_tokens`` it forbade the end-of-sequence id, so a model whose greedy choice was that id
    (Falcon with wide weights at its second new token) failed the export's check against a token its
    own forward never picks."""
    import torch

    from ptopt.export.lm_check import greedy_reference
    from tests.export.lm_models import build

    model = build("llama")
    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ids = prompt
        for _ in range(4):  # the model's own greedy choice, one full forward per token
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    model.generation_config.eos_token_id = int(ids[0, 9])  # its second new token ends sequences
    assert torch.equal(greedy_reference(model, prompt, 4), ids)
    # settings a generation_config may ship that bend the logits (Qwen2.5-Instruct: a repetition penalty)
    model.generation_config.update(
        suppress_tokens=[int(ids[0, 8])], repetition_penalty=1.3, no_repeat_ngram_size=1
    )
    assert torch.equal(greedy_reference(model, prompt, 4), ids)
