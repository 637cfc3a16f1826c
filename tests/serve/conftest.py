"""Artifacts for the serving tests: built here with plain torch (trace / FX int8 / onnx export) plus a
ptopt sidecar, so these tests depend on no other stage."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from ptopt.core.artifact import Artifact
from ptopt.core.inputspec import specs_from_example


def _trace(model, x, path: Path, precision: str = "fp32", kwargs: bool = False) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jit deprecation; TracerWarnings of the quantized graph
        traced = torch.jit.trace(model, example_kwarg_inputs=x) if kwargs else torch.jit.trace(model, x)
        traced.save(str(path))
    Artifact(
        path,
        "torchscript",
        inputs=specs_from_example(x),
        input_style="keyword" if kwargs else "positional",
        precision=precision,
    ).finalize()
    return path


@pytest.fixture(scope="session")
def serve_artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fp32 / int8 / keyword-input TorchScript and an ONNX file of tiny models, each with a sidecar."""
    from tests.helpers import tiny_cnn, two_input

    d = tmp_path_factory.mktemp("serve-artifacts")
    model = tiny_cnn().eval()
    x = model.example_inputs(4)
    out = {"fp32": _trace(model, x, d / "cnn.pt")}

    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao deprecation and its observers' reduce_range notice
        prepared = prepare_fx(tiny_cnn().eval(), get_default_qconfig_mapping("x86"), (x,))
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for _ in range(4):
                prepared(torch.randn(16, 1, 8, 8, generator=g))
        q = convert_fx(prepared)
    out["int8"] = _trace(q, x, d / "cnn.int8.pt", precision="int8")

    kw = two_input().eval()
    ids = torch.randint(0, 18, (4, 12), generator=torch.Generator().manual_seed(2))
    out["keyword"] = _trace(
        kw,
        {"input_ids": ids, "attention_mask": torch.ones(4, 12, dtype=torch.int64)},
        d / "text.pt",
        kwargs=True,
    )

    onnx_path = d / "cnn.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            str(onnx_path),
            input_names=["input"],
            output_names=["logits"],
            dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}},
            verbose=False,
        )
    files = [onnx_path.name] + ([onnx_path.name + ".data"] if Path(str(onnx_path) + ".data").exists() else [])
    Artifact(onnx_path, "onnx", inputs=specs_from_example(x), files=files).finalize()
    out["onnx"] = onnx_path
    return out


def torchserve_missing() -> str | None:
    """Why a real TorchServe can't run here, or None."""
    from ptopt.core.features import check_java, check_torchserve

    for check in (check_java, check_torchserve):
        f = check()
        if not f.available:
            return f"{f.name}: {f.detail}"
    return None


@pytest.fixture(scope="session")
def pt2_artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny CNN as ``.pt2`` files with sidecars, built with plain torch: an AOTInductor package
    (batch 1..16, freezing on, ~10-20 s to compile), an fp32 ExportedProgram and a PT2E int8
    ExportedProgram (torchao's X86InductorQuantizer, calibrated on random batches)."""
    from tests.helpers import tiny_cnn

    d = tmp_path_factory.mktemp("pt2-artifacts")
    model = tiny_cnn().eval()
    x = model.example_inputs(4)
    batch = torch.export.Dim("batch", min=1, max=16)
    specs = specs_from_example(x, max_batch=16)  # the package's batch range: 1..16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
        aoti = d / "cnn.aoti.pt2"
        torch._inductor.aoti_compile_and_package(
            ep, package_path=str(aoti), inductor_configs={"freezing": True}
        )
        fp32 = d / "cnn.ep.pt2"
        torch.export.save(ep, str(fp32))
        int8 = d / "cnn.int8.pt2"
        torch.export.save(_pt2e_int8(model, x, batch), str(int8))
    Artifact(aoti, "aoti_package", inputs=specs, extra={"torch_version": torch.__version__}).finalize()
    Artifact(fp32, "exported_program", inputs=specs).finalize()
    Artifact(int8, "exported_program", inputs=specs, precision="int8").finalize()
    return {"aoti": aoti, "ep": fp32, "int8_ep": int8}


def _pt2e_int8(model, x, batch):
    from tests.helpers import torchao

    xiq = torchao("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    pt2e = torchao("torchao.quantization.pt2e.quantize_pt2e")
    convert_pt2e, prepare_pt2e = pt2e.convert_pt2e, pt2e.prepare_pt2e

    graph = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}}).module()
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(graph, quantizer)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        prepared(torch.randn(8, 1, 8, 8, generator=g))
    converted = convert_pt2e(prepared)
    return torch.export.export(converted, (x,), dynamic_shapes={"x": {0: batch}})


@pytest.fixture(scope="session")
def serve_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small seeded Llama (vocabulary 256) saved with a word tokenizer as ``llama/`` and without one
    as ``bare/``."""
    from tests.compress.hf_models import llama, word_tokenizer

    root = tmp_path_factory.mktemp("serve-lm")
    llama(256, hidden=64).save_pretrained(root / "llama")
    shutil.copytree(root / "llama", root / "bare")  # the same model's files, before the tokenizer's
    word_tokenizer(root / "llama", 256)
    return root


@pytest.fixture(scope="session")
def serve_lm_int8(serve_lm: Path) -> Path:
    """The weight-only int8 folder of ``serve_lm``'s Llama (``ptopt.quantize``), tokenizer included."""
    import ptopt

    out = serve_lm / "llama.int8"
    if not out.exists():
        ptopt.quantize(serve_lm / "llama", "weight-only", out)
    return out


#: texts and pairs the text-serving tests send (``serve.text_inputs``)
TEXTS = ["the cat sat on the mat", "a dog ran"]
PAIRS = [["the cat sat", "a dog ran fast"], ["the big house", "is red"]]


@pytest.fixture(scope="session")
def serve_bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A tiny BERT classifier folder with its tokenizer (``tests.helpers.bert_folder``), exported to ONNX
    with a file of pairs as data (so it takes ``token_type_ids``), and that ONNX packaged for Ray Serve:
    (folder, onnx, package)."""
    pytest.importorskip("transformers")
    import ptopt
    from tests.helpers import bert_folder

    root = tmp_path_factory.mktemp("serve-bert")
    folder = bert_folder(root / "bert")
    (root / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS))
    ptopt.export(f"hf:{folder}", "onnx", data=root / "pairs.tsv").save(root / "bert.onnx")
    ptopt.package(root / "bert.onnx", "ray", root / "bert_ray", max_batch_size=8)
    return folder, root / "bert.onnx", root / "bert_ray"


def bert_logits(folder: Path, texts: list) -> np.ndarray:
    """What transformers answers for ``texts`` (strings, or pairs), tokenized by the folder's tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**tok(texts, padding=True, return_tensors="pt")).logits.numpy()


def ray_banner(artifact: Path, capsys: pytest.CaptureFixture, **config) -> str:
    """What ``ptopt serve --engine ray`` prints about ``artifact`` once serving (``cli.serve._ray_banner``),
    from a server that packages it here and never starts Ray."""
    from ptopt.cli.serve import _ray_banner
    from ptopt.serve.ray_server import RayServer

    server = RayServer(artifact, config=config or None)
    try:
        capsys.readouterr()
        _ray_banner(server)
        return capsys.readouterr().out
    finally:
        server.stop()
