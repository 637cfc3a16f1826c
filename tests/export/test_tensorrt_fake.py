"""The TensorRT target up to ``torch_tensorrt.dynamo.compile``, on the CPU, with a stand-in
``torch_tensorrt`` module in ``sys.modules`` (TensorRT cannot be installed on any machine here):
the ExportedProgram it receives, the ``Input`` min/opt/max profiles built from the InputSpecs, the
enabled precisions per ``--precision``, and what ``torch_tensorrt.save`` is called with. The stand-in
records the calls; nothing here claims an engine was built."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from ptopt.core.errors import UnsupportedModelError
from ptopt.core.inputspec import InputSpec, specs_from_example
from ptopt.formats import tensorrt
from tests.helpers import tiny_cnn, two_input


class _Input:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.fixture
def fake_trt(monkeypatch):
    """A ``torch_tensorrt`` whose compile/save record their arguments (save writes a marker file)."""
    calls: dict = {}
    mod = types.ModuleType("torch_tensorrt")
    mod.__version__ = "0.0-fake"
    mod.Input = _Input
    mod.dynamo = types.SimpleNamespace(
        compile=lambda ep, **kw: calls.update(compile=(ep, kw)) or "compiled-engine"
    )

    def save(module, path, **kw):
        calls["save"] = (module, path, kw)
        with open(path, "wb") as fh:
            fh.write(b"fake engine")

    mod.save = save
    monkeypatch.setitem(sys.modules, "torch_tensorrt", mod)
    monkeypatch.setattr(tensorrt, "check_available", lambda: None)
    return calls


def _specs():
    return specs_from_example(torch.randn(2, 1, 8, 8), max_batch=32)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_compile_and_save_arguments(fake_trt, tmp_path, precision):
    specs = [_specs()[0].with_batch(1, 8, 32)]
    out = tmp_path / "m.ep"
    info = tensorrt.export_tensorrt(
        tiny_cnn(), out, specs=specs, style="positional", precision=precision, device="cpu"
    )
    ep, kw = fake_trt["compile"]
    # the ExportedProgram: captured with a dynamic batch over the specs' [min, max]
    assert isinstance(ep, torch.export.ExportedProgram)
    (rng,) = [r for r in ep.range_constraints.values() if r.lower >= 1]
    assert (int(rng.lower), int(rng.upper)) == (1, 32)
    # one Input profile per spec, straight from min/opt/max
    (inp,) = kw["arg_inputs"]
    assert inp.kwargs == {
        "min_shape": [1, 1, 8, 8],
        "opt_shape": [8, 1, 8, 8],
        "max_shape": [32, 1, 8, 8],
        "dtype": torch.float32,
        "name": "input",
    }
    want = {"fp32": {torch.float32}, "fp16": {torch.float16, torch.float32}}
    want["bf16"] = {torch.bfloat16, torch.float32}
    assert kw["enabled_precisions"] == want[precision] and kw["min_block_size"] == 1
    # saved as an ExportedProgram with the same Dims, example inputs at the export shape
    module, path, skw = fake_trt["save"]
    assert module == "compiled-engine" and path == str(out) and skw["output_format"] == "exported_program"
    (x,) = skw["arg_inputs"]
    assert tuple(x.shape) == (8, 1, 8, 8) and x.dtype == torch.float32
    (dims,) = skw["dynamic_shapes"]
    assert dims[0].min == 1 and dims[0].max == 32
    assert info["files"] == ["m.ep"] and info["torch_tensorrt"] == "0.0-fake"
    assert info["enabled_precisions"] == sorted(map(str, want[precision]))


def test_keyword_model_gets_named_profiles(fake_trt, tmp_path):
    ids = InputSpec("input_ids", (1, 4), (2, 4), (16, 4), "int64", value_range=(0, 100))
    mask = InputSpec("attention_mask", (1, 4), (2, 4), (16, 4), "int64", value_range=(0, 2))
    tensorrt.export_tensorrt(two_input(), tmp_path / "t.ep", specs=[ids, mask], style="keyword", device="cpu")
    _, kw = fake_trt["compile"]
    assert set(kw["kwarg_inputs"]) == {"input_ids", "attention_mask"} and "arg_inputs" not in kw
    assert kw["kwarg_inputs"]["input_ids"].kwargs["dtype"] == torch.int64
    assert kw["kwarg_inputs"]["input_ids"].kwargs["max_shape"] == [16, 4]
    _, _, skw = fake_trt["save"]
    assert set(skw["kwarg_inputs"]) == {"input_ids", "attention_mask"}
    assert set(skw["dynamic_shapes"]) == {"input_ids", "attention_mask"}


def test_compile_failure_is_one_clear_error(fake_trt, tmp_path):
    def boom(ep, **kw):
        raise RuntimeError("Unsupported operator: aten.linalg_eigh\nmore detail")

    sys.modules["torch_tensorrt"].dynamo.compile = boom
    with pytest.raises(
        UnsupportedModelError,
        match="torch_tensorrt cannot compile the model: RuntimeError: "
        "Unsupported operator: aten.linalg_eigh$",
    ):
        tensorrt.export_tensorrt(
            tiny_cnn(), tmp_path / "m.ep", specs=_specs(), style="positional", device="cpu"
        )
    assert not (tmp_path / "m.ep").exists()


def test_int8_needs_calibration(fake_trt, tmp_path):
    with pytest.raises(UnsupportedModelError, match="needs --data for calibration"):
        tensorrt.export_tensorrt(
            tiny_cnn(), tmp_path / "m.ep", specs=_specs(), style="positional", precision="int8", device="cpu"
        )


def test_runner_is_placed_on_the_gpu_and_timed_with_cuda_events(fake_trt, monkeypatch, tmp_path):
    """The validate runner of a TensorRT artifact runs on cuda, and ``measure_runners`` hands each
    runner's device to the shared timer (CUDA events there)."""
    from ptopt.core import features
    from ptopt.core.data import Dataset
    from ptopt.core.errors import UsageError
    from ptopt.validate import latency

    sys.modules["torch_tensorrt"].load = lambda path: torch.jit.trace(
        tiny_cnn().eval(), torch.randn(2, 1, 8, 8)
    )
    monkeypatch.setattr(features, "require", lambda *a, **k: None)
    loaded = tensorrt.FORMAT.load(tmp_path / "m.ep", None, False)
    runner = tensorrt.FORMAT.runner("m.ep", loaded)
    assert runner.device == runner.timer_device == "cuda:0" and runner.input_dtype is None
    with pytest.raises(UsageError, match="runs on a GPU"):
        runner.place("cpu")
    seen = {}
    stats = {"round_spread_pct": 1.0}
    monkeypatch.setattr(
        latency, "measure_interleaved", lambda fns, sizes, **kw: seen.update(kw) or {k: stats for k in fns}
    )
    monkeypatch.setattr(runner, "timed_call", lambda x: lambda: None)
    latency.measure_runners([runner], Dataset(torch.randn(4, 1, 8, 8)), [1, 2], latency.LatencyOptions())
    assert seen["devices"] == {(0, 1): "cuda:0", (0, 2): "cuda:0"}
