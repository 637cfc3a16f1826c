"""A pruned ``.pt`` / ``.pt2`` goes on to distill, quantize and prune again (``compress.rebuild``): its eager
module is rebuilt from the parent its sidecar names, pruned again the same way, with the file's own
tensors. It was refused ("a student must be trainable"), so from the command line a pruned model could
be neither distilled (with --nproc, checkpoints) nor quantized in PyTorch."""

import json
import shutil
import warnings

import pytest
import torch

from tests.helpers import assert_refused

ENCODER = "ptopt.models.minilm:minilm_tiny"
SENTENCES = "ptopt.models.minilm:tuning_sentences"
CNN = "tests.helpers:tiny_cnn"


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    """The encoder pruned (structured, its FFN: --no-prune-hidden) to .pt and .pt2, and fine-tuned by
    distillation on a few sentences (its tensors differ from a fresh pruning's)."""
    from ptopt.compress.prune.api import prune
    from ptopt.compress.prune.config import PruneWarning

    d = tmp_path_factory.mktemp("pruned")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PruneWarning)
        prune(ENCODER, "structured", 0.5, d / "p.pt", prune_hidden=False)
        prune(ENCODER, "structured", 0.5, d / "p.pt2", prune_hidden=False)
        prune(ENCODER, "structured", 0.5, d / "ft.pt", prune_hidden=False, fine_tune_data=SENTENCES, epochs=1,
              teacher="self")  # fmt: skip
    return d


def _params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", ["p.pt", "p.pt2", "ft.pt"])
def test_the_rebuilt_module_is_the_files_model(pruned, name):
    from ptopt.compress.stage import load_eager
    from ptopt.core.modelref import load_model

    loaded = load_eager(pruned / name, None, True, "distillation")  # its parent is a factory: consent
    assert loaded.format == "eager" and loaded.info["rebuilt_from"] == str(pruned / name)
    assert isinstance(loaded.module, torch.nn.Module) and not isinstance(
        loaded.module, torch.jit.ScriptModule
    )
    file_model = load_model(pruned / name).module
    assert all(torch.equal(a, b) for a, b in zip(loaded.module.state_dict().values(),
                                                  file_model.state_dict().values(), strict=True))  # fmt: skip
    assert loaded.parent_record()["format"] == ("torchscript" if name.endswith(".pt") else "exported_program")


def test_cli_distills_a_pruned_student(cli, pruned, tmp_path):
    code, out, err = cli("distill", "--teacher", ENCODER, "--student", pruned / "ft.pt", "--train-data", SENTENCES,
                         "--alpha", "0", "--epochs", "1", "--allow-pickle", "-o", tmp_path / "d.pt")  # fmt: skip
    assert code == 0, err
    assert "parameters, 0.9" in out  # the pruned student's share of the teacher: 0.9..x (its FFN halved)
    assert "the student starts from trained weights" in " ".join(err.split())  # and --lr 3e-3 may undo them
    side = json.loads((tmp_path / "d.pt.ptopt.json").read_text())
    assert side["config"]["student"] == str(pruned / "ft.pt")


def test_cli_quantizes_and_prunes_again_a_pruned_file(cli, pruned, tmp_path):
    code, out, err = cli(
        "quantize", pruned / "p.pt2", "--mode", "dynamic", "--allow-pickle", "-o", tmp_path / "q.pt"
    )
    assert code == 0, err
    assert "vs fp32: min cosine" in out
    code, out, err = cli("prune", pruned / "p.pt", "--method", "structured", "--amount", "0.3",
                         "--no-prune-hidden", "--allow-pickle", "-o", tmp_path / "pp.pt")  # fmt: skip
    assert code == 0, err
    small = torch.jit.load(str(tmp_path / "pp.pt"))
    assert _params(small) < _params(torch.jit.load(str(pruned / "p.pt")))


def test_unstructured_pruning_rebuilds_as_its_parent_with_the_files_tensors(cli, tmp_path):
    from ptopt.compress.prune.api import prune
    from ptopt.compress.stage import load_eager

    prune(CNN, "l1-unstructured", 0.5, tmp_path / "u.pt")
    loaded = load_eager(tmp_path / "u.pt", None, True, "quantization")
    zeros = sum(int((p == 0).sum()) for n, p in loaded.module.named_parameters() if n.endswith("weight"))
    assert zeros > 0  # the file's masked weights, not the parent's
    code, out, err = cli("quantize", tmp_path / "u.pt", "--mode", "static", "--calib-data", "builtin:digits:train",
                         "--allow-pickle", "-o", tmp_path / "uq.pt")  # fmt: skip
    assert code == 0, err


def test_refusals_name_the_step_that_failed(cli, pruned, tmp_path):
    for name in ("p.pt", "p.pt.ptopt.json"):
        shutil.copy(pruned / name, tmp_path / name)
    side = json.loads((tmp_path / "p.pt.ptopt.json").read_text())
    side["parent"]["path"] = "tests.helpers:tiny_cnn"  # another model: pruning it again gives other tensors
    (tmp_path / "p.pt.ptopt.json").write_text(json.dumps(side))
    args = ("distill", "--teacher", ENCODER, "--student", tmp_path / "p.pt", "--train-data", SENTENCES,
            "--alpha", "0", "-o", tmp_path / "d.pt")  # fmt: skip
    # a factory the file names runs only with consent: a module shipped beside it would run
    assert_refused(cli, *args, match=("a student must be trainable", "its eager model can be rebuilt",
                                      "tests.helpers:tiny_cnn", "only with --allow-pickle"), where=tmp_path)  # fmt: skip
    args += ("--allow-pickle",)
    assert_refused(
        cli, *args, match=("is a pruned torchscript file", "tests.helpers:tiny_cnn"), where=tmp_path
    )
    side["parent"]["path"] = str(tmp_path / "gone.pt")
    (tmp_path / "p.pt.ptopt.json").write_text(json.dumps(side))
    assert_refused(cli, *args, match="its parent does not load", where=tmp_path)


def test_a_zoo_parent_needs_no_consent(tmp_path):
    from ptopt.compress.prune.api import prune
    from ptopt.compress.stage import load_eager

    prune("zoo:resnet", "structured", 0.4, tmp_path / "r.pt", steps=2)  # rounds to 0.2 then 0.4: same shapes
    assert load_eager(tmp_path / "r.pt", None, False, "quantization").format == "eager"


def test_sidecars_whose_parents_lead_back_are_one_refusal(tmp_path):
    """b.pt pruned from a.pt, then a.pt overwritten by a pruning of b.pt: each names the other as its
    parent. It was a recursion until Python's limit (an error message of ~100 kB)."""
    from ptopt.compress.prune.api import prune
    from ptopt.compress.stage import load_eager
    from ptopt.core.errors import UnsupportedModelError

    prune(CNN, "l1-unstructured", 0.3, tmp_path / "a.pt")
    prune(tmp_path / "a.pt", "l1-unstructured", 0.5, tmp_path / "b.pt", allow_pickle=True)
    side = json.loads((tmp_path / "a.pt.ptopt.json").read_text())
    side["parent"] = {"path": str(tmp_path / "b.pt"), "format": "torchscript"}
    (tmp_path / "a.pt.ptopt.json").write_text(json.dumps(side))
    with pytest.raises(UnsupportedModelError, match="lead back to this file") as e:
        load_eager(tmp_path / "a.pt", None, True, "quantization")
    assert len(str(e.value)) < 2000


def test_a_relative_parent_is_found_beside_the_file_from_another_folder(tmp_path, monkeypatch):
    """The sidecar records the parent as given (``a.pt``, relative to where prune ran): used from
    another folder, it is found beside the file (it was "its parent does not load")."""
    from ptopt.compress.prune.api import prune
    from ptopt.compress.stage import load_eager

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    prune("zoo:resnet", "structured", 0.3, "a.pt")
    prune("a.pt", "structured", 0.3, "b.pt")
    assert json.loads((work / "b.pt.ptopt.json").read_text())["parent"]["path"] == "a.pt"
    monkeypatch.chdir(tmp_path)
    loaded = load_eager(work / "b.pt", None, False, "quantization")
    assert loaded.format == "eager" and loaded.info["rebuilt_from"] == str(work / "b.pt")


def test_a_parent_changed_since_the_pruning_is_named_when_the_rebuild_fails(tmp_path):
    from ptopt.compress.prune.api import prune
    from ptopt.compress.stage import load_eager
    from ptopt.core.errors import UnsupportedModelError

    prune("zoo:resnet", "structured", 0.3, tmp_path / "a.pt")
    prune(tmp_path / "a.pt", "structured", 0.3, tmp_path / "b.pt")
    assert load_eager(tmp_path / "b.pt", None, False, "quantization").format == "eager"
    prune("zoo:resnet", "structured", 0.5, tmp_path / "a.pt")  # another a.pt since
    with pytest.raises(UnsupportedModelError) as e:
        load_eager(tmp_path / "b.pt", None, False, "quantization")
    assert "does not give the file's tensors" in str(e.value)
    assert str(e.value).endswith(
        "is not the file it was pruned from (its sha256 differs from the one recorded)"
    )


def test_which_parents_need_consent(tmp_path):
    """Only a reference that imports Python (``pkg.module:factory``) needs --allow-pickle; files go
    through the safe loaders, ``zoo:`` is ptopt's own, ``hf:`` loads local safetensors without remote code."""
    from ptopt.compress.rebuild import _runs_code

    (tmp_path / "m.py").write_text("raise SystemExit('never imported')\n")
    assert _runs_code("tests.helpers:tiny_cnn") and _runs_code("m:factory")
    assert (
        not _runs_code("zoo:resnet")
        and not _runs_code(f"hf:{tmp_path}")
        and not _runs_code(str(tmp_path / "m.py"))
    )


def test_a_pruned_hugging_face_classifier_goes_on_to_quantize_and_distill(cli, tmp_path):
    """TorchScript keeps BERT's non-persistent buffers (``position_ids``) in its state dict: the strict
    load refused them ("unexpected keys"). And a Hugging Face teacher's ``SequenceClassifierOutput`` was
    compared as if it were a tensor (an internal error in distill)."""
    from tests.compress.hf_models import bert_tokens

    torch.save(bert_tokens(16, 12), tmp_path / "tok.pt")
    shapes = ("--input-shape", "input_ids=2x12", "--input-shape", "attention_mask=2x12")
    code, out, err = cli("prune", "tests.compress.hf_models:bert", "--method", "structured", "--amount", "0.3",
                         *shapes, "-o", tmp_path / "b.pt")  # fmt: skip
    assert code == 0, err
    code, out, err = cli(
        "quantize", tmp_path / "b.pt", "--mode", "dynamic", "--allow-pickle", "-o", tmp_path / "q.pt"
    )
    assert code == 0, err
    code, out, err = cli("distill", "--teacher", "tests.compress.hf_models:bert", "--student", tmp_path / "b.pt",
                         "--allow-pickle", "--train-data", tmp_path / "tok.pt", "--alpha", "0", "--max-steps", "1",
                         "-o", tmp_path / "d.pt")  # fmt: skip
    assert code == 0, err
    assert "top-1 agreement" in out  # class scores: a Linear head


def test_quantizing_a_pruned_file_says_what_its_size_is_compared_with(cli, pruned, tmp_path):
    """The int8 file is compared with the fp32 model as frozen TorchScript, not with the file given (a pruned
    .pt of other bytes): the line read "the fp32 TorchScript (7,981,414 bytes)" of an 8,754,959-byte file."""
    import ptopt

    code, out, err = cli(
        "quantize", pruned / "p.pt", "--mode", "dynamic", "--allow-pickle", "-o", tmp_path / "q.pt"
    )
    assert code == 0, err
    fp32 = json.loads((tmp_path / "q.pt.ptopt.json").read_text())["metrics"]["fp32_torchscript_bytes"]
    given = (pruned / "p.pt").stat().st_size
    line = " ".join(out.split())
    assert f"the fp32 model as frozen TorchScript ({fp32:,} bytes; p.pt itself: {given:,} bytes)" in line, out
    res = ptopt.quantize(pruned / "p.pt", "dynamic", allow_pickle=True, progress=False)
    assert res.metrics["fp32_torchscript_bytes"] < given  # frozen: not the file's bytes
