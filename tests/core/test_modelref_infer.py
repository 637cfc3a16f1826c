"""What a model takes when nobody said: integer inputs found from embeddings, Hugging Face configs,
and the ``--input-shape`` a refusal suggests (which works when pasted)."""

import shlex

import pytest
import torch
from torch import nn

from ptopt.core.errors import UsageError
from ptopt.core.input_infer import embedding_inputs, suggest_input_shapes
from ptopt.core.inputspec import InputSpec, parse_named_shapes
from ptopt.core.modelref import as_loaded, require_input_specs, resolve_inputs, run_checked
from tests.compat.models import pooled_cnn, token_classifier
from tests.helpers import assert_refused, tiny_cnn, two_input


def _resolved(model, *shapes):
    loaded = as_loaded(model)
    return resolve_inputs(loaded, input_shapes=parse_named_shapes(shapes))


@pytest.mark.parametrize(
    "factory,shapes,want",
    [
        (token_classifier, ["2x16"], [("input", "int64", (0, 100))]),
        (token_classifier, ["2x16:int32"], [("input", "int32", (0, 100))]),
        (
            two_input,
            ["input_ids=2x8", "attention_mask=2x8"],
            [("input_ids", "int64", (0, 1 + 64 * 17)), ("attention_mask", "int64", None)],
        ),
        (
            two_input,
            ["input_ids=2x8:int64", "attention_mask=2x8:bool"],
            [("input_ids", "int64", (0, 1 + 64 * 17)), ("attention_mask", "bool", None)],
        ),
        (
            two_input,
            ["input_ids=2x8:float32", "attention_mask=2x8:float32"],
            [("input_ids", "float32", None), ("attention_mask", "float32", None)],
        ),
        (pooled_cnn, ["2x3x32x32"], [("input", "float32", None)]),
    ],
    ids=[
        "embedding-infers-int64",
        "explicit-int32-gets-vocab",
        "keyword-ids-and-mask",
        "explicit-bool-mask",
        "explicit-float-wins",
        "conv-stays-float",
    ],
)
def test_dtype_from_the_shape_or_the_embedding(factory, shapes, want):
    loaded = _resolved(factory(), *shapes)
    assert [(s.name, s.dtype, s.value_range) for s in loaded.input_specs] == want


@pytest.mark.parametrize(
    "factory,shapes",
    [(token_classifier, ["3x16"]), (two_input, ["input_ids=3x8", "attention_mask=3x8"])],
    ids=["positional", "keyword"],
)
def test_inferred_integer_inputs_run_at_every_shape(factory, shapes):
    loaded = _resolved(factory(), *shapes)
    for which in ("min", "opt", "max"):
        x = loaded.example_inputs(which)
        ids = x if isinstance(x, torch.Tensor) else x["input_ids"]
        assert ids.dtype == torch.int64 and int(ids.max()) < loaded.input_specs[0].value_range[1]
        run_checked(loaded, x)


def test_a_model_without_embeddings_is_never_run():
    class Explodes(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            raise AssertionError("the probe ran a model that has no embedding")

    assert embedding_inputs(Explodes(), [InputSpec.static("x", (1, 4))], "positional", {"x"}) == {}


def test_the_probe_leaves_the_model_as_it_was():
    model = nn.Sequential(nn.Embedding(10, 4), nn.BatchNorm1d(3)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found = embedding_inputs(model, [InputSpec.static("x", (2, 3))], "positional", {"x"})
    assert found == {"x": 10}
    assert model.training and model[1].training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model[0]._forward_pre_hooks


def test_a_failing_forward_keeps_what_it_saw():
    class FailsLater(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(7, 4)

        def forward(self, ids, other):
            self.emb(ids)
            raise RuntimeError("fails after the embedding")

    specs = [InputSpec.static("ids", (1, 5)), InputSpec.static("other", (1, 5))]
    assert embedding_inputs(FailsLater(), specs, "positional", {"ids", "other"}) == {"ids": 7}


def test_the_dtype_reaches_onnx_torch_export_and_the_sidecar(tmp_path):
    import onnx

    import ptopt
    from ptopt.core.artifact import Artifact

    res = ptopt.export(token_classifier(), "onnx", tmp_path / "m.onnx", input_shapes="2x16:int32")
    graph_input = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph.input[0]
    assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.INT32
    assert res.inputs[0].dtype == "int32"
    spec = Artifact.load(tmp_path / "m.onnx").inputs[0]
    assert (spec.dtype, spec.value_range, spec.min_shape, spec.max_shape) == (
        "int32",
        (0, 100),
        (1, 16),
        (64, 16),
    )

    ep = ptopt.export(token_classifier(), "exported_program", tmp_path / "m.pt2", input_shapes="2x16")
    assert ep.inputs[0].dtype == "int64"
    assert Artifact.load(tmp_path / "m.pt2").inputs[0].dtype == "int64"


# -- Hugging Face models: the config says what they take -----------------------------------------------


def test_hugging_face_models_imply_token_inputs_from_their_config():
    pytest.importorskip("transformers")
    from tests.compat.models import VOCAB, bert, gpt2

    for model in (bert(), gpt2()):
        loaded = as_loaded(model)
        assert loaded.input_specs == []  # implied, not declared: data may bring token_type_ids too
        spec, mask = require_input_specs(loaded)
        assert loaded.input_style == "keyword"
        assert (spec.name, spec.dtype, spec.value_range) == ("input_ids", "int64", (0, VOCAB))
        # any length up to max_position_embeddings (64 < 128): a tokenizer's batch is as long as its longest text
        assert (spec.min_shape, spec.opt_shape, spec.max_shape) == ((1, 1), (1, 64), (64, 64))
        # the padding mask the dummy lacks: without it an artifact cannot take a padded batch
        assert (mask.name, mask.dtype, mask.value_range, mask.max_shape) == (
            "attention_mask",
            "int64",
            (0, 2),
            (64, 64),
        )
        x = loaded.example_inputs("opt", batch=3)
        assert x["attention_mask"][:, 0].all() and all(
            row.sort(descending=True).values.equal(row) for row in x["attention_mask"]
        )
        run_checked(loaded, x)


def test_hugging_face_shapes_get_token_dtypes():
    pytest.importorskip("transformers")
    from tests.compat.models import VOCAB, bert

    loaded = _resolved(bert(), "input_ids=2x16", "attention_mask=2x16", "token_type_ids=2x16")
    assert [(s.name, s.dtype, s.value_range) for s in loaded.input_specs] == [
        ("input_ids", "int64", (0, VOCAB)),
        ("attention_mask", "int64", None),
        ("token_type_ids", "int64", (0, 2)),
    ]
    run_checked(loaded, loaded.example_inputs("max"))


# -- suggestions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model,want",
    [
        (pooled_cnn(), ["1x3x224x224"]),
        (tiny_cnn(), ["1x1x224x224"]),
        (nn.Sequential(nn.Conv1d(12, 4, 3)), ["1x12x128"]),
        (token_classifier(), ["ids=1x64:int64"]),
        (two_input(), ["input_ids=1x128:int64", "attention_mask=1x128"]),
        (nn.Sequential(nn.Linear(20, 3)), ["1x20"]),
        (nn.LSTM(6, 8, batch_first=True), ["1x32x6"]),
        (nn.Sequential(nn.ReLU()), []),
    ],
    ids=[
        "conv2d",
        "conv2d-1ch",
        "conv1d",
        "embedding-with-positions",
        "embedding-two-inputs",
        "linear",
        "lstm",
        "nothing",
    ],
)
def test_suggested_shapes_come_from_the_first_layer(model, want):
    assert suggest_input_shapes(model) == want


def _pasted(message: str) -> list[str]:
    """The flags at the end of a refusal (``... suggests: --input-shape A --input-shape B``)."""
    return shlex.split(message.rsplit("suggests: ", 1)[1])


@pytest.mark.parametrize(
    "command,factory",
    [
        (["quantize", "--mode", "dynamic"], "pooled_cnn"),
        (["quantize", "--mode", "dynamic"], "token_classifier"),
        (["prune", "--method", "l1-unstructured", "--amount", "0.3"], "pooled_cnn"),
        (["export", "--target", "torchscript"], "token_classifier"),
    ],
    ids=["quantize-cnn", "quantize-tokens", "prune-cnn", "export-tokens"],
)
def test_the_suggested_shape_works_when_pasted(cli, tmp_path, command, factory):
    ref = f"tests.compat.models:{factory}"
    message = assert_refused(
        cli, command[0], ref, *command[1:], "-o", "m.pt", match="input shape unknown", where=tmp_path
    )
    flags = _pasted(message)
    assert flags and flags[0] in ("--input-shape", "--opt-shape"), message
    code, out, err = cli(command[0], ref, *command[1:], *flags, "-o", "m.pt")
    assert code == 0, err
    assert (tmp_path / "m.pt").is_file()


def test_no_guess_says_how_to_write_one(tmp_path):
    loaded = as_loaded(nn.Sequential(nn.ReLU()))
    assert_refused(
        loaded.example_inputs,
        match=("input shape unknown", "input_ids=1x128:int64"),
        where=tmp_path,
        error=UsageError,
    )


NEEDS_64 = """import torch


class Needs64(torch.nn.Module):
    def forward(self, x):
        if x.shape[-1] != 64:
            raise ValueError(f"width {x.shape[-1]} is not the 64 this model takes")
        return x.mean((2, 3))


def needs_64():
    return Needs64()
"""


def test_a_shape_guessed_from_the_data_is_not_called_expected(cli, tmp_path):
    """Specs guessed from the very batch that failed echo it: "expected [1..64]x3x32x32, got 8x3x32x32"
    where the model needs 64x64. Only what was given is named beside the model's own reason."""
    (tmp_path / "needs64_models.py").write_text(NEEDS_64)
    torch.save({"x": torch.randn(8, 3, 32, 32)}, tmp_path / "img32.pt")
    msg = assert_refused(cli, "inspect", "needs64_models:needs_64", "--data", "img32.pt",
                         match=("is not the 64 this model takes", "got input: 8x3x32x32"))  # fmt: skip
    assert "expected" not in msg


class _FixedLength(nn.Module):
    """A Whisper-like encoder: a Conv1d over 16 mel channels that takes 100 frames, no other length."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(16, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 100:
            raise ValueError(f"expects the mel input features to be of length 100, but found {x.shape[-1]}")
        return self.conv(x)


def test_a_first_layer_the_batch_already_feeds_is_not_named_as_the_cause():
    """`--min-shape 1x16x50` of a Whisper encoder said '(expected 16 input channels (first layer Conv1d),
    got input: 1x16x50 float32)': 16 channels were given; the length was wrong."""
    from ptopt.core.errors import ShapeMismatchError

    with pytest.raises(ShapeMismatchError) as err:
        run_checked(as_loaded(_FixedLength()), torch.randn(1, 16, 50), what="the min shape")
    assert "length 100, but found 50" in str(err.value) and "input channels" not in str(err.value)
    with pytest.raises(ShapeMismatchError, match=r"expected 16 input channels \(first layer Conv1d\)"):
        run_checked(as_loaded(_FixedLength()), torch.randn(1, 3, 100))


def test_a_model_failing_on_an_input_it_was_not_given_names_what_its_forward_takes():
    """CLIP without pixel_values failed inside transformers ('NoneType' object has no attribute 'shape'):
    an AttributeError was an internal error (exit 3); it is bad input, naming the inputs not given."""
    import ptopt

    class TextAndImage(torch.nn.Module):
        def forward(self, input_ids, pixel_values=None):
            return input_ids.float().sum() + pixel_values.shape[0]

    data = {"input_ids": torch.ones(2, 4, dtype=torch.long)}
    assert_refused(ptopt.inspect, TextAndImage(), data=data,
                   match=("'NoneType' object has no attribute 'shape'", "its forward also takes pixel_values"))  # fmt: skip
