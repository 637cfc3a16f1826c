"""The TorchServe handler on its own (no server): request parsing, validation, batching, self-containment."""

from __future__ import annotations

import ast
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ptopt.serve import handler as handler_mod


class FakeContext:
    """What the handler uses of ts.context.Context."""

    def __init__(self, model_dir: Path, serialized: str, yaml_config: dict | None = None):
        self.system_properties = {"model_dir": str(model_dir), "batch_size": 4}
        self.manifest = {"model": {"serializedFile": serialized}}
        self.model_yaml_config = yaml_config or {}
        self.status: dict[int, tuple[int, str]] = {}
        self.content_type: dict[int, str] = {}

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.status[idx] = (code, phrase)

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.content_type[idx] = value


def _model_dir(tmp_path: Path, artifact: Path) -> Path:
    """A folder laid out like an unpacked .mar: the model file and its sidecar side by side."""
    d = tmp_path / "model_dir"
    d.mkdir()
    for p in artifact.parent.glob(artifact.name + "*"):
        shutil.copy2(p, d / p.name)
    return d


def _handler(tmp_path: Path, artifact: Path) -> tuple[handler_mod.PtoptHandler, FakeContext]:
    ctx = FakeContext(_model_dir(tmp_path, artifact), artifact.name, {"handler": {"threads": 1}})
    h = handler_mod.PtoptHandler()
    h.initialize(ctx)
    return h, ctx


def _json(value) -> dict:
    return {"body": json.dumps(value).encode()}


def test_handler_imports_only_stdlib_numpy_torch_onnxruntime():
    """It runs inside the TorchServe worker where ptopt may not be installed."""
    tree = ast.parse(Path(handler_mod.__file__).read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add((node.module or "").split(".")[0])
    allowed = {"importlib", "io", "json", "logging", "os", "numpy", "torch", "onnxruntime", "openvino"}
    assert modules <= allowed, modules
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert len(classes) == 1  # TorchServe requires exactly one class in a handler module


def test_mixed_batch_good_and_bad_requests(tmp_path, serve_artifacts):
    h, ctx = _handler(tmp_path, serve_artifacts["fp32"])
    x = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    npy = io.BytesIO()
    np.save(npy, x[2:].numpy())
    data = [
        _json({"inputs": x[0].tolist()}),  # one sample
        {"body": b"{not json"},  # malformed
        _json({"inputs": x[:2].tolist()}),  # a batch
        _json({"inputs": [[1.0, 2.0]]}),  # wrong shape
        {"body": npy.getvalue()},  # .npy bytes
        {"data": {"inputs": x[1].tolist()}},  # already parsed JSON (TorchServe decodes it)
        _json({"inputs": [[["x"] * 8] * 8]}),  # not numbers
        _json({"x": 1}),  # an object without "inputs"
    ]
    answers = h.handle(data, ctx)
    assert len(answers) == len(data)
    want = torch.jit.load(str(serve_artifacts["fp32"]))(x).detach().numpy()
    out = [json.loads(a) for a in answers]
    np.testing.assert_allclose(out[0]["outputs"], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[2]["outputs"], want[:2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[4]["outputs"], want[2:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[5]["outputs"], want[1], rtol=1e-5, atol=1e-6)
    assert set(ctx.status) == {1, 3, 6, 7} and all(c == 400 for c, _ in ctx.status.values())
    assert "malformed JSON" in out[1]["error"]
    assert "shape" in out[3]["error"] and "input: 1x8x8 float32" in out[3]["expected"]
    assert "numbers" in out[6]["error"]
    assert 'no "inputs" key (its keys: x)' in out[7]["error"]


def test_requests_of_different_lengths_share_a_call(tmp_path, serve_artifacts):
    """Sequence length is dynamic in the keyword model's spec: requests are grouped by shape."""
    import dataclasses

    from ptopt.core.artifact import Artifact

    art = Artifact.load(serve_artifacts["keyword"])
    d = tmp_path / "kw"
    d.mkdir()
    shutil.copy2(art.path, d / art.path.name)
    art2 = Artifact(
        d / art.path.name,
        art.format,
        [dataclasses.replace(s, min_shape=(1, 1)) for s in art.inputs],
        art.input_style,
    ).finalize()
    h, ctx = _handler(tmp_path, art2.path)
    model = torch.jit.load(str(art2.path))
    reqs, wants = [], []
    for n in (5, 12, 5, 3):
        ids = torch.randint(0, 18, (n,), generator=torch.Generator().manual_seed(n))
        mask = torch.ones(n, dtype=torch.int64)
        reqs.append(_json({"inputs": {"input_ids": ids.tolist(), "attention_mask": mask.tolist()}}))
        wants.append(model(input_ids=ids[None], attention_mask=mask[None])[0].detach().numpy())
    answers = h.handle(reqs, ctx)
    assert not ctx.status
    for a, w in zip(answers, wants, strict=False):
        np.testing.assert_allclose(json.loads(a)["outputs"], w, rtol=1e-5, atol=1e-6)


def test_onnx_and_npz(tmp_path, serve_artifacts):
    h, ctx = _handler(tmp_path, serve_artifacts["onnx"])
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    buf = io.BytesIO()
    np.savez(buf, input=x)
    answers = h.handle([{"body": buf.getvalue()}, _json({"inputs": x.astype(np.float64).tolist()})], ctx)
    assert not ctx.status
    a, b = (json.loads(s)["outputs"] for s in answers)
    np.testing.assert_allclose(a, b, rtol=1e-6)


def test_initialize_without_sidecar_fails_clearly(tmp_path, serve_artifacts):
    d = tmp_path / "bare"
    d.mkdir()
    shutil.copy2(serve_artifacts["fp32"], d / "cnn.pt")
    with pytest.raises(RuntimeError, match="no sidecar"):
        handler_mod.PtoptHandler().initialize(FakeContext(d, "cnn.pt"))


def _nan_npy() -> bytes:
    buf = io.BytesIO()
    x = np.zeros((1, 1, 8, 8), np.float32)
    x[0, 0, 3, 3] = np.nan
    np.save(buf, x)
    return buf.getvalue()


@pytest.mark.parametrize(
    "row, message",
    [
        (_json({"inputs": [[[float("nan")] + [0.0] * 7] * 8]}), "NaN or infinite"),  # json writes NaN
        (_json({"inputs": [[[0.0] * 7 + [float("-inf")]] * 8]}), "NaN or infinite"),  # -Infinity
        ({"body": _nan_npy()}, "NaN or infinite"),
        ({"data": {"inputs": [[[float("inf")] * 8] * 8]}}, "NaN or infinite"),  # decoded by TorchServe
    ],
    ids=["json-nan", "json-inf", "npy-nan", "decoded-inf"],
)
def test_non_finite_inputs_answer_400(tmp_path, serve_artifacts, row, message):
    h, ctx = _handler(tmp_path, serve_artifacts["fp32"])
    good = _json({"inputs": [[[0.5] * 8] * 8]})
    answers = h.handle([row, good], ctx)
    assert ctx.status[0][0] == 400 and 1 not in ctx.status
    assert message in json.loads(answers[0])["error"]
    assert len(json.loads(answers[1])["outputs"]) == 10  # the other request of the batch is answered


def test_non_finite_outputs_are_never_written_as_json(tmp_path):
    """A model that answers NaN for some finite inputs: that request gets 422, valid JSON, no NaN."""
    import warnings

    from ptopt.core.artifact import Artifact
    from ptopt.core.inputspec import specs_from_example

    class Log(torch.nn.Module):
        def forward(self, x):
            return torch.log(x.flatten(1)[:, :4])

    x = torch.ones(2, 1, 8, 8)
    path = tmp_path / "log.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(Log(), x).save(str(path))
    Artifact(path, "torchscript", inputs=specs_from_example(x)).finalize()
    h, ctx = _handler(tmp_path, path)
    answers = h.handle([_json({"inputs": [[[-1.0] * 8] * 8]}), _json({"inputs": [[[1.0] * 8] * 8]})], ctx)
    assert ctx.status[0][0] == 422 and 1 not in ctx.status
    assert "NaN or infinite" in json.loads(answers[0])["error"]
    assert json.loads(answers[1])["outputs"] == [0.0] * 4
    for a in answers:  # strict JSON: no NaN / Infinity tokens
        json.loads(a, parse_constant=lambda c: pytest.fail(f"{c} in the answer"))


def test_body_over_the_limit_answers_413_with_the_limit(tmp_path, serve_artifacts, monkeypatch):
    monkeypatch.setenv(handler_mod.MAX_REQUEST_BYTES_ENV, "1000")
    h, ctx = _handler(tmp_path, serve_artifacts["fp32"])
    big = _json({"inputs": [[[0.12345678901234] * 8] * 8]})
    small = _json({"inputs": [[[0] * 8] * 8]})
    assert len(big["body"]) > 1000 >= len(small["body"])
    answers = h.handle([big, small], ctx)
    assert ctx.status[0][0] == 413 and 1 not in ctx.status
    body = json.loads(answers[0])
    assert body["limit_bytes"] == 1000 and "over the limit of 1000 bytes" in body["error"]


def test_an_int8_artifact_checked_on_another_cpu_is_logged_once(tmp_path, serve_artifacts, caplog):
    """The sidecar records the CPU the artifact was checked on; a worker on a CPU whose int8-relevant flags
    differ logs one line naming the difference and the command that re-checks it."""
    d = _model_dir(tmp_path, serve_artifacts["int8"])
    side = d / (serve_artifacts["int8"].name + handler_mod.SIDECAR_SUFFIX)
    meta = json.loads(side.read_text())
    meta["cpu"] = {
        "model": "Some Xeon",
        "int8_flags": ["fma"],
        "level": "amx",
    }  # no real CPU the tests run on
    side.write_text(json.dumps(meta))
    with caplog.at_level("WARNING", logger=handler_mod.__name__):
        handler_mod.PtoptHandler().initialize(FakeContext(d, serve_artifacts["int8"].name))
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "was checked on Some Xeon (level amx)" in said[0] and "it has avx2" in said[0]
    assert "ptopt validate REFERENCE cnn.int8.pt --data DATA --isa" in said[0]
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t: fpu sse4_1 fma\n")
    assert handler_mod.cpu_moved(meta, "m", str(cpuinfo)) is None  # the same flags: nothing to say
    assert handler_mod.cpu_moved(dict(meta, precision="fp32"), "m") is None  # fp32 TorchScript: not sensitive


def test_the_handlers_cpu_flags_are_ptopts():
    """The handler runs where ptopt is not installed, so it keeps its own copy of the int8 CPU flags;
    it must be the same list the sidecar records (``ptopt.core.system.ISA_FLAGS``)."""
    from ptopt.core.system import ISA_FLAGS
    from ptopt.serve.handler import INT8_FLAGS

    assert INT8_FLAGS == ISA_FLAGS


def test_a_padded_request_passes_and_the_refusal_states_the_range(tmp_path):
    """Exported with unpadded data (ids 2.., masks all ones), the artifact still takes padding (id 0,
    mask 0): its ranges are the vocabulary and 0/1; an id past the vocabulary answers 400 stating it."""
    import ptopt
    from tests.helpers import two_input

    vocab = two_input().embed.num_embeddings
    ids = torch.randint(2, vocab - 1, (8, 6), generator=torch.Generator().manual_seed(0))
    data = {"input_ids": ids, "attention_mask": torch.ones(8, 6, dtype=torch.long)}
    art = tmp_path / "m.pt"
    ptopt.export(two_input(), target="torchscript", data=data, output=art)
    h, ctx = _handler(tmp_path, art)
    padded = {"input_ids": [1, 5, 9, 0, 0, 0], "attention_mask": [1, 1, 1, 0, 0, 0]}
    over = {"input_ids": [1, 5, vocab, 0, 0, 0], "attention_mask": [1, 1, 1, 0, 0, 0]}
    answers = h.handle([_json({"inputs": padded}), _json({"inputs": over})], ctx)
    assert set(ctx.status) == {1} and ctx.status[1][0] == 400
    assert len(json.loads(answers[0])["outputs"]) == 10
    bad = json.loads(answers[1])
    assert bad["error"] == f"input 'input_ids' has values outside [0, {vocab})"
    assert f"input_ids: 6 int64 in [0, {vocab}), attention_mask: 6 int64 in [0, 2)" in bad["expected"]


def test_a_body_is_read_whatever_its_content_type_and_a_form_is_told_what_to_send(tmp_path, serve_artifacts):
    """TorchServe passes a body of any type but a form's as "body" (read as JSON here); a form body
    (curl -d's default type) arrives as its fields: an uploaded file or a JSON text split at a '=' is
    read, anything else (the fields of ``curl -d '{"inputs": ...}'``: none) answers 400 saying what to send
    (it said 'the JSON body must be an object', which it was)."""
    h, ctx = _handler(tmp_path, serve_artifacts["fp32"])
    sample = [[[0.5] * 8] * 8]
    npy = io.BytesIO()
    np.save(npy, np.asarray(sample, np.float32))  # one sample
    text = json.dumps({"inputs": sample, "note": "a=b"})
    name, _, value = text.partition("=")
    rows = [
        {"body": json.dumps({"inputs": sample})},  # text/plain: a str
        {"file": npy.getvalue()},  # curl -F file=@x.npy
        {name: value.encode()},  # a form-encoded JSON holding '=': split into a field
        {},  # curl -d '{"inputs": ...}': TorchServe's form decoder keeps nothing
        {"a": b"1"},  # a real form
    ]
    answers = [json.loads(a) for a in h.handle(rows, ctx)]
    assert set(ctx.status) == {3, 4} and all(c == 400 for c, _ in ctx.status.values())
    for a in answers[:3]:
        assert len(a["outputs"]) == 10
    for a in answers[3:]:
        assert "sent as form data" in a["error"] and "Content-Type: application/json" in a["error"]
