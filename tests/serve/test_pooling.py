"""A sentence-transformers folder's pooling on Ray Serve (``serve.pooling``): the artifact exported from
it answers ``last_hidden_state`` (its transformer alone), and the server adds ``sentence_embedding`` as
the folder's ``Pooling`` and ``Normalize`` modules make it. Before, a client had to pool every token's
vector itself, knowing the model's pooling. The ingress runs in this process (``test_text_inputs.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import ptopt
from tests.helpers import VOCAB, bert_folder

pytest.importorskip("transformers")
pytest.importorskip("ray.serve", reason="ray[serve] (the ray extra) is not installed")
from ptopt.serve.pooling import pooling_of, sentence_embedding  # noqa: E402 - after the importorskip
from tests.serve.test_text_inputs import _call, _ingress, _text  # noqa: E402

TEXTS = ["the cat sat on the mat", "a dog ran", "the big red house and the small blue tree is big"]
ST = "sentence_transformers.models."


def _modules(folder, *kinds, **modes):
    """``modules.json`` of ``kinds`` and a ``1_Pooling/config.json`` turning ``modes`` on."""
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    mods = [{"idx": i, "name": str(i), "path": paths[k], "type": ST + k} for i, k in enumerate(kinds)]
    (folder / "modules.json").write_text(json.dumps(mods))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    config = {"word_embedding_dimension": 32, **{f"pooling_mode_{m}": v for m, v in modes.items()}}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny BertModel saved as sentence-transformers saves one (mean pooling, then Normalize), its
    ONNX export and that packaged for Ray Serve."""
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    root = tmp_path_factory.mktemp("st")
    folder = bert_folder(root / "st")  # the tokenizer; the model replaced by the bare encoder
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           vocab_size=len(VOCAB))  # fmt: skip
    tf.BertModel(config).eval().save_pretrained(folder)
    _modules(folder, "Transformer", "Pooling", "Normalize", mean_tokens=True)
    ptopt.export(f"hf:{folder}", "onnx").save(root / "st.onnx")
    ptopt.package(root / "st.onnx", "ray", root / "st_ray")
    return folder, root / "st.onnx", root / "st_ray"


def _want(folder, texts):
    """sentence-transformers' all-MiniLM recipe by hand: mean over the real tokens, unit length."""
    from transformers import AutoModel, AutoTokenizer

    enc = AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(folder).eval()(**enc).last_hidden_state
    mask = enc["attention_mask"][..., None].float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()


def test_the_server_answers_the_folders_sentence_embedding(encoder, cli, tmp_path):
    folder, onnx, package = encoder
    ingress = _ingress(package)
    body = {**_text(TEXTS), "outputs": [{"name": "sentence_embedding"}]}
    code, answer = _call(ingress, "POST", "/v2/models/st/infer", body)
    assert code == 200, answer
    (out,) = answer["outputs"]  # only what was asked for
    assert out["name"] == "sentence_embedding" and out["shape"] == [3, 32]
    np.testing.assert_allclose(np.array(out["data"]).reshape(3, 32), _want(folder, TEXTS), atol=1e-5)
    code, meta = _call(ingress, "GET", "/v2/models/st")
    shapes = {t["name"]: t["shape"] for t in meta["outputs"]}
    assert shapes["sentence_embedding"] == [-1, 32] and shapes["last_hidden_state"] == [-1, -1, 32]
    code, answer = _call(ingress, "POST", "/predictions/st", {"inputs": TEXTS[0]})
    assert code == 200 and np.allclose(
        answer["outputs"]["sentence_embedding"], _want(folder, TEXTS[:1])[0], atol=1e-5
    )
    code, out, err = cli("package", onnx, "--format", "ray", "-o", tmp_path / "p")
    assert code == 0, err
    assert "output: sentence_embedding: last_hidden_state pooled by the folder's sentence-transformers " \
           "modules (mean_tokens, normalized)" in out  # fmt: skip


def test_which_folders_get_a_pooled_output(tmp_path):
    assert pooling_of(tmp_path) == (None, "")  # no modules.json: no sentence-transformers folder
    _modules(tmp_path, "Transformer", "Pooling", "Normalize", mean_tokens=True, cls_token=True)
    assert pooling_of(tmp_path) == ({"modes": ["cls_token", "mean_tokens"], "normalize": True}, "")
    _modules(tmp_path, "Transformer", "Pooling", max_tokens=True)
    assert pooling_of(tmp_path) == ({"modes": ["max_tokens"], "normalize": False}, "")
    _modules(tmp_path, "Transformer", "Pooling", "Dense", mean_tokens=True)
    assert "its modules.json holds Dense, which the server does not run" in pooling_of(tmp_path)[1]
    _modules(tmp_path, "Transformer", "Pooling", weightedmean_tokens=True)
    assert "turns on pooling mode weightedmean_tokens" in pooling_of(tmp_path)[1]
    with pytest.raises(ValueError, match="pooling mode 'weightedmean_tokens'"):
        sentence_embedding(np.zeros((1, 2, 3)), np.ones((1, 2)), {"modes": ["weightedmean_tokens"]})


@pytest.mark.parametrize(
    "mode", ["cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "lasttoken"]
)
def test_each_pooling_mode_is_sentence_transformers(mode):
    """Each mode as sentence-transformers' ``Pooling.forward`` computes it (written out here in torch)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 5, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    m = mask[..., None].float()
    want = {
        "cls_token": h[:, 0],
        "max_tokens": h.masked_fill(m == 0, -1e9).max(1).values,
        "mean_tokens": (h * m).sum(1) / m.sum(1),
        "mean_sqrt_len_tokens": (h * m).sum(1) / m.sum(1).sqrt(),
        "lasttoken": h[torch.arange(3), mask.sum(1) - 1],
    }[mode]
    got = sentence_embedding(h.numpy(), mask.numpy(), {"modes": [mode], "normalize": False})
    np.testing.assert_allclose(got, want.numpy(), atol=1e-6)
    if mode != "cls_token":  # the same rows padded on the left (a client's tensors): the same vectors
        left = torch.stack([row.roll(int((m == 0).sum()), 0) for row, m in zip(h, mask, strict=True)])
        lmask = torch.stack([m.flip(0) if m.sum() < 5 else m for m in mask])
        got = sentence_embedding(left.numpy(), lmask.numpy(), {"modes": [mode], "normalize": False})
        np.testing.assert_allclose(got, want.numpy(), atol=1e-6)
    unit = sentence_embedding(h.numpy(), mask.numpy(), {"modes": [mode, "mean_tokens"], "normalize": True})
    assert unit.shape == (3, 8) and np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
