"""A text file with a Hugging Face encoder's folder: one sample per line, tokenized by the folder's own
tokenizer (``ptopt.core.sentences``). Before, ``ptopt quantize hf:DIR --calib-data sentences.txt`` of a
BERT classifier was refused ("this step takes tensors"): a user had to tokenize into a ``.pt`` first.
And data of one length made exports of that one length, though a tokenizer pads each batch to its own
longest text: the sequence dimension is now the model's (``core.input_infer.token_lengths``)."""

from __future__ import annotations

import json

import pytest
import torch

import ptopt
from ptopt.core.errors import DataError, UsageError
from ptopt.core.input_infer import token_lengths
from ptopt.core.inputspec import specs_from_example
from tests.helpers import VOCAB, WORDS, assert_refused, bert_folder

pytest.importorskip("transformers")

CALIB = "the cat sat on the mat\na dog ran\n\nthe big red house and the small blue tree is big\n"
HELD = "the dog sat\na cat is slow\nthe tree was red and big\n"
LONG = " ".join(WORDS * 2) + "\n"  # 40 tokens with [CLS] and [SEP]: longer than anything calibrated


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BertForSequenceClassification folder with its tokenizer, and three sentence files."""
    root = tmp_path_factory.mktemp("sentences")
    folder = bert_folder(root / "bert")
    for name, text in (("calib.txt", CALIB), ("held.txt", HELD), ("long.txt", LONG)):
        (root / name).write_text(text)
    return root, folder


def test_each_line_is_a_sample_tokenized_by_the_folders_tokenizer(bert):
    from transformers import AutoTokenizer

    root, folder = bert
    ds = ptopt.load_data(root / "calib.txt", model=f"hf:{folder}")
    want = AutoTokenizer.from_pretrained(folder)(
        ["the cat sat on the mat", "a dog ran", "the big red house and the small blue tree is big"],
        padding="longest", return_tensors="pt",
    )  # fmt: skip
    assert set(ds.x) == {"input_ids", "attention_mask"}  # the implied inputs: no token_type_ids
    assert torch.equal(ds.x["input_ids"], want["input_ids"]) and ds.x["input_ids"].dtype == torch.int64
    assert torch.equal(ds.x["attention_mask"], want["attention_mask"])
    assert ds.x["input_ids"].shape == (3, 13) and int(ds.x["attention_mask"][1].sum()) == 5  # padded
    assert int(ds.x["input_ids"][0, 1]) == VOCAB.index("the")  # the folder's vocabulary, not [UNK]
    assert "3 lines" in ds.name and "bert's tokenizer" in ds.name and "13 tokens" in ds.name


def test_data_of_one_length_exports_every_length_the_model_takes():
    """token_lengths: the data's length stays the opt one, ids and mask change together."""
    from ptopt.core.hf import import_transformers

    tf = import_transformers()
    model = tf.BertModel(tf.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, vocab_size=50)).eval()  # fmt: skip
    x = {
        "input_ids": torch.ones(4, 13, dtype=torch.long),
        "attention_mask": torch.ones(4, 13, dtype=torch.long),
    }
    specs = {s.name: s for s in token_lengths(model, specs_from_example(x))}
    for s in specs.values():
        assert (s.min_shape[1], s.opt_shape[1], s.max_shape[1]) == (1, 13, 128), s
    longer = {"input_ids": torch.ones(2, 200, dtype=torch.long)}
    assert token_lengths(model, specs_from_example(longer))[0].max_shape[1] == 200
    mlp = torch.nn.Sequential(torch.nn.Embedding(50, 8))  # no Hugging Face model: as the data says
    assert token_lengths(mlp, specs_from_example(x)) == specs_from_example(x)


def test_cli_quantize_export_and_validate_read_sentence_files(cli, bert):
    root, folder = bert
    q, m = root / "q.pt", root / "m.onnx"
    code, out, err = cli(
        "quantize", f"hf:{folder}", "--mode", "dynamic", "--eval-data", root / "held.txt", "-o", q
    )
    assert code == 0, out + err
    assert "3 samples of" in out and "(3 lines, bert's tokenizer, 8 tokens)" in out, out
    inputs = {s["name"]: s for s in json.loads(q.with_name("q.pt.ptopt.json").read_text())["inputs"]}
    assert inputs["input_ids"]["max_shape"][1] == 128 and inputs["input_ids"]["min_shape"][1] == 1

    code, out, err = cli("export", f"hf:{folder}", "--target", "onnx", "--data", root / "calib.txt", "-o", m)
    assert code == 0, out + err
    code, out, err = cli("inspect", m)
    assert "input_ids: [1..64]x[1..128] int64" in out, out  # not the data's 13 tokens alone

    # a sentence longer than any the artifacts saw; the int8 file as REFERENCE finds the tokenizer
    # through its sidecar's parent (the folder)
    code, out, err = cli("validate", q, m, "--data", root / "long.txt", "--batch-sizes", "1")
    assert code == 0, out + err
    flat = " ".join(out.split())  # the report wraps at the terminal width
    assert "long.txt: 1 samples (input_ids 40, attention_mask 40)" in flat and "cos min" in flat, out


def test_sentence_files_refused_in_one_line_where_nothing_tokenizes_them(cli, bert, tmp_path):
    from ptopt.core.hf import import_transformers

    root, folder = bert
    tf = import_transformers()
    tf.ViTModel(tf.ViTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                             image_size=16, patch_size=8)).save_pretrained(tmp_path / "vit")  # fmt: skip
    (tmp_path / "bare").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "bare" / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "empty.txt").write_text("\n \n")
    (tmp_path / "held.txt").write_text(HELD)
    cases = [
        (f"hf:{tmp_path / 'vit'}", "held.txt", ("takes pixel_values, not token ids",)),
        (f"hf:{tmp_path / 'bare'}", "held.txt", ("needs the model's tokenizer", "bare has none")),
        (f"hf:{folder}", "empty.txt", ("no line holds text",)),
        ("zoo:resnet", "held.txt", ("is text", "one sentence per line")),
    ]
    for model, data, match in cases:
        assert_refused(cli, "quantize", model, "--mode", "dynamic", "--eval-data", tmp_path / data,
                       "-o", tmp_path / "x.pt", where=tmp_path, match=match)  # fmt: skip
    assert_refused(cli, "validate", "zoo:resnet", "zoo:resnet", "--data", tmp_path / "held.txt", where=tmp_path,
                   match=("is text", "one sentence per line", "is neither"))  # fmt: skip
    with pytest.raises(DataError, match="takes pixel_values"):
        ptopt.load_data(tmp_path / "held.txt", model=f"hf:{tmp_path / 'vit'}")
    with pytest.raises(UsageError, match="has none"):
        ptopt.load_data(tmp_path / "held.txt", model=tmp_path / "bare")


def test_reading_sentences_prints_no_library_noise(bert):
    """The tokenizer's model class is found through transformers' lazy import, which imports torchao:
    its "Failed to load ..._C_mxfp8.so" and _pytree notices reached a user's terminal (a fresh process:
    ``ptopt validate hf:DIR ART --data sentences.txt``)."""
    import subprocess
    import sys

    root, folder = bert
    held = root / "held.txt"
    code = f"import ptopt; ds = ptopt.load_data(r'{held}', model=r'hf:{folder}'); print(sorted(ds.x))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0 and "attention_mask" in out.stdout, out.stderr
    assert "Failed to load" not in out.stderr and "_pytree" not in out.stderr, out.stderr


def test_cli_distill_reads_sentence_files_with_the_teachers_tokenizer(cli, bert):
    root, folder = bert
    code, out, err = cli("distill", "--teacher", f"hf:{folder}", "--student", f"hf:{folder}", "--train-data",
                         root / "calib.txt", "--alpha", "0", "--epochs", "1", "-o", root / "student.pt")  # fmt: skip
    assert code == 0, out + err
    assert "(3 lines, bert's tokenizer, 13 tokens)" in " ".join(out.split()), out


PAIRS = "the cat sat\ta dog ran fast\nthe big house\tis red\na cat is slow\tthe tree was big\n"


def test_lines_with_a_tab_are_pairs_with_the_token_types_that_tell_them_apart(bert, cli, tmp_path):
    """A cross-encoder's (or an NLI model's) data: ``first<TAB>second`` per line, tokenized as pairs. Before,
    the tab was read as a space: each pair was one text, with no token types (a reranker scored them as
    one text)."""
    from transformers import AutoTokenizer

    root, folder = bert
    (tmp_path / "pairs.tsv").write_text(PAIRS)
    ds = ptopt.load_data(tmp_path / "pairs.tsv", model=f"hf:{folder}")
    rows = [line.split("\t") for line in PAIRS.splitlines()]
    want = AutoTokenizer.from_pretrained(folder)(rows, padding="longest", return_tensors="pt")
    assert list(ds.x) == ["input_ids", "attention_mask", "token_type_ids"]
    for name in ds.x:
        assert torch.equal(ds.x[name], want[name]), name
    assert int(ds.x["token_type_ids"].sum()) > 0 and "(3 pairs, bert's tokenizer, 11 tokens)" in ds.name
    # an export from them takes the token types; the ONNX reads pairs of its own data as transformers does
    code, out, err = cli("export", f"hf:{folder}", "--target", "onnx", "--data", tmp_path / "pairs.tsv",
                         "-o", tmp_path / "rr.onnx")  # fmt: skip
    assert code == 0, err
    assert "input:   token_type_ids: [1..64]x[1..128] int64" in out
    from ptopt.core.modelref import load_model

    onnx = load_model(tmp_path / "rr.onnx")
    assert set(ptopt.load_data(tmp_path / "pairs.tsv", model=onnx).x) == set(ds.x)


def test_a_stray_tab_in_a_text_file_is_part_of_its_text(bert, tmp_path):
    """Only a .tsv, or a text file whose every line holds a tab, is pairs: one tab pasted into a line of a
    calibration file leaves it one text per line, as before pairs were read."""
    root, folder = bert
    (tmp_path / "calib.txt").write_text("the cat sat\ton the mat\na dog ran\nthe big red house\n")
    ds = ptopt.load_data(tmp_path / "calib.txt", model=f"hf:{folder}")
    assert list(ds.x) == ["input_ids", "attention_mask"] and "(3 lines," in ds.name


def test_pairs_are_refused_where_a_line_holds_no_pair_or_the_model_no_token_types(bert, cli, tmp_path):
    from ptopt.core.modelref import load_model

    root, folder = bert
    (tmp_path / "bad.tsv").write_text("the cat\ta dog\nthe big house\n")
    assert_refused(cli, "export", f"hf:{folder}", "--target", "onnx", "--data", tmp_path / "bad.tsv",
                   "-o", tmp_path / "x.onnx", where=tmp_path,
                   match=("line 2 of 2 holds 1 text(s)", "one pair per line (first<TAB>second)"))  # fmt: skip
    (tmp_path / "pairs.tsv").write_text(PAIRS)
    code, _, err = cli("export", f"hf:{folder}", "--target", "torchscript", "-o", tmp_path / "plain.pt")
    assert code == 0, err  # the implied inputs: input_ids and attention_mask
    with pytest.raises(DataError, match="pairs, and this model takes no token_type_ids"):
        ptopt.load_data(tmp_path / "pairs.tsv", model=load_model(tmp_path / "plain.pt", allow_pickle=True))
