"""AOTInductor on CUDA: the options ``--cuda-graphs`` passes to the compiler (the compile call is
replaced, so this runs on the CPU), packages refused on the wrong device kind, and, where a GPU is,
the CUDA-graph replay of a module."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from ptopt.core.errors import ModelLoadError
from ptopt.core.inputspec import specs_from_example
from ptopt.formats import aoti_compile as aoti
from ptopt.formats.aoti_files import VERSION_KEY, load_package, package_device
from tests.helpers import tiny_cnn


def _fake_package(path, metadata: dict) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model/data/aotinductor/model/wrapper_metadata.json", json.dumps(metadata))


@pytest.fixture
def compile_calls(monkeypatch):
    """``aoti_compile_and_package`` replaced: records its arguments, writes a package holding only the
    metadata it was asked to embed."""
    calls = []

    def fake(ep, package_path, inductor_configs):
        calls.append((ep, inductor_configs))
        _fake_package(package_path, {"AOTI_DEVICE_KEY": "cpu", **inductor_configs["aot_inductor.metadata"]})
        return package_path

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", fake)
    monkeypatch.setattr(aoti, "check_compiler", lambda *a: "g++")
    return calls


@pytest.mark.parametrize("graphs", [True, False], ids=["cuda-graphs", "plain"])
def test_compile_options(compile_calls, tmp_path, graphs):
    specs = specs_from_example(torch.randn(2, 1, 8, 8), max_batch=8)
    info = aoti.write_aoti(
        tiny_cnn(), tmp_path / "m.pt2", specs=specs, style="positional", cuda_graphs=graphs
    )
    ((ep, configs),) = compile_calls
    assert isinstance(ep, torch.export.ExportedProgram)
    meta = {VERSION_KEY: torch.__version__} | ({aoti.CUDA_GRAPHS_KEY: "1"} if graphs else {})
    # AOTInductor packages carry no CUDA graphs: no triton.cudagraphs (a JIT-only option, ignored in
    # AOT mode); the wish travels in the package metadata, for the loaders to act on
    assert configs == {"freezing": True, "aot_inductor.metadata": meta}
    assert info["cuda_graphs"] is graphs and info["compile_options"] == {"freezing": True}


def test_package_refused_on_another_device_kind(tmp_path):
    path = tmp_path / "gpu.pt2"
    _fake_package(path, {"AOTI_DEVICE_KEY": "cuda", VERSION_KEY: torch.__version__})
    assert package_device(path) == "cuda"
    with pytest.raises(ModelLoadError, match="compiled for cuda, asked to run on cpu.*--device cpu"):
        load_package(path, device="cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_replay_matches_eager():
    from ptopt.core.cudagraph import CudaGraphed

    model = tiny_cnn().eval().cuda()
    graphed = CudaGraphed(model, torch.device("cuda", torch.cuda.current_device()))
    with torch.inference_mode():
        for batch in (2, 2, 4):
            x = torch.randn(batch, 1, 8, 8, device="cuda")
            torch.testing.assert_close(graphed(x).clone(), model(x))
    assert len(graphed.graphs) == 2  # one capture per input shape
