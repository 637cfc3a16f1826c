"""``ptopt.export.writers``: the one module that writes model files, and its reload-and-compare check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ptopt.core.errors import ParityError, UnsupportedModelError, UsageError
from ptopt.core.inputspec import specs_from_example
from ptopt.export.writers import FACT_KEYS, Check, reload, serialized_bytes, write_model
from tests.helpers import tiny_cnn, two_input

FORMATS = ["torchscript", "exported_program", "onnx"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_writes_reloads_and_checks_at_min_opt_max(tmp_path, fmt):
    module = tiny_cnn()  # in training mode: written and compared in eval mode, then handed back
    x = module.example_inputs(2)
    path = tmp_path / "model.tmp"  # any name, e.g. an atomic temporary one
    facts = write_model(module, fmt, path, example=x)
    assert module.training
    assert set(facts) <= set(FACT_KEYS) and facts["files"][0] == "model.tmp"
    parity = facts["metrics"]["parity"]
    assert parity["passed"] and set(parity["shapes"]) == {"min", "opt", "max"}
    assert parity["shapes"]["min"]["inputs"] == "data"  # the example's real samples where they fit
    y = torch.randn(7, 1, 8, 8)
    torch.testing.assert_close(reload(path, fmt)(y), module.eval()(y), atol=1e-4, rtol=1e-4)


def test_exported_program_dims_come_from_the_specs(tmp_path):
    module = tiny_cnn().eval()
    x = module.example_inputs(2)
    path = tmp_path / "student.pt.tmp"
    write_model(module, "exported_program", path, example=x, specs=specs_from_example(x, max_batch=1024))
    assert reload(path, "exported_program")(torch.randn(700, 1, 8, 8)).shape == (700, 10)


def test_keyword_inputs(tmp_path):
    module = two_input().eval()
    x = {"input_ids": torch.randint(0, 18, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    for fmt in FORMATS:
        facts = write_model(module, fmt, tmp_path / f"k.{fmt}", example=x)
        assert facts["metrics"]["parity"]["passed"], fmt
    assert reload(tmp_path / "k.onnx", "onnx").input_names == ["input_ids", "attention_mask"]


def test_reload_check_catches_a_divergent_model(tmp_path):
    module = tiny_cnn().eval()
    other = tiny_cnn().eval()
    with torch.no_grad():
        other.fc.bias += 0.5  # what the file must reproduce is not what was written
    x = module.example_inputs(2)
    with pytest.raises(ParityError, match="drifts from its source") as err:
        write_model(module, "torchscript", tmp_path / "a.pt", example=x, check=Check(other))
    assert err.value.failed == [] and not err.value.metrics["passed"]
    final = tmp_path / "out" / "m.pt"
    with pytest.raises(ParityError, match="kept aside") as err:
        write_model(
            module, "torchscript", tmp_path / "b.tmp", example=x, check=Check(other, keep_failed_as=final)
        )
    assert err.value.failed == [str(final.parent / "m.pt.failed")]
    assert sorted(p.name for p in final.parent.iterdir()) == ["m.pt.failed"]
    # the same drift within a looser rule passes: the caller's call (the bias shift turns the
    # logits, so the cosine minimum is the caller's to loosen too)
    facts = write_model(
        module, "torchscript", tmp_path / "c.pt", example=x, check=Check(other, atol=1.0, min_cosine=-1.0)
    )
    assert facts["metrics"]["parity"]["max_abs_diff"] > 0.4


def test_a_trace_that_bakes_in_the_batch_fails_the_check(tmp_path):
    from tests.export.export_models import batch_baked

    module = batch_baked().eval()
    with pytest.raises(ParityError, match="drifts"):
        write_model(module, "torchscript", tmp_path / "b.pt", example=module.example_inputs())
    # scripting keeps the Python arithmetic on the batch size
    facts = write_model(
        module, "torchscript", tmp_path / "s.pt", example=module.example_inputs(), script=True
    )
    assert facts["extra"]["method"] == "torch.jit.script"


def test_int8_module_and_a_torchscript_source(tmp_path):
    import copy
    import warnings

    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    module = tiny_cnn().eval()
    x = module.example_inputs(2)
    torch.backends.quantized.engine = "x86"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_fx(copy.deepcopy(module), get_default_qconfig_mapping("x86"), (x,))
        prepared(torch.randn(64, 1, 8, 8))
        q = convert_fx(prepared)
    facts = write_model(
        q, "torchscript", tmp_path / "q.pt", example=x, precision="int8", check=Check(atol=1e-3, rtol=1e-3)
    )
    assert facts["metrics"]["parity"]["max_abs_diff"] <= 1e-3 and facts["extra"]["frozen"]
    assert serialized_bytes(q, "torchscript", x) < serialized_bytes(module, "torchscript", x)
    # a ScriptModule is re-saved as it is; torch.export cannot take it
    again = write_model(
        reload(tmp_path / "q.pt", "torchscript"), "torchscript", tmp_path / "q2.pt", example=x
    )
    assert (
        again["extra"]["method"] == "re-saved TorchScript" and again["metrics"]["parity"]["max_abs_diff"] == 0
    )
    with pytest.raises(UnsupportedModelError, match="cannot go through torch.export"):
        write_model(
            reload(tmp_path / "q.pt", "torchscript"), "exported_program", tmp_path / "q.pt2", example=x
        )


def test_serialized_bytes_is_what_write_model_writes_and_leaves_nothing(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    module = tiny_cnn().eval()
    x = module.example_inputs(2)
    n = serialized_bytes(module, "onnx", x)
    assert list(tmp_path.iterdir()) == []
    write_model(module, "onnx", tmp_path / "m.onnx", example=x, check=False)
    assert n == (tmp_path / "m.onnx").stat().st_size


@pytest.mark.parametrize(
    "fmt, kwargs, message",
    [
        ("coreml", {}, "unknown artifact format 'coreml'"),
        ("torchscript", {"opset": 17}, "format torchscript takes no option(s) opset"),
        ("onnx", {"int8_method": "magic"}, "unknown int8 ONNX method"),
        ("onnx", {"example": None}, "needs the input specs or an example batch"),
    ],
    ids=["format", "option", "int8-method", "no-inputs"],
)
def test_bad_requests_are_usage_errors(tmp_path, fmt, kwargs, message):
    module = tiny_cnn().eval()
    kwargs = {"example": module.example_inputs(2), **kwargs}
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_model(module, fmt, tmp_path / "m", **kwargs)


def test_training_flags_come_back_per_submodule(tmp_path):
    module = tiny_cnn()
    module.bn1.eval()  # frozen statistics in an otherwise training model
    write_model(module, "torchscript", tmp_path / "m.pt", example=module.example_inputs(2))
    assert module.training and not module.bn1.training and module.bn2.training


def test_onnx_op_registry_is_built_once_per_opset_and_each_export_gets_a_copy(monkeypatch):
    """torch.onnx rebuilds its torchlib registry at every export (seconds each); ptopt keeps the first
    per opset for the process, hands each export a copy, and leaves torch's class as it found it."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    from ptopt.formats import capture

    built = []

    def fake(cls, opset_version=18):
        built.append(opset_version)
        reg = cls()
        reg._opset_version, reg.functions = opset_version, {"aten::add": ["add"]}
        return reg

    monkeypatch.setattr(capture, "_REGISTRIES", {})
    monkeypatch.setattr(ONNXRegistry, "from_torchlib", classmethod(fake))
    with capture.torchlib_registry_reused():
        a = ONNXRegistry.from_torchlib(opset_version=18)
        b = ONNXRegistry().from_torchlib(opset_version=18)  # torch's _compat calls it on an instance
        c = ONNXRegistry.from_torchlib(opset_version=20)
    assert built == [18, 20]  # one build per opset
    assert a is not b and a.functions == b.functions and a.functions is not b.functions
    a.functions["aten::add"].append("custom")  # an export adding its own op changes only its copy
    assert b.functions["aten::add"] == ["add"] and c.opset_version == 20
    assert ONNXRegistry.__dict__["from_torchlib"].__func__ is fake  # restored


class _BranchOnValue(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # the tracer bakes this branch in: its warning names this line
            return x * 2
        return x


def test_tracer_notes_are_whole_sentences_naming_the_models_line():
    """The CLI's `note: tracer: ...` was the warning cut at 200 characters ("This means tha")."""
    from ptopt.formats.capture import trace

    _, notes = trace(_BranchOnValue(), torch.ones(2, 3), "positional")
    line = next(i for i, s in enumerate(Path(__file__).read_text().splitlines(), 1) if "x.sum() > 0" in s)
    assert notes == [
        f"Converting a tensor to a Python boolean might cause the trace to be incorrect (test_writers.py:{line})"
    ]
