"""Every MODEL form loads, and every bad one gets a clear ModelLoadError (exit 2 in the CLI)."""

import pytest
import torch

from ptopt.core.errors import ModelLoadError, ShapeMismatchError, UnsafePickleError, WeightsMismatchError
from ptopt.core.modelref import load_model, run_checked
from tests.helpers import TinyCNN, assert_refused, tiny_cnn

FACTORY = "tests.helpers:tiny_cnn"


def _same_outputs(a, b, batch=3):
    x = torch.randn(batch, 1, 8, 8)
    with torch.no_grad():
        return torch.allclose(a(x), b(x), atol=1e-6)


def test_factory_without_weights_is_fresh_model():
    lm = load_model(FACTORY)
    assert lm.format == "eager" and isinstance(lm.module, TinyCNN) and not lm.module.training
    assert lm.input_specs[0].opt_shape == (2, 1, 8, 8)  # from the model's example_inputs()


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_factory_with_weights(tmp_path, suffix):
    ref = tiny_cnn()
    with torch.no_grad():
        ref.fc.weight.add_(1.0)
    path = tmp_path / f"w{suffix}"
    if suffix == ".pt":
        torch.save(ref.state_dict(), path)
    else:
        from safetensors.torch import save_file

        save_file(ref.state_dict(), str(path))
    lm = load_model(FACTORY, weights=path)
    assert _same_outputs(lm.module, ref.eval())


def test_weights_that_dont_fit_name_the_keys(tmp_path):
    path = tmp_path / "w.pt"
    torch.save(TinyCNN(width=4).state_dict() | {"extra.weight": torch.zeros(1)}, path)
    assert_refused(
        load_model,
        FACTORY,
        weights=path,
        match=("unexpected keys: extra.weight", "bn1.weight (4,) vs model (8,)", "more)"),
        where=tmp_path,
        error=WeightsMismatchError,
    )


def test_torchscript(tmp_path):
    m = tiny_cnn().eval()
    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.trace(m, torch.randn(2, 1, 8, 8)), str(path))
    lm = load_model(path)
    assert lm.format == "torchscript" and _same_outputs(lm.module, m)


def test_exported_program(tmp_path):
    m = tiny_cnn().eval()
    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(m, (torch.randn(2, 1, 8, 8),)), str(path))
    lm = load_model(path)
    # exported without a Dim: the batch size is fixed at 2
    assert lm.format == "exported_program" and _same_outputs(lm.module, m, batch=2)
    assert lm.input_specs[0].opt_shape == (2, 1, 8, 8)


def test_pickled_module_needs_allow_pickle(tmp_path):
    path = tmp_path / "full.pt"
    torch.save(tiny_cnn(), path)
    assert_refused(load_model, path, match="--allow-pickle", where=tmp_path, error=UnsafePickleError)
    lm = load_model(path, allow_pickle=True)
    assert lm.format == "pickle" and isinstance(lm.module, TinyCNN)


def _state_dict_file(tmp_path):
    torch.save(tiny_cnn().state_dict(), tmp_path / "sd.pt")
    return tmp_path / "sd.pt"


def _text_file(tmp_path):
    (tmp_path / "model.pt").write_text("this is not a model\n")
    return tmp_path / "model.pt"


def _folder(tmp_path):
    (tmp_path / "m.pt").mkdir()
    return tmp_path / "m.pt"


def _torchscript_file(tmp_path):
    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.trace(tiny_cnn().eval(), torch.randn(2, 1, 8, 8)), str(path))
    return path


@pytest.mark.parametrize(
    "ref,kwargs,match",
    [
        ("missing.pt", {}, "no such file"),
        ("no_such_pkg.mod:factory", {}, "cannot import 'no_such_pkg.mod'"),
        ("tests.helpers:nope", {}, "has no callable 'nope'"),
        ("tests.helpers:broken_factory", {}, "the factory failed: RuntimeError"),
        ("zoo:nope", {}, "unknown zoo model 'nope'"),
        (_state_dict_file, {}, "is a state_dict"),
        (_text_file, {}, "not a PyTorch model file"),
        (_folder, {}, "is a folder, not a model file"),
        (_torchscript_file, {"weights": "w.pt"}, "is already a model file"),
        (FACTORY, {"weights": "nope.safetensors"}, "weights nope.safetensors: no such file"),
    ],
    ids=[
        "missing",
        "no-module",
        "no-factory",
        "factory-fails",
        "unknown-zoo",
        "state-dict",
        "text-file",
        "folder",
        "file-with-weights",
        "missing-weights",
    ],
)
def test_bad_references(tmp_path, monkeypatch, ref, kwargs, match):
    monkeypatch.chdir(tmp_path)
    ref = ref(tmp_path) if callable(ref) else ref
    assert_refused(load_model, ref, match=match, where=tmp_path, error=ModelLoadError, **kwargs)


def test_run_checked_names_expected_and_got():
    lm = load_model(FACTORY)
    assert_refused(
        run_checked,
        lm,
        torch.randn(2, 3, 8, 8),
        match=("expected input: [1..64]x1x8x8 float32", "got input: 2x3x8x8 float32"),
        error=ShapeMismatchError,
    )
