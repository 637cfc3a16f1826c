"""What a Ray Serve replica runs (``ptopt.serve.runtime.ServedModel``), without Ray: every format ptopt
writes loads through the format table and answers every output, named, equal to the artifact's own
run in its runtime (the ``.pt2`` formats: ``test_serve_pt2.py``, beside their compiled fixture);
server-side batches split back per request, a failing request isolated; the weight-only
language-model folder generates the text its own greedy run generates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ptopt
from ptopt.core.errors import ModelLoadError, UsageError
from ptopt.core.modelref import load_model
from ptopt.serve.runtime import ServedModel
from tests.helpers import assert_refused, tiny_cnn


def _own_run(path, x):
    """The artifact in its own runtime, loaded back the way a user loads it (the format row's
    ``reload``: torch.jit / torch.export / ONNX Runtime / OpenVINO), not through a runner."""
    from ptopt.core.formats import get_format

    loaded = load_model(path)
    module = get_format(loaded.format).reload(path, style=loaded.input_style)
    with torch.inference_mode():
        out = module(**x) if isinstance(x, dict) else module(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("kind", ["fp32", "int8", "onnx", "keyword"])
def test_formats_answer_what_the_artifact_computes(serve_artifacts, kind):
    served = ServedModel(serve_artifacts[kind], name="m", threads=1)
    g = torch.Generator().manual_seed(4)
    if kind == "keyword":
        x = {
            "input_ids": torch.randint(0, 18, (3, 12), generator=g),
            "attention_mask": torch.ones(3, 12, dtype=torch.int64),
        }
    else:
        x = torch.randn(3, 1, 8, 8, generator=g)
    arrays = {k: v.numpy() for k, v in x.items()} if isinstance(x, dict) else {"input": x.numpy()}
    ((name, got),) = served.run(arrays)
    np.testing.assert_allclose(got, _own_run(serve_artifacts[kind], x).float().numpy(), atol=1e-5)
    meta = served.metadata()
    assert meta["outputs"] == [{"name": name, "datatype": "FP32", "shape": [-1, 10]}]
    assert name == ("logits" if kind == "onnx" else "output__0")  # ONNX: the graph's own output name
    assert meta["platform"] == f"ptopt_{served.format}" and meta["parameters"]["precision"] == (
        "int8" if kind == "int8" else "fp32"
    )


def test_openvino_ir(tmp_path):
    pytest.importorskip("openvino", reason="openvino is not installed (pip install 'ptopt[openvino]')")
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    path = ptopt.export(tiny_cnn(), "openvino", tmp_path / "m.xml", input_shapes=x).path
    served = ServedModel(path, threads=1)
    ((name, got),) = served.run({served.specs[0]["name"]: x.numpy()})
    np.testing.assert_allclose(got, _own_run(path, x).numpy(), atol=1e-5)
    assert served.format == "openvino" and name == served.metadata()["outputs"][0]["name"]


def test_batches_split_back_per_request_and_failures_stay_with_their_request(serve_artifacts):
    """Requests of two shapes, one over the max batch together: each answer is its own rows; a request
    the model fails on (a token id past the embedding) gets the reason, the others their answer."""
    served = ServedModel(serve_artifacts["keyword"], threads=1)
    served.max_batch = 4  # so that the three 2-row requests of one shape take two model calls
    g = torch.Generator().manual_seed(5)
    reqs = []
    for seq in (12, 12, 7, 12):
        ids = torch.randint(0, 18, (2, seq), generator=g)
        reqs.append({"input_ids": ids.numpy(), "attention_mask": np.ones((2, seq), np.int64)})
    reqs[1]["input_ids"][0, 0] = 10_000  # outside the embedding: the model raises on this request only
    answers = served.run_requests(reqs)
    assert isinstance(answers[1], str) and answers[1].startswith("the model failed on this input:")
    for i in (0, 2, 3):
        x = {k: torch.from_numpy(v) for k, v in reqs[i].items()}
        np.testing.assert_allclose(
            answers[i][0][1], _own_run(serve_artifacts["keyword"], x).numpy(), atol=1e-5
        )


def test_no_sidecar_is_refused(tmp_path, serve_artifacts):
    bare = tmp_path / "bare.pt"
    bare.write_bytes(serve_artifacts["fp32"].read_bytes())
    assert_refused(ServedModel, bare, match="no input specs", error=ModelLoadError)


def test_weight_only_folder_generates_its_own_greedy_text(serve_lm_int8):
    lm = serve_lm_int8.parent
    from ptopt.core.hf import load_tokenizer
    from ptopt.core.lm import greedy_tokens

    served = ServedModel(lm / "llama.int8", name="lm", max_tokens=8)
    assert served.generates_text and served.format == "hf_weight_only"
    prompt = "w5 w17 w99 w3"
    text = served.generate(prompt, 6)
    tok = load_tokenizer(lm / "llama.int8")
    ids = torch.tensor(tok(prompt)["input_ids"])
    assert text == tok.decode(
        greedy_tokens(load_model(lm / "llama.int8").module, ids, 6), skip_special_tokens=True
    )
    assert len(text.split()) == 6  # a word-level vocabulary without end-of-sequence: every step a word
    meta = served.metadata()
    assert meta["inputs"] == [{"name": "text_input", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}]
    assert_refused(served.generate, prompt, 9, match="1 to 8 tokens", error=UsageError)


def test_language_model_without_tokenizer_is_refused(serve_lm):
    assert_refused(ServedModel, serve_lm / "bare", match="has no tokenizer", error=ModelLoadError)


def test_an_exported_language_model_folder_generates_its_sources_greedy_text(serve_lm, tmp_path, cli):
    """``ptopt export hf:DIR --target exported_program``'s folder (the decoder step with its KV cache) is
    served as text, as the weight-only and OpenVINO folders are: the same words as the source's greedy
    run; a .mar of it is refused naming Ray Serve (it asked for an image's --input-shape)."""
    from ptopt.core.hf import load_causal_lm, load_tokenizer
    from ptopt.core.lm import greedy_tokens

    out = tmp_path / "llama.ep"
    ptopt.export(f"hf:{serve_lm / 'llama'}", "exported_program", out)
    served = ServedModel(out, name="lm", max_tokens=8)
    assert served.generates_text and served.format == "exported_program_lm"
    tok = load_tokenizer(serve_lm / "llama")
    ids = torch.tensor(tok("w5 w17 w99 w3")["input_ids"])
    want = tok.decode(greedy_tokens(load_causal_lm(serve_lm / "llama"), ids, 6), skip_special_tokens=True)
    assert served.generate("w5 w17 w99 w3", 6) == want
    assert_refused(cli, "package", out, "--format", "mar", "-o", tmp_path / "lm.mar",
                   match=("language-model folder", "Ray Serve"), where=tmp_path)  # fmt: skip
