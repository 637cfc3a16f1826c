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
    current = sorted(shipped_path(n).name for n in ("mobilenet", "resnet", "transformer"))
    assert shipped == current, "reship with: python -m ptopt.models.zoo --ship NAME"
    for name in ("mobilenet", "resnet", "transformer"):
        info = json.loads(shipped_path(name).with_suffix(".json").read_text())
        assert info["recipe"] == ZOO[name].recipe()


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
