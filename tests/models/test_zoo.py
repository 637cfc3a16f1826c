"""The zoo: every model runs on its bundled data's shapes; CNNs ship trained to ≥97% held-out; caching."""

import json
import os

import pytest
import torch

from ptopt.core.data import load_data
from ptopt.core.inputspec import call_model, check_inputs
from ptopt.core.modelref import load_model
from ptopt.models import ZOO
from tests.helpers import assert_refused


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_fits_its_data(name):
    entry = ZOO[name]
    model = entry.build().eval()
    ds = load_data(entry.test_data)
    lm = load_model(entry.factory)  # every zoo model is also a pkg.module:factory
    check_inputs(lm.input_specs, ds.first_batch(4).x)
    with torch.no_grad():
        assert call_model(model, ds.first_batch(4).x).shape == (4, 10)
        assert call_model(model, model.example_inputs()).shape[-1] == 10


def test_zoo_models_written_like_user_models():
    """No QuantStubs: the zoo exercises graph-mode techniques on ordinary code."""
    for entry in ZOO.values():
        mods = {type(m).__name__ for m in entry.build().modules()}
        assert not mods & {"QuantStub", "DeQuantStub"}


@pytest.mark.parametrize("name", ["resnet", "mobilenet"])
def test_cnn_ships_trained_to_97_percent_and_is_cached(name, monkeypatch, tmp_path):
    """The CNNs' weights ship with ptopt: a fresh cache gets them without training, they reach 97%
    held-out, and the copy in the cache is loaded again, not replaced."""
    from ptopt.compress.trainer import evaluate_accuracy
    from ptopt.models.zoo import weights_path, zoo_info

    def no_training(*a, **k):
        raise AssertionError("a zoo model that ships was trained")

    monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path / "fresh-cache"))
    monkeypatch.setattr("ptopt.models.zoo.train_zoo_model", no_training)
    lm = load_model(f"zoo:{name}")
    acc = evaluate_accuracy(lm.module, load_data(ZOO[name].test_data))
    assert acc >= 0.97, acc
    assert zoo_info(name)["test_accuracy"] == pytest.approx(acc)
    path = weights_path(name)
    assert path.is_relative_to(tmp_path / "fresh-cache")
    mtime = os.stat(path).st_mtime_ns
    again = load_model(f"zoo:{name}")
    assert os.stat(path).st_mtime_ns == mtime  # loaded, not copied again
    x = load_data(ZOO[name].test_data).first_batch(8).x
    with torch.no_grad():
        assert torch.equal(lm.module(x), again.module(x))


def test_shipped_weights_are_those_of_the_current_recipes():
    """A recipe change (epochs, lr, the model's code version) changes the key: reship with
    ``python -m ptopt.models.zoo --ship NAME``, or the zoo trains on first use instead."""
    from ptopt.models.zoo import SHIPPED, shipped_path

    shipped = sorted(p.name for p in SHIPPED.glob("*.safetensors"))
    current = sorted(shipped_path(n).name for n in ZOO)
    assert shipped == current, "reship with: python -m ptopt.models.zoo --ship NAME"
    for name in ZOO:
        info = json.loads(shipped_path(name).with_suffix(".json").read_text())
        assert info["recipe"] == ZOO[name].recipe()


def test_lstm_ships_as_float16_and_loads_as_float32(monkeypatch, tmp_path):
    """The 9.9 MB LSTM ships in half the bytes (under git's 5 MB); users get a float32 model whose stated accuracy is the
    one of the weights they load."""
    from safetensors import safe_open

    from ptopt.compress.trainer import evaluate_accuracy
    from ptopt.models.zoo import shipped_path, zoo_info

    monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path / "fresh-cache"))
    monkeypatch.setattr("ptopt.models.zoo.train_zoo_model", lambda *a, **k: pytest.fail("trained"))
    with safe_open(str(shipped_path("lstm")), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    lm = load_model("zoo:lstm")
    assert {p.dtype for p in lm.module.parameters()} == {torch.float32}
    acc = evaluate_accuracy(lm.module, load_data(ZOO["lstm"].test_data))
    assert acc == pytest.approx(zoo_info("lstm")["test_accuracy"]) and acc >= 0.97


def test_training_stores_the_recipes_dtype_and_states_its_accuracy(monkeypatch, tmp_path):
    """What training returns, caches and reports are the weights as stored (rounded to float16)."""
    import dataclasses

    from safetensors.torch import load_file

    from ptopt.compress.trainer import evaluate_accuracy
    from ptopt.models import zoo

    # one epoch on the 359 test digits: the mechanism is checked here, not the accuracy
    entry = dataclasses.replace(
        ZOO["mobilenet"], epochs=1, stored="float16", train_data="builtin:digits32:test"
    )
    assert entry.key() != ZOO["mobilenet"].key() and "stored" not in ZOO["mobilenet"].recipe()
    monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(zoo.ZOO, "mobilenet", entry)
    model, info = zoo.train_zoo_model("mobilenet", progress=False)
    state = load_file(str(zoo.weights_path("mobilenet")))
    assert {t.dtype for t in state.values()} == {torch.float16, torch.int64}  # BatchNorm's counters stay ints
    assert all(torch.equal(v.float(), state[k].float()) for k, v in model.state_dict().items())
    acc = evaluate_accuracy(model, load_data(entry.test_data))
    assert info["test_accuracy"] == pytest.approx(acc) and "trained_test_accuracy" in info


def test_a_model_without_shipped_weights_trains_on_first_use(monkeypatch, tmp_path):
    from ptopt.models import zoo

    class Trained(Exception):
        pass

    def training(name, progress=True):
        raise Trained(name)

    monkeypatch.setenv("PTOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(zoo, "SHIPPED", tmp_path / "nothing-ships")
    monkeypatch.setattr(zoo, "train_zoo_model", training)
    with pytest.raises(Trained, match="resnet"):
        zoo.load_zoo_model("resnet")
    assert not zoo.weights_path("resnet").exists()


@pytest.mark.parametrize(
    "args,match",
    [
        (("inspect", "zoo:nope"), "unknown zoo model 'nope' (known: lstm, mobilenet, resnet, transformer)"),
        (("inspect", "zoo:"), "unknown zoo model ''"),
        (("inspect", "zoo:resnet", "--weights", "w.pt"), "--weights goes with a pkg.module:factory model"),
    ],
    ids=["unknown-name", "no-name", "with-weights"],
)
def test_bad_zoo_references(cli, tmp_path, args, match):
    assert_refused(cli, *args, match=match, where=tmp_path)


def test_sentence_encoder_declares_what_a_tokenizer_gives():
    """MiniLM's example inputs declare every vocabulary id and padding (id 0, mask 0): a server checks
    requests against these ranges, and real sentences (ids up to 30521, padded rows) must pass it."""
    from ptopt.core.inputspec import specs_from_example
    from ptopt.models.minilm import SentenceEncoder

    enc = SentenceEncoder(vocab=30522, dim=8, heads=2, ff=16, layers=1)
    specs = {s.name: s for s in specs_from_example(enc.example_inputs())}
    assert specs["input_ids"].value_range == (0, 30522)
    assert specs["attention_mask"].value_range == (0, 2)
