"""Labels given for a feature output (a removed ``nn.Identity`` head, a normalization, an embedding):
top-1 is measured as asked, but one ``note:`` says the outputs look like features, in quantize's
output and validate's report notes (it read ``top1 0.00%`` and a drop gate passed with nothing said).
A head's outputs get no note."""

from __future__ import annotations

import json

import torch

import ptopt
from ptopt.core.scores import labels_on_features

FAST = {"min_iters": 3, "min_seconds": 0.01, "rounds": 2}
FEATURES, HEAD, DATA = "tests.helpers:tiny_cnn_features", "tests.helpers:tiny_cnn", "tests.helpers:digits8_xy"
NOTE = "labels were given, but the outputs look like features: its fc is nn.Identity (the classifier was removed)"


def test_labels_on_features_notes_the_layers_that_say_features():
    assert labels_on_features((4, 16), "Identity as fc").startswith(NOTE)
    assert "a normalization (LayerNorm)" in labels_on_features((4, 16), "LayerNorm")
    assert "an embedding (Embedding)" in labels_on_features((4, 16), "Embedding")
    for layer in ("Linear", "Conv2d", None):  # a head, or not known: no note
        assert labels_on_features((4, 16), layer) is None
    assert labels_on_features((4, 3, 8, 8), "LayerNorm") is None  # not [N, classes]: said elsewhere
    probs = torch.randn(4, 10).softmax(-1)
    assert labels_on_features(probs.shape, "Linear", outputs=probs) is None


def test_quantize_notes_labels_on_features(cli, tmp_path):
    for model, noted in ((FEATURES, True), (HEAD, False)):
        args = ("quantize", model, "--mode", "static", "--calib-data", DATA, "--eval-data", DATA)
        code, out, err = cli(*args, "-o", tmp_path / "q.pt")
        assert code == 0, err
        assert "accuracy on tests.helpers:digits8_xy" in out  # still measured as asked
        assert (f"note: {NOTE}" in out) is noted and out.count("note: labels") == int(noted), out
    from tests.helpers import tiny_cnn_features

    result = ptopt.quantize(tiny_cnn_features(), "static", calib_data=DATA, eval_data=DATA)
    assert result.metrics["labels_note"].startswith(NOTE) and "fp32_accuracy" in result.metrics


def test_validate_notes_labels_on_features_and_keeps_the_verdict(cli, tmp_path):
    report = tmp_path / "v.json"
    args = ("validate", FEATURES, FEATURES, "--data", DATA, "--max-accuracy-drop", "1", "--batch-sizes", "1")
    fast = ("--min-iters", "3", "--min-seconds", "0.01", "--rounds", "2")
    code, out, err = cli(*args, *fast, "--json", report)
    assert code == 0, err
    assert out.count("note: labels were given") == 1 and "outputs look like features" in out
    notes = json.loads(report.read_text())["notes"]
    assert sum(n.startswith(NOTE) for n in notes) == 1
    from tests.helpers import tiny_cnn, tiny_cnn_features

    result = ptopt.validate(tiny_cnn_features(), [tiny_cnn_features()], data=DATA, batch_sizes=[1], **FAST)
    assert any(n.startswith(NOTE) for n in result.data["notes"])
    result = ptopt.validate(tiny_cnn(), [tiny_cnn()], data=DATA, batch_sizes=[1], max_accuracy_drop=1, **FAST)
    assert result.passed and not any("look like features" in n for n in result.data["notes"])


def test_prune_names_its_accuracy_data_and_notes_labels_on_features(cli, tmp_path):
    for model, noted in ((FEATURES, True), (HEAD, False)):
        args = ("prune", model, "--method", "l1-unstructured", "--amount", "0.3", "--eval-data", DATA)
        code, out, err = cli(*args, "-o", tmp_path / "p.pt")
        assert code == 0, err
        assert (
            "on tests.helpers:digits8_xy (" in out.split("accuracy:")[1].splitlines()[0]
        )  # what it measured on
        assert (f"note:       {NOTE}" in out) is noted and out.count("labels were given") == int(noted), out
    from tests.helpers import tiny_cnn_features

    result = ptopt.prune(tiny_cnn_features(), "l1-unstructured", 0.3, eval_data=DATA)
    assert result.metrics["labels_note"].startswith(NOTE) and result.metrics["accuracy_samples"] > 0


class _VggLike(torch.nn.Module):
    """A classifier Sequential whose last Linear was replaced by nn.Identity (VGG's ``classifier[6]``)."""

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten())
        self.classifier = torch.nn.Sequential(torch.nn.Linear(144, 16), torch.nn.ReLU(), head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def test_a_users_torchscript_file_keeps_its_removed_head(cli, tmp_path):
    """A TorchScript file the user traced (no sidecar): its inlined graph loses the nn.Identity (traced,
    it returns what came before), so a feature extractor ending in Conv + ReLU or Linear + ReLU read as
    class scores. The submodule and its parent's call stay in the archive."""
    from ptopt.core.scores import output_layer
    from tests.helpers import tiny_cnn, tiny_cnn_features

    x = torch.randn(2, 1, 8, 8)
    cases = (
        (tiny_cnn_features().eval(), "Identity as fc"),
        (_VggLike(torch.nn.Identity()).eval(), "Identity as classifier.2"),
        (_VggLike(torch.nn.Linear(16, 10)).eval(), "aten::linear"),
        (tiny_cnn().eval(), "aten::linear"),
    )
    for i, (model, layer) in enumerate(cases):
        torch.jit.trace(model, x).save(tmp_path / f"m{i}.pt")
        assert output_layer(torch.jit.load(tmp_path / f"m{i}.pt"), x) == layer
    args = ("validate", tmp_path / "m0.pt", tmp_path / "m0.pt", "--data", DATA, "--batch-sizes", "1")
    code, out, err = cli(*args, "--min-iters", "3", "--min-seconds", "0.01", "--rounds", "2")
    assert code == 0, err
    assert f"note: {NOTE}" in " ".join(out.split())  # the report wraps its notes
