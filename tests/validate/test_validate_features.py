"""validate on a model whose outputs are features, not class scores (a sentence encoder's pooled
LayerNorm states): top-1 agreement is not measured (it was: the arg-max of an embedding is one feature
dimension, and a faithful int8 encoder scored far below 99% on it, which also kept it from ★ best);
the report says why, --min-agreement is refused naming --min-cosine, and --min-cosine gates any output."""

import re

import pytest
import torch

from ptopt.core.errors import UsageError
from tests.helpers import assert_refused
from tests.validate.conftest import FACTORY, FAST

ENCODER = "ptopt.models.minilm:minilm_tiny"
SENTENCES = "ptopt.models.minilm:heldout_sentences"
LATENCY = {"min_iters": 3, "min_seconds": 0.01, "rounds": 2}


@pytest.fixture(scope="module")
def int8_encoder(tmp_path_factory):
    from ptopt.compress.quantize.api import quantize

    path = tmp_path_factory.mktemp("features") / "enc-int8.pt"
    quantize(ENCODER, "dynamic", path, progress=False)
    return path


def _validate(int8_encoder, **gates):
    from ptopt.validate.api import validate

    return validate(ENCODER, [int8_encoder], SENTENCES, batch_sizes=[1], max_samples=32, threads=1,
                    latency=LATENCY, **gates)  # fmt: skip


def test_api_embeddings_get_no_top1_and_the_cosine_gates_them(int8_encoder):
    res = _validate(int8_encoder, min_cosine=0.9).to_dict()
    agr = res["artifacts"][0]["agreement"]
    assert agr["top1_agreement"] is None and agr["min_cosine"] > 0.99
    note = next(n for n in res["notes"] if n.startswith("top-1 agreement not measured"))
    assert "normalization (LayerNorm)" in note and "--min-cosine" in note
    (gate,) = res["gate_results"]
    assert gate["gate"] == "min-cosine" and gate["passed"] and "worst-sample cosine" in gate["message"]
    assert res["best"] == res["artifacts"][0]["name"]
    failed = _validate(int8_encoder, min_cosine=1.0 - 1e-12).to_dict()  # int8 is not bit-exact
    assert not failed["passed"] and failed["gate_results"][0]["value"] < 1.0


def test_a_classifier_without_labels_keeps_its_top1_agreement(artifacts):
    from ptopt.validate.api import validate

    res = validate(FACTORY, [artifacts["onnx"]], artifacts["unlabeled"], batch_sizes=[1], threads=1,
                   latency=LATENCY, min_agreement=0.9, min_cosine=0.99).to_dict()  # fmt: skip
    assert res["artifacts"][0]["agreement"]["top1_agreement"] is not None
    assert not any(n.startswith("top-1 agreement not measured") for n in res["notes"])
    assert {g["gate"] for g in res["gate_results"]} == {"min-agreement", "min-cosine"} and res["passed"]


def test_cli_min_agreement_on_embeddings_is_refused_naming_the_cosine_gate(cli, int8_encoder):
    code, out, err = cli("validate", ENCODER, int8_encoder, "--data", SENTENCES, "--max-samples", "16",
                         "--batch-sizes", "1", "--threads", "1", "--min-agreement", "0.9", *FAST)  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert all(
        s in " ".join(err.split())
        for s in ("needs class scores", "normalization (LayerNorm)", "--min-cosine")
    )


def test_cli_min_cosine_gates_and_the_note_is_printed(cli, int8_encoder):
    args = ("validate", ENCODER, int8_encoder, "--data", SENTENCES, "--max-samples", "16", "--batch-sizes", "1",
            "--threads", "1", *FAST)  # fmt: skip
    code, out, err = cli(*args, "--min-cosine", "0.9")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "top-1 agreement not measured" in flat and "worst-sample cosine" in flat
    code, out, err = cli(*args, "--min-cosine", "0.999999999999")
    assert code == 1 and "min-cosine" in out + err
    assert_refused(cli, *args, "--min-cosine", "1.5", match="--min-cosine is a cosine similarity in [-1, 1]")


def test_quantize_and_prune_name_no_top1_for_embeddings(cli, tmp_path):
    code, out, err = cli(
        "quantize", ENCODER, "--mode", "dynamic", "--eval-data", SENTENCES, "-o", tmp_path / "q.pt"
    )
    assert code == 0, err
    assert "top-1 agreement not measured: its output comes from a normalization (LayerNorm)" in out
    assert "top-1 agreement with fp32" not in out and "vs fp32: min cosine" in out
    from ptopt.compress.prune.api import prune
    from ptopt.compress.prune.config import PruneWarning

    with pytest.warns(PruneWarning, match="keeps its attention heads"):
        res = prune(ENCODER, "structured", 0.3, prune_hidden=False, eval_data=SENTENCES)
    vs = res.metrics["vs_source"]
    assert vs["top1_agreement"] is None and vs["min_cosine"] > 0


def test_quantize_top1_agreement_of_lm_logits_is_per_token_not_over_100_percent(tmp_path):
    import torch

    from ptopt.compress.quantize.api import quantize

    data = tmp_path / "ids.pt"
    torch.save({"x": torch.randint(0, 20, (8, 6), generator=torch.Generator().manual_seed(0))}, data)
    art = quantize(
        "tests.core.test_scores:TiedLM", "dynamic", tmp_path / "q.pt", eval_data=str(data), progress=False
    )
    assert 0 <= art.metrics["top1_agreement"] <= 1  # was 6.0: token agreements over samples


class _Embedder(torch.nn.Module):
    """A projection head that returns a dict, as CLIP's ``*WithProjection`` models do."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(12, 8)

    def forward(self, x):
        return {"image_embeds": self.proj(x), "pooled": x.mean(-1, keepdim=True)}


def test_an_exported_graph_keeps_the_models_output_names_and_its_verdict(tmp_path):
    """ONNX outputs are named after the model's dict keys (they were ``output_0``, ``output_1``): a
    server answers ``image_embeds``, and validate reads the name as features (a Linear computes it)."""
    import onnx

    from ptopt.core.scores import onnx_output_layer
    from ptopt.export.api import export
    from ptopt.validate.api import validate

    torch.manual_seed(0)
    export(_Embedder().eval(), "onnx", tmp_path / "e.onnx", input_shapes=["2x12"])
    graph = onnx.load(str(tmp_path / "e.onnx"), load_external_data=False).graph
    assert [o.name for o in graph.output] == ["image_embeds", "pooled"]
    assert onnx_output_layer(tmp_path / "e.onnx") == "image_embeds"
    torch.save(torch.randn(16, 12), tmp_path / "x.pt")
    with pytest.raises(UsageError, match="its output is named image_embeds"):
        validate(tmp_path / "e.onnx", [tmp_path / "e.onnx"], tmp_path / "x.pt", batch_sizes=[1], threads=1,
                 latency=LATENCY, min_agreement=0.9)  # fmt: skip


class _EchoNamed(torch.nn.Module):
    """A dict output whose key is also the graph's input name (``input``)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return {"input": self.lin(x), "1": x.sum(-1, keepdim=True), "output_1": x[:, :2]}


def test_an_output_key_never_takes_an_input_name(tmp_path):
    """An ONNX value name is assigned once: a dict key equal to an input name (or to another output's
    name) is renamed, not a failed export ("'input' has been used as output names multiple times")."""
    import onnx

    from ptopt.export.api import export
    from ptopt.formats.capture import output_names

    export(_EchoNamed().eval(), "onnx", tmp_path / "n.onnx", input_shapes=["2x4"])
    graph = onnx.load(str(tmp_path / "n.onnx"), load_external_data=False).graph
    names = [i.name for i in graph.input] + [o.name for o in graph.output]
    assert len(set(names)) == len(names) and graph.output[0].name.startswith("input_")
    assert output_names(1, None, ["output"]) == ["output_0"]


def test_an_unrelated_embedding_is_not_best_without_a_gate():
    """Without a metric or gate, ★ needs 99% top-1 agreement; features have none, so their worst-sample
    cosine stands in (an artifact whose embeddings have nothing to do with the reference's was ★)."""
    from ptopt.validate.api import validate

    torch.manual_seed(0)
    ref = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)
    )
    other = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.LayerNorm(64))
    res = validate(ref.eval(), [other.eval(), ref], torch.randn(32, 16), batch_sizes=[1], threads=1,
                   latency=LATENCY).to_dict()  # fmt: skip
    bad, same = res["artifacts"]
    assert bad["agreement"]["top1_agreement"] is None and bad["agreement"]["min_cosine"] < 0.9
    assert res["best"] != bad["name"]


class _BatchNormFeatures(torch.nn.Module):
    """Pooled BatchNorm states (a ResNet's feature extractor ends so): ONNX and OpenVINO fold the
    BatchNorm into the Conv before it, so their graphs read as a Conv head."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)).mean((2, 3))


def test_the_sidecar_keeps_the_source_modules_verdict_where_the_file_graph_loses_it(tmp_path, cli):
    """The layer read on the module a file was written from is recorded (``extra.output_layer``) and
    decides for the file as a reference: its ONNX graph alone reads as a Conv, i.e. class scores."""
    from ptopt.core.artifact import sidecar_path
    from ptopt.core.scores import onnx_output_layer
    from ptopt.export.api import export
    from ptopt.validate.runners import open_runner

    torch.manual_seed(0)
    path = tmp_path / "f.onnx"
    art = export(_BatchNormFeatures().eval(), "onnx", path, input_shapes=["2x3x8x8"]).artifact
    assert art.extra["output_layer"] == "BatchNorm2d" and onnx_output_layer(path) == "Conv"
    torch.save(torch.randn(16, 3, 8, 8), tmp_path / "x.pt")
    args = (
        "validate",
        path,
        path,
        "--data",
        tmp_path / "x.pt",
        "--batch-sizes",
        "1",
        "--threads",
        "1",
        *FAST,
    )
    code, out, err = cli(*args, "--min-agreement", "0.9")
    assert code == 2 and "normalization (BatchNorm2d)" in " ".join(err.split()), err
    x = torch.randn(1, 3, 8, 8)
    runner = open_runner(path, "f.onnx")
    assert runner.score_layer(x) == "BatchNorm2d"
    runner.close()
    sidecar_path(path).unlink()  # a file with no record: its own graph decides
    runner = open_runner(path, "f.onnx")
    assert runner.score_layer(x) == "Conv"
    runner.close()


class _IdentityHead(torch.nn.Module):
    """A CNN whose classifier a user replaced by ``nn.Identity`` to get its features."""

    def __init__(self):
        super().__init__()
        self.conv, self.act, self.fc = torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Identity()

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).mean((2, 3)))


def test_an_int8_file_keeps_the_fp32_models_verdict(tmp_path, cli):
    """The int8 graph has lost the ``nn.Identity`` (it reads as a quantized Conv head): the sidecar
    records the fp32 model's reading, so the int8 file as a reference gets no top-1 agreement."""
    from ptopt.compress.quantize.api import quantize
    from ptopt.core.modelref import as_loaded
    from ptopt.core.scores import _script_output_layer

    torch.manual_seed(0)
    torch.save(torch.randn(32, 3, 8, 8), tmp_path / "x.pt")
    res = quantize(
        _IdentityHead().eval(), "static", tmp_path / "q.pt", calib_data=tmp_path / "x.pt", progress=False
    )
    assert res.artifact.extra["output_layer"] == "Identity as fc"
    assert "conv" in _script_output_layer(as_loaded(tmp_path / "q.pt").module)  # the graph alone: a head
    args = ("validate", tmp_path / "q.pt", tmp_path / "q.pt", "--data", tmp_path / "x.pt", "--batch-sizes", "1",
            "--threads", "1", *FAST)  # fmt: skip
    code, out, err = cli(*args, "--min-agreement", "0.9")
    assert code == 2 and "its fc is nn.Identity" in " ".join(err.split()), err


def test_cli_an_artifact_of_another_output_width_says_why_it_is_not_compared(cli, tmp_path):
    """A pruned base model outputs a narrower hidden size: its agreement cells were blank with no word
    of why (the JSON alone held 'output shape ... differs'). The footer says it."""
    code, _, err = cli("prune", ENCODER, "--method", "structured", "--amount", "0.3", "-o", tmp_path / "p.pt")
    assert code == 0 and "output is narrower" in err, err
    code, out, err = cli("validate", ENCODER, tmp_path / "p.pt", "--data", SENTENCES, "--max-samples", "16",
                         "--batch-sizes", "1", "--threads", "1", *FAST)  # fmt: skip
    assert code == 0, err
    said = re.search(r"not compared: p\.pt: output shape \(16, (\d+)\) differs from the reference's \(16, 32\)",
                     " ".join(out.split()))  # fmt: skip
    assert said and int(said.group(1)) < 32, out
