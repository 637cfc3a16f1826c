"""The PT2E engine (``ptopt.compress.quantize.engine_pt2e``) in memory: torch.export → prepare_pt2e /
prepare_qat_pt2e → calibrate / train → convert_pt2e with X86InductorQuantizer, then an AOTInductor
package (``pt2e_package``) whose int8 kernels come from Inductor's lowering, accepted at every batch
size of its range.

One package is compiled (``ptopt quantize --engine pt2e`` of the tiny CNN, a module fixture read by
the CLI's test and the package's); the rest runs the converted graph eagerly."""

from __future__ import annotations

import json
import sys
import types
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import assert_refused, tiny_cnn, torchao


def _scheme(**kw):
    base = dict(backend="x86", per_channel=True, float_modules=(), observer="histogram")
    return types.SimpleNamespace(**{**base, **kw})


@pytest.fixture(scope="module")
def digits():
    from ptopt.core.data import load_data

    ds = load_data("builtin:digits:test")
    return [b.x for b in ds.batches(32)]


@pytest.fixture(scope="module")
def specs(digits):
    from ptopt.core.inputspec import specs_from_example

    return specs_from_example(digits[0])  # batch dynamic in [1, 64]


@pytest.fixture(scope="module")
def cli_package(tmp_path_factory):
    """``ptopt quantize tests.helpers:tiny_cnn --mode static --engine pt2e ... -o tiny.int8.pt2`` (the
    module's one compile): its path, stdout, stderr and the real speed figures it timed (the figures
    it reports are replaced by fixed ones, so both slower-than warnings always show)."""
    from click.testing import CliRunner

    from ptopt.cli.main import main
    from ptopt.compress.quantize import pt2e
    from tests.conftest import _entry

    out = tmp_path_factory.mktemp("pt2e-cli") / "tiny.int8.pt2"
    timed, real = [], pt2e.speeds  # the real timing runs (its figures are this machine's); the figures
    fake = {"fp32": {"1": 0.8, "8": 1.3}, "fx_int8": {"1": 0.75, "8": 1.36}}  # given make both warnings show
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(out.parent)
        mp.setattr(pt2e, "speeds", lambda *a: timed.append(real(*a)) or fake)
        args = [
            "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--engine", "pt2e",
            "--calib-data", "builtin:digits:train", "--eval-data", "builtin:digits:test",
            "--calibration-batches", "4", "--no-progress", "-o", str(out),
        ]  # fmt: skip
        result = CliRunner().invoke(_entry(main), args, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return out, result.stdout, result.stderr, timed


def test_converted_graph_is_int8_qdq_and_close_to_fp32(digits, specs):
    from ptopt.compress.quantize import engine_pt2e as pt2e

    source = tiny_cnn().eval()
    converted = pt2e.quantize_static(source, specs, "positional", _scheme(observer="minmax"), digits[:4])
    ops = {str(n.target) for n in converted.graph.nodes if n.op == "call_function"}
    assert any("quantize_per_tensor" in o for o in ops) and any("dequantize_per_channel" in o for o in ops)
    x = digits[5]
    with torch.no_grad():
        cos = F.cosine_similarity(source(x).flatten(), converted(x).flatten(), dim=0)
    assert cos > 0.98


def test_compiled_package_has_int8_kernels_and_takes_batches_1_to_64(cli_package, digits):
    from ptopt.core.artifact import Artifact
    from ptopt.formats.aoti import load_aoti

    path = cli_package[0]
    source = tiny_cnn().eval()
    facts = Artifact.load(path).to_dict()
    with zipfile.ZipFile(path) as z:
        code = z.read(next(n for n in z.namelist() if n.endswith("wrapper.cpp"))).decode()
    assert "qconv" in code and "qlinear" in code  # oneDNN int8 kernels, not fp32 convolutions
    assert facts["metrics"]["parity"]["passed"]
    assert facts["extra"]["pt2e"]["batches_probed"] == [1, 2, 3, 32, 63, 64]
    model = load_aoti(path)
    xs = torch.cat(digits)
    for b in (1, 5, 17, 64):
        x = xs[:b]
        with torch.no_grad():
            got, ref = model(x), source(x)
        assert got.shape == (b, 10)
        agree = (got.argmax(1) == ref.argmax(1)).float().mean()
        assert agree >= 0.9, (b, agree)


def test_qat_prepare_train_convert(digits, specs):
    from ptopt.compress.quantize import engine_pt2e as pt2e

    source = tiny_cnn()
    prepared = pt2e.prepare(source.train(), specs, "positional", _scheme(observer="minmax"), qat=True)
    opt = torch.optim.SGD(prepared.parameters(), lr=1e-3)
    for x in digits[:3]:
        loss = prepared(x).logsumexp(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    pt2e.set_training(prepared, False)
    converted = pt2e.convert(prepared)
    with torch.no_grad():
        out = converted(digits[4])
    assert out.shape == (32, 10) and torch.isfinite(out).all()
    # torchao's conv-bn fold ran for the graph's Conv2d (the passes for absent conv kinds are skipped)
    kinds = {str(getattr(n.target, "_overloadpacket", "")) for n in converted.graph.nodes}
    assert "aten.batch_norm" not in kinds and "aten.conv2d" in kinds


@pytest.mark.parametrize("dots,observer", [(True, "minmax"), (False, "histogram")], ids=["vnni", "avx2"])
def test_the_default_observer_follows_the_cpus_int8_activation_bits(monkeypatch, dots, observer):
    from ptopt.compress.quantize import engine_pt2e
    from ptopt.compress.quantize.config import StaticQuantConfig
    from ptopt.core import isa

    monkeypatch.setattr(isa, "int8_dot_products", lambda: dots)
    assert StaticQuantConfig(engine="pt2e").observed().observer == observer
    assert engine_pt2e.reduce_range() is not dots  # 7-bit activations where the histogram is kept
    assert StaticQuantConfig(engine="fx").observed().observer == "histogram"
    assert StaticQuantConfig(engine="auto").observed().observer is None  # each engine it tries decides
    assert StaticQuantConfig(engine="pt2e", observer="entropy").observed().observer == "histogram"
    ctr = engine_pt2e.build_quantizer(_scheme(observer=None)).global_config.input_activation
    assert ("MinMaxObserver" if dots else "HistogramObserver") in repr(ctr.observer_or_fake_quant_ctr)


@pytest.mark.parametrize("cap", ["AVX2", "avx512_core", "AVX512_CORE_VNNI", ""])
def test_a_onednn_cap_below_vnni_means_7_bit_activations(monkeypatch, cli, cap):
    """Under ``ONEDNN_MAX_CPU_ISA`` below VNNI (running as a lower CPU would) PT2E's int8 kernels have no
    dot products whatever the CPU: 7-bit activations and the histogram, said and recorded. A cap at or
    above VNNI, or none, leaves this CPU's answer."""
    from ptopt.compress.quantize import engine_pt2e
    from ptopt.core import isa

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    dots = cap.upper() in ("", "AVX512_CORE_VNNI") and bool(set(isa.INT8_DOT_FLAGS) & isa.cpu_flags())
    assert isa.int8_dot_products() is dots and engine_pt2e.reduce_range() is not dots
    if cap != "AVX2":
        return
    code, out, err = cli(
        "quantize", "tests.helpers:tiny_cnn", "--mode", "static", "--engine", "pt2e", "--no-compile",
        "--calib-data", "builtin:digits:train", "--calibration-batches", "1", "--no-progress", "-o", "m.pt2",
    )  # fmt: skip
    assert code == 0, err
    assert "(histogram observer" in out
    side = json.loads(Path("m.pt2.ptopt.json").read_text())
    assert side["config"]["observer"] == "histogram" and side["extra"]["pt2e"]["reduce_range"] is True


def test_conv_bn_passes_run_only_for_conv_kinds_in_the_graph(monkeypatch):
    qat_utils = torchao("torchao.quantization.pt2e.qat_utils")

    from ptopt.compress.quantize import engine_pt2e as pt2e

    calls = []
    monkeypatch.setattr(qat_utils, "_fold_conv_bn_qat_helper", lambda m, fn, *a, **k: calls.append(fn) or m)
    graph = torch.export.export(tiny_cnn().eval(), (torch.randn(2, 1, 8, 8),)).module()
    with pt2e._conv_bn_patterns_present_only():
        for fn in (F.conv1d, F.conv2d, F.conv_transpose1d, F.conv_transpose2d):
            qat_utils._fold_conv_bn_qat_helper(graph, fn, (), is_cuda=False)
    assert calls == [F.conv2d] and qat_utils._fold_conv_bn_qat_helper.__name__ == "<lambda>"


def test_exclude_keeps_module_float(digits, specs):
    from ptopt.compress.quantize import engine_pt2e as pt2e

    converted = pt2e.quantize_static(
        tiny_cnn().eval(), specs, "positional", _scheme(float_modules=("fc",)), digits[:2]
    )
    # the Linear's weight is no longer dequantized from int8: it stays a float parameter
    linear = [n for n in converted.graph.nodes if n.target == torch.ops.aten.linear.default]
    assert linear and "dequantize" not in str(linear[0].args[1].target)


def test_no_upstream_noise(capfd, digits, specs):
    from ptopt.compress.quantize import engine_pt2e as pt2e

    pt2e.quantize_static(tiny_cnn().eval(), specs, "positional", _scheme(), digits[:2])
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        if x.sum() > 0:  # torch.export cannot decide this branch from shapes
            x = x * 2
        return self.head(x.flatten(1))


def _without_torchao(monkeypatch):
    for name in [n for n in sys.modules if n == "torchao" or n.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao → ImportError


@pytest.mark.parametrize(
    "model, scheme, qat, setup, match, error",
    [
        ("tiny", _scheme(per_channel=False), False, None, ("per channel", "--engine fx"), "UsageError"),
        ("tiny", _scheme(backend="qnnpack"), False, None, ("x86", "--engine fx"), "UsageError"),
        ("tiny", _scheme(observer="mse"), False, None, "unknown observer", "UsageError"),
        ("tiny", _scheme(float_modules=("nope",)), False, None, "--exclude nope", "UsageError"),
        (
            "datadep",
            _scheme(),
            False,
            None,
            ("torch.export cannot capture", "--engine fx"),
            "UnsupportedModelError",
        ),
        ("tiny", _scheme(), True, _without_torchao, "ptopt[torchao]", "MissingDependencyError"),
    ],
    ids=["per-tensor", "qnnpack", "bad-observer", "bad-exclude", "uncapturable", "no-torchao"],
)
def test_bad_input_refused(monkeypatch, specs, model, scheme, qat, setup, match, error):
    from ptopt.compress.quantize import engine_pt2e as pt2e
    from ptopt.core import errors

    if setup is not None:
        setup(monkeypatch)
    module = tiny_cnn().eval() if model == "tiny" else DataDependent().eval()
    assert_refused(
        pt2e.prepare, module, specs, "positional", scheme, qat=qat, match=match, error=getattr(errors, error)
    )


def test_dynamic_mode_refused():
    from ptopt.compress.quantize import engine_pt2e as pt2e
    from ptopt.core.errors import UsageError

    assert_refused(
        pt2e.check_scheme, _scheme(), "dynamic", match=("--engine fx", "static and qat"), error=UsageError
    )


def test_failing_batches_become_one_line_naming_what_works(monkeypatch, specs):
    """A package that crashes at some batch sizes inside generated code is refused with the sizes."""
    from ptopt.compress.quantize import pt2e_package
    from ptopt.core.errors import UnsupportedModelError

    def flaky(x):
        if x.shape[0] > 3:
            raise AssertionError("expected size 32==s77, stride 1024==1024 at dim=0 (assert_size_stride)")
        return x.flatten(1)

    msg = assert_refused(pt2e_package._probe, flaky, specs, "positional", error=UnsupportedModelError)
    assert "fails at batch size(s) 32, 63, 64" in msg and "runs at 1, 2, 3" in msg and "--engine fx" in msg


# -- ptopt quantize --engine pt2e|auto ---------------------------------------------------------------


def test_cli_quantize_engine_pt2e_writes_a_package(cli_package):
    from ptopt.core.modelref import load_model

    out, stdout, err, timed = cli_package
    assert "AOTInductor package int8" in stdout and "calibration: 4 batches" in stdout
    art = load_model(out, allow_pickle=True).artifact
    assert art.extra["static_batches"] == []  # the dynamic-batch model only, unless asked
    assert art.format == "aoti_package" and art.precision == "int8" and art.config["engine"] == "pt2e"
    assert art.metrics["parity"]["passed"] and art.metrics["eval_samples"] > 0
    assert art.metrics["size_ratio_vs_fp32_torchscript"] > 0
    assert art.extra["pt2e"]["batches_probed"][0] == 1
    # no --observer: the engine's own for this CPU's int8 activation bits, used and recorded
    from ptopt.compress.quantize.config import engine_observer

    assert art.config["observer"] == art.extra["calibration"]["observer"] == engine_observer("pt2e")
    # the tiny CNN's package is mostly compiled code: it is larger than the fp32 TorchScript, and says why
    m = art.metrics
    assert (
        m["weight_bytes"] + m["compiled_code_bytes"] == art.size_bytes
        and m["weight_bytes"] < m["fp32_torchscript_bytes"]
    )
    assert "warning: this int8 file is LARGER" in err and "compiled code (a fixed cost of the format" in err
    assert art.extra["pt2e"]["speed_vs_fp32"] == {"1": 0.8, "8": 1.3}
    assert art.extra["pt2e"]["speed_vs_fx_int8"] == {"1": 0.75, "8": 1.36}
    # the package was timed against both: its fp32 source and the int8 TorchScript --engine fx writes
    assert set(timed[0]) == {"fp32", "fx_int8"} and timed[0]["fp32"].keys() == timed[0]["fx_int8"].keys()
    assert "1" in timed[0]["fp32"]
    assert all(v > 0 for r in timed[0].values() for v in r.values())
    assert "this PT2E int8 package runs SLOWER than its fp32 source here (0.80x at batch 1" in err
    assert "SLOWER than torch.ao FX int8 of the same model here (0.75x at batch 1" in err
    assert "--engine fx writes the faster artifact here" in err


def test_static_auto_keeps_the_first_engine_that_holds_and_says_why(digits):
    """A model fx quantizes within the int8 rule: auto writes fx's artifact and builds no PT2E model."""
    import ptopt

    res = ptopt.quantize(
        tiny_cnn(), "static", calib_data=torch.cat(digits[:4]), eval_data=torch.cat(digits[4:8]),
        calibration_batches=2, engine="auto", progress=False,
    )  # fmt: skip
    choice = res.extra["engine_choice"]
    assert choice["chosen"] == "fx" and choice["why"] == "the whole-model int8 holds the int8 rule"
    assert [e["engine"] for e in res.extra["auto_int8"]["engines"]] == ["fx"]
    assert res.format == "torchscript" and res.metrics["vs_fp32"]["passed"]
    x = digits[0]
    assert res.model(x).shape == (32, 10)


@pytest.mark.parametrize(
    "args, match",
    [
        (["--mode", "dynamic", "--engine", "pt2e"], ("--engine pt2e", "--mode dynamic runs on --engine fx")),
        (["--mode", "static", "--engine", "pt2e", "--per-tensor", "--calib-data", "builtin:digits:train"],
         ("per-channel", "--engine fx")),
        (["--mode", "qat", "--engine", "auto", "--backend", "qnnpack", "--train-data", "builtin:digits:train"],
         ("--backend qnnpack runs on --engine fx",)),
        (["--mode", "static", "--engine", "fx", "--static-batch", "1", "--calib-data", "builtin:digits:train"],
         ("--static-batch", "--engine fx writes none")),
        (["--mode", "static", "--engine", "pt2e", "--no-compile", "--static-batch", "1",
          "--calib-data", "builtin:digits:train"], ("--static-batch", "--no-compile writes none")),
        (["--mode", "static", "--engine", "pt2e", "--static-batch", "0", "--calib-data", "builtin:digits:train"],
         ("--static-batch", "must be positive")),
        (["--mode", "dynamic", "--static-batch", "1"], ("--static-batch",)),
    ],
    ids=["dynamic", "per-tensor", "qnnpack", "static-batch-fx", "static-batch-no-compile", "static-batch-0",
         "static-batch-dynamic"],
)  # fmt: skip
def test_cli_engine_refusals(cli, tmp_path, args, match):
    assert_refused(
        cli,
        "quantize",
        "tests.helpers:tiny_cnn",
        *args,
        "-o",
        tmp_path / "m.pt2",
        match=match,
        where=tmp_path,
    )


def test_only_the_engines_import_torchao():
    """Inside the stages, torchao is imported by its engine files only (PT2E; weight-only): the
    format modules (``formats/``) read their own artifacts and are not scanned here."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    importers = set()
    for folder in ("core", "compress", "export", "validate", "serve", "cli", "models", "ptopt"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(n == "torchao" or n.startswith("torchao.") for n in names):
                    importers.add(path.relative_to(root).as_posix())
    assert importers == {"compress/quantize/engine_pt2e.py", "compress/quantize/engine_torchao.py"}


def test_static_batches_reach_the_package_writer(monkeypatch, digits):
    """``--static-batch`` is the AOTInductor writer's own option (compiled and checked by
    tests/export/test_aoti.py); quantize hands it over as given, sorted."""
    import ptopt
    from ptopt.compress.quantize import pt2e_package

    class Compiled(Exception):
        pass

    def compile_int8(converted, path, specs, style, samples=None, **options):
        raise Compiled(options)

    monkeypatch.setattr(pt2e_package, "compile_int8", compile_int8)
    with pytest.raises(Compiled) as seen:
        ptopt.quantize(
            tiny_cnn(), "static", calib_data=torch.cat(digits[:2]), engine="pt2e", static_batches="32,1",
            calibration_batches=1, progress=False,
        )  # fmt: skip
    assert seen.value.args[0] == {"static_batches": (1, 32)}


class _Branchy(nn.Module):
    """A data-dependent ``if``: torch.fx cannot trace it (torch.export would, with torch.cond)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


@pytest.mark.parametrize("model, traces", [(tiny_cnn, True), (_Branchy, False)], ids=["tiny-cnn", "branchy"])
def test_the_fx_int8_model_a_package_is_timed_against(model, traces):
    """What ``--engine pt2e`` times its package against besides fp32: the int8 TorchScript ``--engine fx``
    writes (frozen, int8 kernels, same outputs within int8 error), or the reason there is none."""
    from types import SimpleNamespace

    from ptopt.compress.quantize import pt2e
    from ptopt.compress.quantize.base import Prepared
    from ptopt.core.data import Dataset

    torch.manual_seed(0)
    x = torch.randn(64, 1, 8, 8)
    fp32 = model().eval()
    prep = Prepared(SimpleNamespace(input_style="positional"), fp32, Dataset(x), None, None, x[:4])
    ts, why = pt2e.fx_int8_to_time(_scheme(), prep)
    if not traces:
        assert ts is None and why.startswith("torch.fx int8 could not be built (") and "trace" in why
        return
    assert why is None and isinstance(ts, torch.jit.ScriptModule)
    assert any("quantized" in n.kind() for n in ts.graph.nodes())  # int8 kernels, not fp32
    with torch.no_grad():
        ref, got = fp32(x[:8]), ts(x[:8])
    assert F.cosine_similarity(ref, got).min() > 0.9


def test_slower_than_fx_int8_names_fx_only_where_fx_int8_held(capsys):
    """The way out of a PT2E package slower than FX int8 is ``--engine fx`` only when FX int8 holds the int8
    rule: after ``--engine auto`` went on to PT2E because FX int8 missed it, the warning says that instead."""
    from ptopt.cli.quantize import _slower_warnings

    pt2e = {"speed_vs_fp32": {"1": 1.2}, "speed_vs_fx_int8": {"1": 0.7, "32": 1.4}}
    _slower_warnings({"pt2e": pt2e})
    err = capsys.readouterr().err
    assert "SLOWER than torch.ao FX int8 of the same model here (0.70x at batch 1;" in err
    assert "--engine fx writes the faster artifact here" in err and "fp32 source" not in err
    _slower_warnings({"pt2e": pt2e, "auto_int8": {"engines": [{"engine": "fx", "holds": False}]}})
    err = capsys.readouterr().err
    assert "FX int8 missed the int8 rule on this model" in err and "--engine fx writes" not in err


class _PaddedCnn(nn.Module):
    def __init__(self, kernel: int, padding: str):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 8, kernel, padding=padding)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)).mean((2, 3)))


def valid_padding_cnn() -> nn.Module:
    """A conv with ``padding="valid"`` (SigLIP's patch embedding): ``aten.conv2d.padding`` in the graph."""
    return _PaddedCnn(3, "valid").eval()


def same_padding_cnn() -> nn.Module:
    return _PaddedCnn(3, "same").eval()


def even_same_padding_cnn() -> nn.Module:
    """``padding="same"`` with an even kernel: uneven padding, which no zero-padding conv says."""
    return _PaddedCnn(2, "same").eval()


@pytest.mark.parametrize("factory", ["valid_padding_cnn", "same_padding_cnn"])
def test_cli_a_string_padding_conv_quantizes(cli, factory):
    """Was exit 3, 'internal error: ValueError: conv2d is not an aten conv2d operator' (X86InductorQuantizer
    on SigLIP's ``padding="valid"`` patch embedding): the conv is the plain aten conv2d with its padding as
    numbers, and it is int8."""
    code, out, err = cli(
        "quantize", f"tests.compress.test_pt2e:{factory}", "--mode", "static", "--engine", "pt2e",
        "--no-compile", "--calib-data", "builtin:digits:train", "--calibration-batches", "1", "--no-progress",
        "-o", "m.pt2",
    )  # fmt: skip
    assert code == 0, err
    assert "int8: 2 of 2 layers with weights" in out


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_cli_a_conv_the_quantizer_refuses_is_one_line(cli, tmp_path):
    """``padding="same"`` with an even kernel pads unevenly: no conv2d padding says it, torchao refuses it,
    and that is one line (exit 2) naming the engines that still work."""
    assert_refused(
        cli, "quantize", "tests.compress.test_pt2e:even_same_padding_cnn", "--mode", "static", "--engine",
        "pt2e", "--no-compile", "--calib-data", "builtin:digits:train", "--calibration-batches", "1",
        "-o", tmp_path / "m.pt2", match="PT2E int8 cannot annotate this model", where=tmp_path,
    )  # fmt: skip
