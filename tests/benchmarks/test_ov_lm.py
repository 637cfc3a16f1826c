"""benchmarks/ov_lm.py (bench_llm's NNCF + OpenVINO peer) on a tiny random Llama: its IR files, the
runner on a file and NNCF's int8 weights of a file. The conversion and the runner themselves are the
library's (``ptopt.formats.openvino_lm``, tested in tests/formats/test_openvino_lm.py)."""

from __future__ import annotations

import pytest
import torch

from tests.benchmarks import bench_script
from tests.compress.hf_models import llama

pytest.importorskip("openvino")
pytest.importorskip("nncf")


def test_the_peer_on_files_computes_what_the_model_computes(tmp_path):
    from ptopt.core.lm import perplexity

    with bench_script("ov_lm") as ov_lm:
        model = llama(300, hidden=64).eval()
        ir = ov_lm.convert(model, tmp_path / "tiny.xml")
        runner_class = ov_lm.OpenVINOLM
    ids = torch.randint(0, 300, (160,), generator=torch.Generator().manual_seed(1))
    want = perplexity(model, ids, context=64, stride=32)["perplexity"]
    runner = runner_class(ir, model.config, threads=1, precision="f32")
    assert perplexity(runner, ids, context=64, stride=32)["perplexity"] == pytest.approx(want, rel=1e-4)
    assert runner.precision == "f32" and runner.file_bytes() > ov_lm.constant_bytes(ir) > 0
    int8 = ov_lm.compress(ir, tmp_path / "int8.xml", "int8_asym")
    assert ov_lm.constant_bytes(int8) < 0.35 * ov_lm.constant_bytes(ir)
    got = perplexity(
        ov_lm.OpenVINOLM(int8, model.config, threads=1, precision="f32"), ids, context=64, stride=32
    )
    assert got["perplexity"] == pytest.approx(want, rel=0.02)
