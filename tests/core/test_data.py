"""Every DATA form loads into a Dataset; batching, seeding and splitting are deterministic."""

import numpy as np
import pytest
import torch

from ptopt.core.data import Dataset, load_data
from ptopt.core.errors import DataError
from tests.helpers import assert_refused


def test_builtin_variants_and_splits():
    train, test = load_data("builtin:digits32:train"), load_data("builtin:digits32:test")
    assert len(train) + len(test) == 1797 and train.x.shape[1:] == (1, 32, 32)
    assert len(load_data("builtin:digits")) == 1797
    seq = load_data("builtin:digits-seq:test")
    assert seq.x.shape[1:] == (32, 32) and torch.equal(seq.y, test.y)
    tok = load_data("builtin:digits-tokens:train")
    assert set(tok.x) == {"input_ids", "attention_mask"} and tok.x["input_ids"].dtype == torch.int64


def test_builtin_digits_are_scikit_learns_read_without_importing_it(monkeypatch):
    """The digits file scikit-learn ships, read directly (no 1-3 s of SciPy imports per command):
    the same images and labels as ``load_digits``, read with every scikit-learn module unimportable."""
    import sys

    from sklearn.datasets import load_digits

    from ptopt.core.builtin_data import _digits_raw

    ref = load_digits()
    for name in [n for n in sys.modules if n == "sklearn" or n.startswith("sklearn.")]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it now raises ImportError
    images, target = _digits_raw.__wrapped__()
    assert np.array_equal(images, ref.images.astype(np.float32)) and np.array_equal(target, ref.target)


@pytest.mark.parametrize(
    "ref,match",
    [
        ("builtin:nope", "unknown builtin data"),
        ("builtin:digits:val", "unknown split"),
        ("nope.pt", "no such file"),
        ("tests.helpers:nope", "no function"),
    ],
)
def test_bad_data_refs(ref, match):
    with pytest.raises(DataError, match=match):
        load_data(ref)


def test_pt_forms(tmp_path):
    x, y = torch.randn(10, 3), torch.arange(10) % 2
    torch.save({"x": x, "y": y}, tmp_path / "a.pt")
    torch.save((x, y), tmp_path / "b.pt")
    torch.save({"x": {"input_ids": torch.ones(10, 4, dtype=torch.long)}}, tmp_path / "c.pt")
    a, b, c = (load_data(tmp_path / n) for n in ("a.pt", "b.pt", "c.pt"))
    assert torch.equal(a.x, x) and torch.equal(b.y, y) and not c.has_labels and len(c) == 10


def test_npz_forms(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((6, 2), np.float64), y=np.arange(6))
    np.savez(tmp_path / "b.npz", **{"x.0": np.zeros((6, 2), np.float32), "x.1": np.ones((6, 3), np.float32)})
    np.savez(tmp_path / "c.npz", **{"x.input_ids": np.ones((6, 4), np.int64)})
    a, b, c = (load_data(tmp_path / n) for n in ("a.npz", "b.npz", "c.npz"))
    assert a.x.dtype == torch.float32 and a.has_labels
    assert isinstance(b.x, tuple) and b.x[1].shape == (6, 3)
    assert set(c.x) == {"input_ids"}


def test_function_of_batches():
    ds = load_data("tests.helpers:digits8_batches")
    assert len(ds) == len(load_data("builtin:digits:test")) and ds.has_labels


FUNCTION_FORMS = (
    "tensor", "xy-pair", "xy-mapping", "list-of-batches", "list-of-xy-batches", "torch-dataset",
    "dataloader", "generator", "numpy", "keyword-inputs", "keyword-inputs-and-labels",
)  # fmt: skip


@pytest.mark.parametrize("form", FUNCTION_FORMS)
def test_a_function_returns_what_memory_takes(form, monkeypatch):
    """A DATA function's value reads exactly as the same object given in memory: a tensor is the
    inputs (an N×3×64×64 tensor was read as N batches of 3×64×64), (x, y) a labelled pair (an
    internal error), a dict without 'x' the keyword inputs (refused)."""
    import tests.helpers

    def value():
        x, y, forms = _in_memory_forms()
        ids = {"input_ids": torch.randint(1, 9, (10, 5), generator=torch.Generator().manual_seed(0))}
        forms |= {"keyword-inputs": (ids, False), "keyword-inputs-and-labels": ((ids, y), True)}
        return forms[form][0]

    monkeypatch.setattr(tests.helpers, "returned_data", value, raising=False)
    got, memory = load_data("tests.helpers:returned_data"), load_data(value())
    assert got.name == "tests.helpers:returned_data" and len(got) == len(memory) == 10
    assert repr(got).split(",", 1)[1] == repr(memory).split(",", 1)[1]
    assert got.has_labels is memory.has_labels and (not got.has_labels or torch.equal(got.y, memory.y))


@pytest.mark.parametrize(
    "value,needle",
    [
        (lambda: (torch.zeros(10, 3), torch.arange(4)), "x holds 10 samples, y 4 labels (accepted: a tensor"),
        (
            lambda: [torch.zeros(10, 3), torch.arange(10)],
            "a list is a list of batches: give (x, y) as a tuple",
        ),
        (lambda: None, "the function returned None; it returns a tensor (the inputs), an (x, y) tuple"),
        (lambda: 1 / 0, "the function raised ZeroDivisionError: division by zero"),
    ],
    ids=["unpaired-labels", "list-xy", "none", "raises"],
)
def test_a_function_whose_value_is_not_data_is_one_clear_error(value, needle, monkeypatch):
    import tests.helpers

    monkeypatch.setattr(tests.helpers, "returned_data", value, raising=False)
    assert_refused(load_data, "tests.helpers:returned_data", match=needle, error=DataError)


def test_data_functions_returning_pairs_tensors_and_keyword_inputs(cli, tmp_path):
    for model, mode, calib, evald in (
        ("tests.helpers:tiny_cnn", "static", "tests.helpers:digits8_x", "tests.helpers:digits8_xy"),
        ("tests.helpers:two_input", "dynamic", "tests.helpers:tokens_kw", "tests.helpers:tokens_xy"),
    ):
        args = ("quantize", model, "--mode", mode, "--calib-data", calib, "--eval-data", evald)
        code, out, err = cli(*args, "-o", tmp_path / "q.pt")
        assert code == 0 and "error:" not in err and "UserWarning" not in err, err
        assert "accuracy" in out or "top-1" in out, out
    import ptopt
    from tests.helpers import tiny_cnn

    result = ptopt.quantize(
        tiny_cnn(), "static", calib_data="tests.helpers:digits8_x", eval_data="tests.helpers:digits8_xy"
    )
    assert result.metrics["fp32_accuracy"] is not None  # the labels of (x, y) were read


def test_batches_split_and_seed():
    ds = Dataset(torch.arange(10).float().unsqueeze(1), torch.arange(10))
    assert [len(b.y) for b in ds.batches(4)] == [4, 4, 2]
    assert [len(b.y) for b in ds.batches(4, drop_last=True)] == [4, 4]
    s1 = torch.cat([b.y for b in ds.batches(3, shuffle=True, seed=1)])
    s2 = torch.cat([b.y for b in ds.batches(3, shuffle=True, seed=1)])
    assert torch.equal(s1, s2) and not torch.equal(s1, torch.arange(10))
    a, b = ds.split(0.7, seed=0)
    assert len(a) == 7 and len(b) == 3 and set(a.y.tolist()).isdisjoint(b.y.tolist())


def test_bad_contents(tmp_path):
    with pytest.raises(DataError, match="same first"):
        Dataset((torch.zeros(3, 1), torch.zeros(4, 1)))
    with pytest.raises(DataError, match="labels"):
        Dataset(torch.zeros(3, 1), torch.zeros(4))
    bad = Dataset(torch.tensor([[1.0], [float("nan")]]))
    with pytest.raises(DataError, match="NaN/Inf"):
        bad.check_finite()
    (tmp_path / "t.pt").write_text("text")
    with pytest.raises(DataError, match="not a torch.save file"):
        load_data(tmp_path / "t.pt")
    torch.save({"x": torch.zeros(0, 3)}, tmp_path / "empty.pt")
    with pytest.raises(DataError, match="empty"):
        load_data(tmp_path / "empty.pt")


# -- in-memory data (the Python API) -------------------------------------------------------------------


def _in_memory_forms():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(10) % 3
    return (
        x,
        y,
        {
            "tensor": (x, False),
            "xy-pair": ((x, y), True),
            "xy-mapping": ({"x": x, "y": y}, True),
            "list-of-batches": ([x[:4], x[4:]], False),
            "list-of-xy-batches": ([(x[:4], y[:4]), (x[4:], y[4:])], True),
            "torch-dataset": (TensorDataset(x, y), True),
            "dataloader": (DataLoader(TensorDataset(x, y), batch_size=3), True),
            "generator": (((x[i : i + 5], y[i : i + 5]) for i in (0, 5)), True),
            "numpy": (x.double().numpy(), False),
        },
    )


@pytest.mark.parametrize("form", list(_in_memory_forms()[2]))
def test_load_data_in_memory_forms(form: str) -> None:
    import torch

    x, y, forms = _in_memory_forms()
    obj, labelled = forms[form]
    ds = load_data(obj)
    assert len(ds) == 10 and ds.x.dtype == torch.float32 and ds.name.startswith("in-memory")
    assert torch.allclose(ds.x, x)
    assert ds.has_labels is labelled
    if labelled:
        assert torch.equal(ds.y, y)


def test_load_data_in_memory_multi_input() -> None:
    import torch

    ids = torch.randint(0, 9, (6, 5))
    ds = load_data({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert isinstance(ds.x, dict) and set(ds.x) == {"input_ids", "attention_mask"} and not ds.has_labels
    two = load_data((torch.randn(6, 3), torch.randn(6, 3)))  # a second float tensor is an input, not labels
    assert isinstance(two.x, tuple) and len(two.x) == 2 and not two.has_labels


@pytest.mark.parametrize(
    "obj,needle",
    [(None, "expected a DATA reference"), (3, "expected a DATA reference"), ([], "yielded no batches")],
    ids=["none", "int", "empty-list"],
)
def test_load_data_refuses_what_is_not_data(obj, needle: str) -> None:
    from ptopt.core.errors import DataError
    from tests.helpers import assert_refused

    assert_refused(load_data, obj, match=needle, error=DataError)


def test_load_data_refuses_batches_that_do_not_stack() -> None:
    import torch

    from ptopt.core.errors import DataError
    from tests.helpers import assert_refused

    assert_refused(
        load_data, [torch.randn(2, 3), torch.randn(2, 4)], match="cannot read batches", error=DataError
    )


def test_text_given_where_tensors_are_read_says_what_reads_text(cli, tmp_path):
    """``quantize --mode static --calib-data corpus.txt`` tried ``torch.load`` on the text ("holds more than
    tensors; ... weights_only"): the message now says it is text and what reads text."""
    (tmp_path / "corpus.txt").write_text("some words " * 50, encoding="utf-8")
    for ref in (tmp_path / "corpus.txt", "builtin:pydoc-text:calib"):
        with pytest.raises(DataError, match="is text: a language model reads it through its tokenizer"):
            load_data(ref)
    assert_refused(cli, "quantize", "zoo:resnet", "--mode", "static", "--calib-data", "corpus.txt", "-o",
                   "r.int8.pt", match=("is text", "--mode weight-only"), where=tmp_path)  # fmt: skip
