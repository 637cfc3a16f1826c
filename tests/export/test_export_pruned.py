"""A pruned file exports from its eager module, rebuilt from the parent its sidecar names
(``core.modelref.rebuilt_eager``, filled by ``compress.rebuild``): a pruned Hugging Face classifier's
TorchScript returns a dict, which the TorchScript ONNX exporter refused (``prim::DictConstruct``) after
printing the whole Torch IR graph."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from tests.helpers import assert_refused

BERT = "tests.compress.hf_models:bert"


@pytest.fixture(scope="module")
def pruned_bert(tmp_path_factory):
    from ptopt.compress.prune.api import prune
    from ptopt.compress.prune.config import PruneWarning

    d = tmp_path_factory.mktemp("pruned_bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PruneWarning)
        # the hidden size kept (128): OpenVINO 2026.4's CPU plugin segfaults under ONEDNN_MAX_CPU_ISA=AVX2 on
        # this BERT pruned to a hidden size of 90 (docs/prune.md); the heads and the FFN are still pruned
        prune(BERT, "structured", 0.3, d / "b.pt", input_shapes=["input_ids=2x12", "attention_mask=2x12"],
              prune_hidden=False)  # fmt: skip
    return d / "b.pt"


def test_cli_exports_a_pruned_hugging_face_classifier_to_onnx(cli, pruned_bert, tmp_path):
    code, out, err = cli(
        "export", pruned_bert, "--allow-pickle", "--target", "onnx", "-o", tmp_path / "b.onnx"
    )
    assert code == 0, err
    assert "wrote" in out and "cosine 1.0" in out
    side = json.loads((tmp_path / "b.onnx.ptopt.json").read_text())
    assert side["parent"]["path"] == str(pruned_bert) and side["parent"]["format"] == "torchscript"


def test_api_exports_a_pruned_hugging_face_classifier_to_openvino(pruned_bert, tmp_path):
    pytest.importorskip("openvino")
    import ptopt

    res = ptopt.export(pruned_bert, "openvino", tmp_path / "b.xml", allow_pickle=True, progress=False)
    assert res.artifact.parent["path"] == str(pruned_bert)
    assert (tmp_path / "b.xml").is_file()


def test_without_consent_the_refusal_says_how_to_rebuild(cli, pruned_bert, tmp_path):
    """Its parent is a Python factory: without --allow-pickle the file exports as it is, and fails."""
    import ptopt
    from ptopt.core.errors import UnsupportedModelError

    match = ("prim::DictConstruct", "exported as it is", "--allow-pickle")
    assert_refused(cli, "export", pruned_bert, "--target", "onnx", "-o", tmp_path / "b.onnx", match=match)
    assert_refused(
        ptopt.export, pruned_bert, "onnx", progress=False, match=match, error=UnsupportedModelError
    )


class _DictOut(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": x * 2}


def test_a_failed_torchscript_onnx_export_prints_no_torch_ir(cli, tmp_path, capfd):
    """torch turns its ONNX C++ log on for every TorchScript-path export: a failure printed the whole graph
    to file descriptor 1 ("Torch IR graph at exception: ..."), before ptopt's one error line."""
    import ptopt
    from ptopt.core.errors import UnsupportedModelError

    torch.jit.save(torch.jit.script(_DictOut()), str(tmp_path / "d.pt"))
    code, out, err = cli(
        "export", tmp_path / "d.pt", "--target", "onnx", "--input-shape", "2x3", "-o", "d.onnx"
    )
    assert code == 2 and err.startswith("error:") and "prim::DictConstruct" in err, err
    with pytest.raises(UnsupportedModelError):
        ptopt.export(tmp_path / "d.pt", "onnx", input_shapes="2x3", progress=False)
    native = capfd.readouterr()
    assert "Torch IR" not in native.out + native.err and "prim::" not in native.out
