"""The zoo: every model runs on its bundled data's shapes; CNNs train to ≥97% held-out; caching."""

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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "mobilenet"])
def test_cnn_reaches_97_percent_and_is_cached(name, monkeypatch):
    from ptopt.compress.trainer import evaluate_accuracy
    from ptopt.models.zoo import weights_path, zoo_info

    lm = load_model(f"zoo:{name}")  # trains on first use (cached for the session)
    acc = evaluate_accuracy(lm.module, load_data(ZOO[name].test_data))
    assert acc >= 0.97, acc
    assert zoo_info(name)["test_accuracy"] == pytest.approx(acc)
    path = weights_path(name)
    mtime = os.stat(path).st_mtime_ns

    def no_retrain(*a, **k):
        raise AssertionError("a cached zoo model was trained again")

    monkeypatch.setattr("ptopt.models.zoo.train_zoo_model", no_retrain)
    again = load_model(f"zoo:{name}")
    assert os.stat(path).st_mtime_ns == mtime  # loaded, not retrained
    x = load_data(ZOO[name].test_data).first_batch(8).x
    with torch.no_grad():
        assert torch.equal(lm.module(x), again.module(x))


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
