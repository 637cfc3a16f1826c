"""An encoder or classifier made from a Hugging Face folder takes text on Ray Serve (``serve.text_inputs``):
``ptopt package --format ray`` copies the folder's tokenizer beside the artifact, and the ingress turns a
``BYTES`` ``text_input`` (texts, or pairs) into the model's token inputs. Before, a client had to tokenize
and send ``input_ids`` / ``attention_mask`` itself, with the model's own tokenizer.

Here the ingress runs in this process (its handles call a real model replica, ``PtoptModel``'s class,
directly); the real Ray Serve instance answering text: ``test_ray_serve.py``."""

from __future__ import annotations

import asyncio
import json
import shutil

import numpy as np
import pytest

from ptopt.core.artifact import Artifact
from ptopt.core.errors import UsageError
from tests.serve.conftest import PAIRS, TEXTS, bert_logits, ray_banner

pytest.importorskip("transformers")
pytest.importorskip("ray.serve", reason="ray[serve] (the ray extra) is not installed")
from ptopt.serve import oip  # noqa: E402 - after the importorskip
from ptopt.serve.text_inputs import TextInputs, bucket, why_no_text  # noqa: E402


def _spec(name: str, top: int = 24, longest: int = 16) -> dict:
    return {"name": name, "min_shape": [1, 1], "opt_shape": [1, 8], "max_shape": [8, longest], "dtype": "int64",
            "value_range": [0, top]}  # fmt: skip


@pytest.fixture(scope="module")
def bert(serve_bert):
    return serve_bert


class _Handle:
    """A DeploymentHandle's shape: ``handle.METHOD.remote(*args)`` awaited for the replica's answer."""

    def __init__(self, replica):
        self.replica = replica

    def __getattr__(self, method):
        fn = getattr(self.replica, method)

        async def remote(*args):
            out = fn(*args)
            return (await out) if asyncio.iscoroutine(out) else out

        return type("Method", (), {"remote": staticmethod(remote)})


def _ingress(folder, manifest=None):
    from ptopt.serve.ray_app import PtoptIngress, PtoptModel
    from ptopt.serve.ray_package import read_manifest

    manifest = manifest or read_manifest(folder)
    entry = manifest["models"][0]
    replica = PtoptModel.func_or_class(str(folder), entry, 1, 8)
    ingress = PtoptIngress.func_or_class({entry["name"]: _Handle(replica)}, manifest, str(folder))
    # Serve's batcher needs a replica's context: every request goes to the model replica alone
    ingress.max_rows[entry["name"]] = 0
    return ingress


def _call(ingress, method, path, body=None, headers=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    try:
        status, content, _ = asyncio.run(ingress.respond(method, path, headers or {}, raw))
    except oip.ProtocolError as e:
        status, content = e.status, e.body()
    return status, json.loads(content) if content else None


def _text(data, shape=None, datatype="BYTES", **parameters):
    body = {
        "inputs": [{"name": "text_input", "datatype": datatype, "shape": shape or [len(data)], "data": data}]
    }
    return {**body, "parameters": parameters} if parameters else body


def test_the_package_carries_the_tokenizer_of_the_folder_the_artifact_came_from(bert, cli, tmp_path):
    folder, onnx, package = bert
    entry = json.loads((package / "ptopt_ray.json").read_text())["models"][0]
    assert entry["tokenizer"] == "model/bert/tokenizer"
    assert (package / "model/bert/tokenizer/tokenizer_config.json").is_file()
    assert [s["name"] for s in entry["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    listed = Artifact.load(package).files
    assert "bert_ray/model/bert/tokenizer/tokenizer_config.json" in listed  # the sidecar hashes it too
    code, out, err = cli("package", onnx, "--format", "ray", "-o", tmp_path / "p")
    assert code == 0, err
    assert (
        "text:   text_input (BYTES: texts, or pairs) tokenized by the tokenizer packaged beside it\n" in out
    )
    # the folder itself (exported to TorchScript for Ray, with the implied inputs: no token_type_ids)
    code, out, err = cli("package", f"hf:{folder}", "--format", "ray", "-o", tmp_path / "f")
    assert code == 0, err
    assert (
        "text:   text_input (BYTES: texts) tokenized by the tokenizer packaged beside it; pairs need "
        "token_type_ids, which this model does not take"
    ) in out


def test_text_and_pairs_are_answered_as_transformers_answers_them(bert):
    folder, _, package = bert
    ingress = _ingress(package)
    code, answer = _call(ingress, "POST", "/v2/models/bert/infer", _text(TEXTS))
    assert code == 200, answer
    (out,) = answer["outputs"]
    assert out["name"] == "logits" and out["shape"] == [2, 3] and "parameters" not in answer
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 3), bert_logits(folder, TEXTS), atol=1e-5)
    code, answer = _call(ingress, "POST", "/v2/models/bert/infer", _text(sum(PAIRS, []), shape=[2, 2]))
    assert code == 200, answer
    got = np.array(answer["outputs"][0]["data"]).reshape(2, 3)
    np.testing.assert_allclose(got, bert_logits(folder, PAIRS), atol=1e-5)  # token_type_ids set for the pair
    assert not np.allclose(got, bert_logits(folder, [" ".join(p) for p in PAIRS]), atol=1e-5)
    # the plain JSON route: a text (no batch dimension), a list of texts, a list of pairs
    code, answer = _call(ingress, "POST", "/predictions/bert", {"inputs": TEXTS[0]})
    assert code == 200 and np.allclose(answer["outputs"], bert_logits(folder, TEXTS[:1])[0], atol=1e-5)
    code, answer = _call(ingress, "POST", "/predictions/bert", {"inputs": PAIRS})
    assert code == 200 and np.allclose(answer["outputs"], bert_logits(folder, PAIRS), atol=1e-5)
    # the tensors still work, alone
    tok = _tokens(folder, TEXTS)
    tensors = [
        {"name": n, "datatype": "INT64", "shape": list(a.shape), "data": a.ravel().tolist()}
        for n, a in tok.items()
    ]
    code, answer = _call(ingress, "POST", "/v2/models/bert/infer", {"inputs": tensors})
    assert code == 200 and np.allclose(
        answer["outputs"][0]["data"], bert_logits(folder, TEXTS).ravel(), atol=1e-5
    )


def _tokens(folder, texts):
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="np")
    return {n: enc[n].astype(np.int64) for n in ("input_ids", "attention_mask", "token_type_ids")}


def test_metadata_and_config_say_text_or_tensors(bert):
    ingress = _ingress(bert[2])
    code, meta = _call(ingress, "GET", "/v2/models/bert")
    assert code == 200
    assert [t["name"] for t in meta["inputs"]] == [
        "text_input",
        "input_ids",
        "attention_mask",
        "token_type_ids",
    ]
    assert meta["inputs"][0] == {"name": "text_input", "datatype": "BYTES", "shape": [-1]}
    assert "[N] texts or [N, 2] pairs" in meta["parameters"]["text_input"]
    code, config = _call(ingress, "GET", "/v2/models/bert/config")
    assert code == 200 and all(t["optional"] for t in config["input"])
    assert config["input"][0] == {
        "name": "text_input",
        "data_type": "TYPE_STRING",
        "dims": [-1],
        "optional": True,
    }


LONG = " ".join(["the cat"] * 100)  # 202 tokens with [CLS] and [SEP]: past the export's 128


@pytest.mark.parametrize(
    "body, status, words",
    [
        (_text([LONG, "a dog"]), 200, '"truncated": 1'),
        (_text([LONG], truncate=False), 400, "text 0 is 202 tokens; this model takes at most 128"),
        (_text([LONG], truncate="no"), 400, '"truncate": "no": give true or false'),
        (_text([LONG], truncate=None), 400, '"truncate": null: give true or false'),
        (_text(["a", "b", "c"], shape=[1, 3]), 400, "text_input has shape [1, 3]; send [N] texts, [N, 1], or [N, 2] pairs"),
        (_text([1.0], datatype="FP32"), 400, "send text_input (BYTES) alone, or the model's tensors without it"),
        ({"inputs": [_text(["a"])["inputs"][0], {"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [2]}]},
         400, "send text_input (BYTES) alone"),
        (_text([], shape=[0]), 400, "text_input holds no text"),
        (_text(["a dog"] * 65), 400, "text_input holds 65 texts; this model takes at most 64 a request"),
    ],
)  # fmt: skip
def test_what_text_requests_get(bert, body, status, words):
    code, answer = _call(_ingress(bert[2]), "POST", "/v2/models/bert/infer", body)
    assert code == status and words in (answer["error"] if code >= 400 else json.dumps(answer)), answer


def test_a_model_packaged_without_a_tokenizer_says_it_takes_tensors(bert):
    from ptopt.serve.ray_package import read_manifest

    manifest = read_manifest(bert[2])
    manifest["models"][0]["tokenizer"] = None
    ingress = _ingress(bert[2], manifest)
    code, answer = _call(ingress, "POST", "/v2/models/bert/infer", _text(TEXTS))
    assert (
        code == 400
        and "takes tensors (input_ids, attention_mask, token_type_ids), not text_input" in answer["error"]
    )
    code, meta = _call(ingress, "GET", "/v2/models/bert")
    assert [t["name"] for t in meta["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    code, answer = _call(ingress, "POST", "/predictions/bert", {"inputs": TEXTS})
    assert code == 400  # a list of strings is no tensor


def test_requests_are_padded_to_a_bucket_of_their_longest_text(bert):
    """Requests of similar lengths get one shape, so Serve's batcher joins them in one model call."""
    text = TextInputs(bert[0], [_spec("input_ids"), _spec("attention_mask", 2)])
    short, _ = text.arrays(np.array([b"a dog ran"], dtype=object))  # 5 tokens -> 8
    other, _ = text.arrays(np.array([b"the cat sat on the mat"], dtype=object))  # 8 -> 8
    assert short["input_ids"].shape == other["input_ids"].shape == (1, 8)
    assert short["attention_mask"].tolist() == [[1] * 5 + [0] * 3] and short["input_ids"].dtype == np.int64
    long, cut = text.arrays(np.array([LONG.encode()], dtype=object))
    assert long["input_ids"].shape == (1, 16) and cut == 1  # cut at the spec's longest
    assert [bucket(n, 1, 128) for n in (1, 2, 3, 9, 100, 200)] == [1, 2, 4, 16, 128, 128]
    assert bucket(3, 8, 128) == 8  # never below the spec's shortest


def test_pairs_are_refused_where_the_model_takes_no_token_type_ids(bert):
    text = TextInputs(bert[0], [_spec("input_ids"), _spec("attention_mask", 2)])
    with pytest.raises(UsageError, match="pairs: this model takes no token_type_ids"):
        text.arrays(np.array(PAIRS, dtype=object))
    one, _ = text.arrays(np.array([["the cat"], ["a dog"]], dtype=object))  # [N, 1]: texts
    assert set(one) == {"input_ids", "attention_mask"}


def test_which_models_take_text():
    assert why_no_text([_spec("input_ids"), _spec("attention_mask")]) is None
    assert "no attention_mask" in why_no_text([_spec("input_ids")])
    assert "it takes pixel_values, which no tokenizer makes" in why_no_text(
        [_spec("input_ids"), _spec("pixel_values")]
    )
    with pytest.raises(UsageError, match="this model takes no text: it takes no attention_mask"):
        TextInputs(".", [_spec("input_ids")])


def test_the_folder_is_found_through_every_sidecar_parent(bert, tmp_path, monkeypatch):
    """An ONNX exported from an int8 file quantized from the folder: two sidecars back (was one). A parent
    recorded relative (as typed) is found from the working directory, else beside the artifact."""
    from ptopt.core.sentences import sentence_folder

    folder = bert[0]
    first, second = tmp_path / "a.int8.pt", tmp_path / "a.int8.onnx"
    for path, parent in ((first, str(folder)), (second, "a.int8.pt")):
        path.write_bytes(b"x")
        Artifact(path, "torchscript" if path.suffix == ".pt" else "onnx", parent={"path": parent}).finalize()
    monkeypatch.chdir(folder)  # "a.int8.pt" is not here: beside a.int8.onnx
    assert sentence_folder(str(second)) == folder
    (tmp_path / "loop.onnx").write_bytes(b"x")
    Artifact(tmp_path / "loop.onnx", "onnx", parent={"path": str(tmp_path / "loop.onnx")}).finalize()
    assert sentence_folder(str(tmp_path / "loop.onnx")) is None  # a sidecar naming itself ends the walk


def test_the_banner_says_the_model_takes_text_and_shows_a_text_request(bert, capsys):
    banner = ray_banner(bert[1], capsys)
    assert "serving bert (onnx, text_input (BYTES) or tensors) at " in banner, banner
    assert '/predictions/bert -d \'{"inputs": ["A first sentence.", "A second one."]}\'' in banner, banner


def test_a_classifier_with_named_classes_answers_its_label(bert, tmp_path, cli):
    """``id2label`` of the folder's config (``serve.labels``): the name of the largest logit per row, as a
    text-classification pipeline names its top class; transformers' placeholders (LABEL_0 ...) give none."""
    from ptopt.serve.labels import labels_of

    folder, onnx, _ = bert
    named = _made_from_a_copy(bert, tmp_path, "named")
    config = json.loads((named / "config.json").read_text())
    config["id2label"] = {"0": "negative", "1": "neutral", "2": "positive"}
    config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    (named / "config.json").write_text(json.dumps(config))
    code, out, err = cli("package", tmp_path / onnx.name, "--format", "ray", "-o", tmp_path / "pkg")
    assert code == 0, err
    assert (
        "output: label: the name of the largest logit (negative, neutral, positive); score: its probability"
        in out
    )
    ingress = _ingress(tmp_path / "pkg")
    code, answer = _call(ingress, "POST", "/v2/models/bert/infer", _text(TEXTS))
    logits = bert_logits(folder, TEXTS)
    want = [config["id2label"][str(i)] for i in logits.argmax(1)]
    assert code == 200 and answer["outputs"][1] == {
        "name": "label",
        "datatype": "BYTES",
        "shape": [2],
        "data": want,
    }
    e = np.exp(logits - logits.max(1, keepdims=True))
    probs = (e / e.sum(1, keepdims=True)).max(1)
    assert answer["outputs"][2]["name"] == "score"
    np.testing.assert_allclose(answer["outputs"][2]["data"], probs, atol=1e-5)  # a pipeline's score
    code, answer = _call(ingress, "POST", "/predictions/bert", {"inputs": TEXTS[0]})
    assert code == 200 and answer["outputs"]["label"] == want[0]
    meta = _call(ingress, "GET", "/v2/models/bert")[1]
    assert meta["outputs"][-2:] == [
        {"name": "label", "datatype": "BYTES", "shape": [-1]},
        {"name": "score", "datatype": "FP32", "shape": [-1]},
    ]
    assert "LABEL_0" in labels_of(folder)[1]  # the fixture's folder: placeholders, no label output
    config["problem_type"] = "multi_label_classification"
    (named / "config.json").write_text(json.dumps(config))
    assert "a multi-label classifier" in labels_of(named)[1]


def _made_from_a_copy(bert, tmp_path, name):
    """A copy of the fixture's folder at ``tmp_path/name``, and the fixture's ONNX copied into ``tmp_path``
    with its sidecar naming that copy as its parent (relative, as typed): the same export, made from it."""
    folder, onnx, _ = bert
    shutil.copytree(folder, tmp_path / name)
    shutil.copy(onnx, tmp_path / onnx.name)
    side = json.loads(onnx.with_name(onnx.name + ".ptopt.json").read_text())
    side["parent"] = {**side["parent"], "path": name}
    (tmp_path / (onnx.name + ".ptopt.json")).write_text(json.dumps(side))
    return tmp_path / name


def test_a_tokenizer_that_cannot_pad_texts_leaves_the_model_to_tensors(bert, tmp_path, cli):
    """Left padding moves each text's tokens to other positions, and without a padding token a batch
    cannot be padded: such a tokenizer is not packaged (before: wrong answers, or a 500 on every text)."""
    from types import SimpleNamespace

    from ptopt.core.hf import load_tokenizer
    from ptopt.serve.text_inputs import why_no_padding

    left = _made_from_a_copy(bert, tmp_path, "left")
    config = json.loads((left / "tokenizer_config.json").read_text())
    (left / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": "left"}))
    assert load_tokenizer(left).padding_side == "left"
    code, out, err = cli("package", tmp_path / bert[1].name, "--format", "ray", "-o", tmp_path / "pkg")
    assert code == 0, err
    assert "text:   no text input (left's tokenizer not used: its tokenizer pads on the left" in out
    assert json.loads((tmp_path / "pkg" / "ptopt_ray.json").read_text())["models"][0]["tokenizer"] is None
    assert "no padding token" in why_no_padding(SimpleNamespace(pad_token=None, padding_side="right"))
    assert why_no_padding(SimpleNamespace(pad_token="[PAD]", padding_side="right")) is None


def test_a_tokenizer_this_python_cannot_read(bert, tmp_path, cli):
    """At packaging: tensors only, and why. Where the package is served (a cluster without the tokenizer's
    library): the tensors are still served, and a text request is told why not (before: the whole
    application failed to start)."""
    broken = _made_from_a_copy(bert, tmp_path, "broken")
    config = json.loads((broken / "tokenizer_config.json").read_text())
    (broken / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "NoSuchTokenizer"})
    )
    (broken / "tokenizer.json").unlink()
    code, out, err = cli("package", tmp_path / bert[1].name, "--format", "ray", "-o", tmp_path / "pkg")
    assert code == 0, err
    assert "text:   no text input (broken's tokenizer cannot be read here:" in out
    served = tmp_path / "served"
    shutil.copytree(bert[2], served)
    (served / "model/bert/tokenizer/tokenizer.json").unlink()
    config = json.loads((served / "model/bert/tokenizer/tokenizer_config.json").read_text())
    (served / "model/bert/tokenizer/tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "NoSuchTokenizer"})
    )
    ingress = _ingress(served)
    code, answer = _call(ingress, "POST", "/v2/models/bert/infer", _text(TEXTS))
    assert code == 400 and "not text_input: its tokenizer cannot be loaded here" in answer["error"], answer
    tensors = [{"name": n, "datatype": "INT64", "shape": [1, 3], "data": [2, 5, 3]} for n in
               ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
    tensors[1]["data"], tensors[2]["data"] = [1, 1, 1], [0, 0, 0]
    code, answer = _call(ingress, "POST", "/v2/models/bert/infer", {"inputs": tensors})
    assert code == 200, answer
