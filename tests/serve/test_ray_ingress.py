"""The Ray Serve ingress's routes run in this process, without a Ray instance: the class Serve deploys as
the ingress, its handles replaced by ones that call a real model replica (``PtoptModel``'s class, serving
the seeded Llama folder of ``serve_lm``) directly. What a request carries to the replica (temperature,
seed) and the 4xx a bad one gets; the real Ray Serve end to end: ``test_ray_serve.py``."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

pytest.importorskip("ray.serve", reason="ray[serve] (the ray extra) is not installed")
from ptopt.serve import oip  # noqa: E402 - after the importorskip

PROMPT = "w5 w17 w99 w3"


class _Handle:
    """A DeploymentHandle's shape: ``handle.METHOD.remote(*args)`` is awaited for the replica's answer."""

    def __init__(self, replica):
        self.replica = replica

    def __getattr__(self, method):
        fn = getattr(self.replica, method)
        return type("Method", (), {"remote": staticmethod(lambda *args: fn(*args))})


@pytest.fixture(scope="module")
def ingress(serve_lm):
    from ptopt.serve.ray_app import PtoptIngress, PtoptModel

    replica = PtoptModel.func_or_class(str(serve_lm), {"name": "llama", "path": "llama"}, None, 8)
    manifest = {
        "models": [{"name": "llama", "kind": "text", "max_batch": 1}, {"name": "cnn", "kind": "text", "max_batch": 1}],
        "max_request_bytes": 1 << 20, "max_tokens": 8, "max_batch_size": 8,
    }  # fmt: skip
    server = PtoptIngress.func_or_class({"llama": _Handle(replica), "cnn": None}, manifest)
    server.models["cnn"]["kind"] = "tensor"  # its batcher is never built: no request here reaches it
    return server


def _post(ingress, path, body, headers=None):
    """(status, JSON answer) of one POST, as the ingress's ``__call__`` answers it."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        status, content, _ = asyncio.run(ingress.respond("POST", path, headers or {}, raw))
    except oip.ProtocolError as e:
        status, content = e.status, e.body()
    return status, json.loads(content) if content else None


def _generate(ingress, **params):
    code, answer = _post(ingress, "/v2/models/llama/generate", {"text_input": PROMPT, "parameters": params})
    assert code == 200, answer
    return answer["text_output"]


def _expected(serve_lm, n, **sampling):
    from ptopt.core.hf import load_tokenizer
    from ptopt.core.lm import decode_tokens
    from ptopt.core.modelref import load_model

    tok = load_tokenizer(serve_lm / "llama")
    ids = torch.tensor(tok(PROMPT)["input_ids"])
    new = decode_tokens(load_model(serve_lm / "llama").module, ids, n, **sampling)
    return tok.decode(new, skip_special_tokens=True)


def test_generate_samples_at_the_requests_temperature_with_its_seed(ingress, serve_lm):
    """Greedy without a temperature or at 0; above 0 sampled, the same seed giving the same text (the
    replica's own ``decode_tokens``), and the infer route (BYTES ``text_input``) samples alike. Before,
    the temperature never reached the replica: every request was answered greedily."""
    greedy = _expected(serve_lm, 6)
    assert _generate(ingress, max_tokens=6) == greedy
    assert _generate(ingress, max_tokens=6, temperature=0) == greedy
    hot = _generate(ingress, max_tokens=6, temperature=5.0, seed=7)
    assert hot == _generate(ingress, max_tokens=6, temperature=5.0, seed=7)
    assert hot == _expected(serve_lm, 6, temperature=5.0, seed=7) and hot != greedy
    assert _generate(ingress, max_tokens=6, temperature=5.0, seed=8) != hot
    th = pytest.importorskip(
        "tritonclient.http", reason="tritonclient[http] (the test extra) is not installed"
    )
    from tritonclient.http._utils import _get_inference_request

    text = th.InferInput("text_input", [1], "BYTES").set_data_from_numpy(
        np.array([PROMPT.encode()], dtype=object)
    )
    params = {"max_tokens": 6, "temperature": 5.0, "seed": 7}
    json_out = [th.InferRequestedOutput("text_output", binary_data=False)]
    body, size = _get_inference_request([text], "", json_out, 0, False, False, 0, None, params)
    code, answer = _post(
        ingress, "/v2/models/llama/infer", body, {oip.HEADER_LENGTH: str(size)} if size else None
    )
    assert code == 200 and answer["outputs"][0]["data"] == [hot]


@pytest.mark.parametrize(
    "params, words",
    [
        ({"temperature": -0.5}, "temperature -0.5: give a number >= 0"),
        ({"temperature": "hot"}, "temperature 'hot'"),
        ({"temperature": True}, "temperature True"),
        ({"temperature": 1.0, "seed": -1}, "seed -1: give an integer"),
        ({"temperature": 1.0, "seed": 1.5}, "seed 1.5"),
        ({"temperature": 1.0, "top_p": 0.9}, "top_p 0.9: this server samples from the whole distribution"),
        ({"temperature": 1.0, "top_k": 40}, "top_k 40"),
        ([1], '"parameters" must be a JSON object'),
    ],
    ids=["negative", "string", "bool", "negative-seed", "float-seed", "top-p", "top-k", "not-an-object"],
)  # fmt: skip
def test_bad_sampling_parameters_are_400_naming_the_field(ingress, params, words):
    code, answer = _post(ingress, "/v2/models/llama/generate", {"text_input": PROMPT, "parameters": params})
    assert code == 400 and words in answer["error"], answer


def test_neutral_top_p_and_top_k_are_accepted(ingress, serve_lm):
    assert _generate(ingress, max_tokens=4, top_p=1.0, top_k=0) == _expected(serve_lm, 4)


def test_the_python_twin_refuses_the_same_temperature(serve_lm):
    from ptopt.core.errors import UsageError
    from ptopt.serve.runtime import ServedModel
    from tests.helpers import assert_refused

    served = ServedModel(serve_lm / "llama", name="lm", max_tokens=8)
    assert served.generate(PROMPT, 4, temperature=5.0, seed=7) == _expected(
        serve_lm, 4, temperature=5.0, seed=7
    )
    assert_refused(served.generate, PROMPT, 4, temperature=-1, match="temperature -1", error=UsageError)


@pytest.mark.parametrize(
    "path, words, absent",
    [
        ("llama/generate_stream", ("model 'llama' has no 'generate_stream' endpoint", "does not stream tokens",
                                   "POST /v2/models/llama/generate", "GET /v2/models/llama/ready"), "no route"),
        ("llama/versions/1/generate_stream", ("model 'llama' has no 'generate_stream' endpoint",), "no route"),
        ("cnn/generate_stream", ("model 'cnn' has no 'generate_stream' endpoint", "takes tensors",
                                 "POST /v2/models/cnn/infer"), "/cnn/generate"),
        ("llama/stats", ("model 'llama' has no 'stats' endpoint (no such endpoint)",), "no route"),
        ("nope/generate_stream", ("unknown model 'nope'; this server serves: cnn, llama",), "no route"),
    ],
    ids=["lm", "versioned", "tensor-model", "other-action", "unknown-model"],
)  # fmt: skip
def test_a_path_under_a_model_it_lacks_is_404_naming_the_model_and_its_endpoints(
    ingress, path, words, absent
):
    """Before, ``.../generate_stream`` answered "no route ... (the Open Inference Protocol's are under /v2)"
    for a path that is under /v2, naming neither the model nor what it serves."""
    code, answer = _post(ingress, f"/v2/models/{path}", {"text_input": PROMPT})
    assert code == 404 and set(answer) == {"error"}, answer
    assert all(w in answer["error"] for w in words) and absent not in answer["error"], answer


def test_text_output_has_the_shape_text_input_came_in(ingress, serve_lm):
    """A [2, 1] or [1, 1] BYTES text_input (as TensorRT-LLM's clients send) is answered in that shape,
    prompt for prompt; before, the answer was flattened ([2, 1] -> [2]), so a client reading it by
    the request's shape got the wrong layout."""
    for shape in ([2, 1], [1, 1]):
        n = shape[0] * shape[1]
        body = {
            "inputs": [{"name": "text_input", "shape": shape, "datatype": "BYTES", "data": [PROMPT] * n}],
            "parameters": {"max_tokens": 3},
        }
        code, answer = _post(ingress, "/v2/models/llama/infer", body)
        assert code == 200, answer
        out = answer["outputs"][0]
        assert out["shape"] == shape and out["data"] == [_expected(serve_lm, 3)] * n, answer


@pytest.mark.parametrize(
    "path", ["/v2/repository/models/llama/load", "/v2/logging", "/v2/trace/setting", "/v1/models/llama"]
)
def test_an_endpoint_this_server_lacks_is_404_saying_so(ingress, path):
    """tritonclient's load_model / get_log_settings / get_trace_settings answered "no route ... (the Open
    Inference Protocol's are under /v2)" for paths under /v2; now the 404 says which parts of the
    protocol this server answers, and only a path outside /v2 gets the /v2 hint."""
    code, answer = _post(ingress, path, {})
    assert code == 404, answer
    if path.startswith("/v2/"):
        assert "under /v2" not in answer["error"] and "not Triton's model control" in answer["error"], answer
    else:
        assert "the Open Inference Protocol's are under /v2" in answer["error"], answer
