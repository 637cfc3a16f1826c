"""A DATA reference that names a file that is not there is refused before any model loads (the
factory below would leave ``loaded`` behind), in every command that takes DATA."""

from __future__ import annotations

import pytest

from tests.helpers import assert_refused

FACTORY = "def make():\n    open('loaded', 'w').close()\n    raise RuntimeError('the model was loaded')\n"

COMMANDS = [
    ("export", "slowmodel:make", "--target", "onnx", "--data", "missing.pt", "-o", "m.onnx"),
    ("quantize", "slowmodel:make", "--mode", "static", "--calib-data", "missing.pt", "-o", "q.pt"),
    ("quantize", "slowmodel:make", "--mode", "dynamic", "--eval-data", "sub/eval", "-o", "q.pt"),
    ("prune", "slowmodel:make", "--method", "global", "--amount", "0.5", "--fine-tune-data", "missing.npz",
     "--epochs", "1", "-o", "p.pt"),
    ("prune", "slowmodel:make", "--method", "global", "--amount", "0.5", "--eval-data", "missing.txt", "-o", "p.pt"),
    ("distill", "--teacher", "slowmodel:make", "--student", "slowmodel:make", "--train-data", "missing.pt",
     "-o", "s.pt"),
    ("validate", "slowmodel:make", "slowmodel:make", "--data", "missing.pt"),
    ("optimize", "slowmodel:make", "--eval-data", "sub/e.pt", "--calib-data", "builtin:digits", "--min-cosine", "0.9",
     "-o", "out"),
    ("inspect", "slowmodel:make", "--data", "missing.pt"),
]  # fmt: skip


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: f"{a[0]}-{[x for x in a if x.startswith('--')][-1]}")
def test_missing_data_file_refused_before_the_model_loads(cli, tmp_path, args):
    (tmp_path / "slowmodel.py").write_text(FACTORY)
    flag = next(a for i, a in enumerate(args) if a.startswith("--") and "data" in a)
    ref = args[args.index(flag) + 1]
    msg = assert_refused(cli, *args, match=(repr(ref), "no such file"))
    assert flag in msg or args[0] in ("validate", "distill")  # those two read their data first already
    assert not (tmp_path / "loaded").exists()


def test_existing_and_non_file_references_pass(tmp_path):
    from ptopt.core.data import refuse_missing_file

    (tmp_path / "there.pt").write_bytes(b"")
    refs = (None, str(tmp_path / "there.pt"), "builtin:digits:test", "pkg.module:function", object())
    refuse_missing_file(**{f"data{i}": ref for i, ref in enumerate(refs)})


def test_python_export_refuses_missing_data_before_loading(tmp_path, monkeypatch):
    import ptopt
    from ptopt.core.errors import DataError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "slowmodel.py").write_text(FACTORY)
    msg = assert_refused(
        ptopt.export,
        "slowmodel:make",
        "onnx",
        data="missing.pt",
        match=("data 'missing.pt'", "no such file"),
        error=DataError,
    )
    assert "missing.pt" in msg
    assert not (tmp_path / "loaded").exists()


def test_a_language_model_export_refuses_missing_data_before_loading(cli, tmp_path):
    """hf:DIR takes the language-model export, which returned before the check (its folder is read
    only to see it is one; the data's absence is said before the model loads)."""
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "config.json").write_text(
        '{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}'
    )
    assert_refused(
        cli, "export", f"hf:{tmp_path / 'lm'}", "--target", "onnx", "--data", "missing.txt", "-o", tmp_path / "o",
        match=("'missing.txt'", "no such file"),
    )  # fmt: skip
