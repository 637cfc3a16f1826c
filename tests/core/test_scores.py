"""``core.scores``: which outputs are class scores (top-1 agreement means something) and which are
features (a sentence embedding, an encoder's hidden states), read from the layer behind the output in
each format's graph."""

import warnings

import pytest
import torch
from torch import nn

from ptopt.core.scores import (
    EMBEDDING,
    HEAD,
    NORM,
    RECURRENT,
    class_scores,
    family,
    fx_output_layer,
    onnx_output_layer,
    openvino_output_layer,
    output_layer,
)


class Classifier(nn.Module):
    def __init__(self, softmax: bool = False):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 5)
        self.softmax = softmax

    def forward(self, x):
        h = self.fc(self.bn(self.conv(x)).mean((2, 3)))
        return h.softmax(-1) if self.softmax else h


class Encoder(nn.Module):
    """Mean-pooled LayerNorm states, as a sentence encoder's: the last layer is a LayerNorm."""

    def __init__(self):
        super().__init__()
        self.emb, self.ff, self.ln = nn.Embedding(20, 16), nn.Linear(16, 16), nn.LayerNorm(16)

    def forward(self, ids, mask):
        h = self.ln(self.ff(self.emb(ids)))
        m = mask.unsqueeze(-1).float()
        return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)


def _encoder_inputs():
    g = torch.Generator().manual_seed(0)
    return {"ids": torch.randint(0, 20, (2, 6), generator=g), "mask": torch.ones(2, 6, dtype=torch.long)}


@pytest.mark.parametrize(
    "name, want",
    [
        ("Linear", HEAD), ("NonDynamicallyQuantizableLinear", HEAD), ("Conv1D", HEAD), ("aten::addmm", HEAD),
        ("aten.linear.default", HEAD), ("quantized::linear_dynamic", HEAD), ("Gemm", HEAD), ("MatMul", HEAD),
        ("QLinearConv", HEAD), ("Convolution", HEAD), ("aten::_convolution", HEAD),
        ("LayerNorm", NORM), ("LlamaRMSNorm", NORM), ("aten::layer_norm", NORM), ("LayerNormalization", NORM),
        ("MVN", NORM), ("aten::linalg_vector_norm", NORM),
        ("LSTM", RECURRENT), ("aten::gru", RECURRENT), ("Embedding", EMBEDDING),
        ("Convert", None), ("prims.convert_element_type.default", None), ("aten::upsample_bilinear2d", None),
        ("Softmax", None), ("DequantizeLinear", None), ("aten::mean", None),
    ],
)  # fmt: skip
def test_family_of_layer_and_op_names(name, want):
    assert family(name) == want


def test_eager_classifier_is_scored_by_its_head_even_behind_a_softmax():
    x = torch.randn(2, 3, 8, 8)
    assert output_layer(Classifier().eval(), x) == "Linear"
    assert output_layer(Classifier(softmax=True).eval(), x) == "Linear"


def test_every_format_finds_the_encoders_layernorm(tmp_path):
    enc, x = Encoder().eval(), _encoder_inputs()
    assert output_layer(enc, x) == "LayerNorm"
    traced = torch.jit.trace(enc, (x["ids"], x["mask"]))
    assert output_layer(traced, x) == "aten::layer_norm"
    ep = torch.export.export(enc, (), dict(x))
    assert family(fx_output_layer(ep.module())) == NORM
    path = tmp_path / "enc.onnx"
    with warnings.catch_warnings():  # the exporters' own deprecation notices
        warnings.simplefilter("ignore")
        torch.onnx.export(enc, (), str(path), kwargs=dict(x), dynamo=True)
        import openvino as ov

        ir = ov.convert_model(enc, example_input=dict(x))
    assert onnx_output_layer(path) == "LayerNormalization"
    assert family(openvino_output_layer(ir)) == NORM


def test_every_format_finds_the_classifiers_head(tmp_path):
    model, x = Classifier(softmax=True).eval(), torch.randn(2, 3, 8, 8)
    assert family(output_layer(torch.jit.trace(model, x), x)) == HEAD
    assert family(fx_output_layer(torch.export.export(model, (x,)).module())) == HEAD
    path = tmp_path / "c.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=True)
    assert family(onnx_output_layer(path)) == HEAD


def test_huggingface_base_model_is_features_and_its_heads_are_scores():
    from ptopt.core.hf import ensure_torchvision_ops

    ensure_torchvision_ops()  # transformers imports torchvision (REFERENCE.md)
    T = pytest.importorskip("transformers")

    cfg = T.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=32)  # fmt: skip
    x = {"input_ids": torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))}
    torch.manual_seed(0)
    assert output_layer(T.BertModel(cfg).eval(), x) == "LayerNorm"  # last_hidden_state, not the pooler
    assert output_layer(T.BertForSequenceClassification(cfg).eval(), x) == "Linear"


def test_class_scores_verdicts():
    assert class_scores((4, 10), "Linear") == (True, None)
    assert class_scores((4, 10), None) == (True, None)  # not known: the shape decides, as before
    ok, why = class_scores((4, 16), "LayerNorm")
    assert not ok and "normalization (LayerNorm)" in why and "embedding or hidden states" in why
    assert class_scores((4, 16), "LayerNorm", labels=True) == (True, None)  # labels index the classes
    assert not class_scores((4, 1), "Linear")[0] and not class_scores((4, 3, 8, 8), "Conv2d")[0]
    unit = nn.functional.normalize(torch.randn(4, 16), dim=-1)
    ok, why = class_scores(unit.shape, "Linear", outputs=unit)
    assert not ok and "length 1" in why
    probs = torch.randn(4, 10).softmax(-1)
    assert class_scores(probs.shape, "Linear", outputs=probs)[0]
    onehot = torch.eye(4)
    assert class_scores(onehot.shape, "Linear", outputs=onehot)[0]  # one-hot rows sum to 1: probabilities


def test_a_forward_that_fails_is_not_known():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            raise ValueError("no")

    assert output_layer(Broken(), torch.randn(1, 3)) is None
    assert output_layer(object(), None) is None


class TiedLM(nn.Module):
    """A language model whose head is the embedding's weight: ``h @ emb.weight.T`` after the last
    LayerNorm (no Linear module computes the logits)."""

    def __init__(self, functional: bool = False):
        super().__init__()
        self.emb, self.ln, self.functional = nn.Embedding(20, 16), nn.LayerNorm(16), functional

    def forward(self, ids):
        h = self.ln(self.emb(ids))
        return nn.functional.linear(h, self.emb.weight) if self.functional else h @ self.emb.weight.T


def test_eager_tied_lm_head_after_the_last_layernorm_is_class_scores():
    ids = _encoder_inputs()["ids"]
    for model in (TiedLM().eval(), TiedLM(functional=True).eval()):
        layer = output_layer(model, ids)
        assert family(layer) == HEAD, layer  # was "LayerNorm": the last module to run
        assert class_scores((2, 6, 20), layer)[0]


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d: a BatchNorm with an activation child (so not a leaf module)."""

    def __init__(self, n):
        super().__init__(n)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(super().forward(x))


def test_eager_features_behind_a_composite_norm_are_features():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), BatchNormAct(8), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    layer = output_layer(model, torch.randn(2, 3, 8, 8))
    assert family(layer) == NORM, layer  # was "Conv2d" (an efficientnet with num_classes=0: class scores)


class RMSEncoder(nn.Module):
    """T5's / Llama's RMSNorm, written with primitives: x * rsqrt(mean(x²) + eps) * weight."""

    def __init__(self):
        super().__init__()
        self.emb, self.ff, self.w = (
            nn.Embedding(20, 16),
            nn.Linear(16, 16, bias=False),
            nn.Parameter(torch.ones(16)),
        )

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.ff(h)
        return self.w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_an_rmsnorm_made_of_primitives_is_a_normalization_in_every_graph(tmp_path):
    model, ids = RMSEncoder().eval(), _encoder_inputs()["ids"]
    assert family(output_layer(torch.jit.trace(model, (ids,)), ids)) == NORM  # was aten::linear
    assert family(fx_output_layer(torch.export.export(model, (ids,)).module())) == NORM
    path = tmp_path / "rms.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), str(path), dynamo=True)
        import openvino as ov

        ir = ov.convert_model(model, example_input=(ids,))
    assert family(onnx_output_layer(path)) == NORM  # Sqrt, Reciprocal
    assert family(openvino_output_layer(ir)) == NORM  # x / Sqrt(...): as near as the residual's MatMul


def test_an_output_named_as_an_embedding_is_features_though_a_linear_computes_it():
    class Projection(nn.Module):  # CLIPVisionModelWithProjection: {"image_embeds": Linear(pooled)}
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 4, bias=False)

        def forward(self, x):
            return {"image_embeds": self.proj(x), "last_hidden_state": x}

    layer = output_layer(Projection().eval(), torch.randn(2, 8))
    assert layer == "image_embeds"
    ok, why = class_scores((2, 4), layer)
    assert (
        not ok
        and why == "its output is named image_embeds, so it holds features: an embedding or hidden states"
    )
    assert family("logits") is None and family("output_0") is None


class Backbone(nn.Module):
    """A classifier whose head a user replaced to get features: ``fc`` (``model.fc = nn.Identity()``)
    or the last child of a ``classifier`` Sequential (torchvision VGG's ``classifier[6]``)."""

    def __init__(self, fc: nn.Module | None = None, classifier: nn.Module | None = None):
        super().__init__()
        self.conv, self.act = nn.Conv2d(3, 8, 3), nn.ReLU()
        self.norm_head = nn.Identity()  # timm's: an Identity where there is no norm, before the head
        self.fc = fc if fc is not None else nn.Linear(8, 5)
        self.classifier = classifier if classifier is not None else nn.Identity()

    def forward(self, x):
        return self.classifier(self.fc(self.norm_head(self.act(self.conv(x))).mean((2, 3))))


@pytest.mark.parametrize(
    "model, layer",
    [
        (Backbone(fc=nn.Identity()), "Identity as fc"),  # and its classifier: fc's is nearer
        (
            Backbone(fc=nn.Identity(), classifier=nn.Sequential(nn.ReLU(), nn.Identity())),
            "Identity as classifier.1",
        ),
        (Backbone(), "Linear"),  # the Identity classifier after a Linear: the Linear is the head
        (Backbone(fc=nn.Sequential(nn.Linear(8, 5), nn.Identity())), "Linear"),  # an Identity right after it
        (
            Backbone(fc=nn.Sequential(nn.Identity(), nn.ReLU()), classifier=nn.ReLU()),
            "Conv2d",
        ),  # an Identity that is not the last child of the head: the Conv (no removed head here)
    ],
)
def test_a_classifier_replaced_by_identity_is_features(model, layer):
    """An ``nn.Identity`` where a classifier was (timm's ``num_classes=0``, ``fc = nn.Identity()``): the
    Conv before it would read as a head, as SqueezeNet's last Conv + ReLU is a real one."""
    got = output_layer(model.eval(), torch.randn(2, 3, 8, 8))
    assert got == layer
    ok, why = class_scores((2, 8), got)
    assert ok == (family(layer) == HEAD)
    if layer.startswith("Identity"):
        name = layer.removeprefix("Identity as ")
        assert why == f"its {name} is nn.Identity (the classifier was removed), so it holds features"


def test_a_loaded_file_answers_with_the_layer_its_source_module_had(tmp_path):
    """A frozen TorchScript folds a last BatchNorm into the Conv before it: its graph reads as a Conv
    head. The sidecar's ``extra.output_layer`` (read on the module the file was written from) answers
    for the loaded module, in quantize, prune and distill as in validate."""
    from ptopt.core.artifact import sidecar_path
    from ptopt.core.modelref import as_loaded
    from ptopt.core.scores import _script_output_layer
    from ptopt.export.api import export

    class Features(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)

        def forward(self, x):
            return self.bn(self.conv(x)).mean((2, 3))

    torch.manual_seed(0)
    export(Features().eval(), "torchscript", tmp_path / "f.pt", input_shapes=["2x3x8x8"])
    x = torch.randn(1, 3, 8, 8)
    module = as_loaded(tmp_path / "f.pt").module
    assert _script_output_layer(module) == "aten::_convolution"
    assert output_layer(module, x) == "BatchNorm2d"
    sidecar_path(tmp_path / "f.pt").unlink()
    assert output_layer(as_loaded(tmp_path / "f.pt").module, x) == "aten::_convolution"
    export(Features().eval(), "exported_program", tmp_path / "f.pt2", input_shapes=["2x3x8x8"])
    gm = as_loaded(tmp_path / "f.pt2").module
    assert output_layer(gm, x) == "BatchNorm2d"
    gm.head = nn.Linear(8, 4)  # edited in place after loading: the record no longer speaks for it
    assert output_layer(gm, x) != "BatchNorm2d"
