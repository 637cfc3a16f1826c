"""``validate --isa``: every model judged again at CPU levels, each level in a child process with the kernel
libraries capped; the levels themselves (``ptopt.core.isa``); what a sidecar records of its CPU.

The levels used here (``avx``, ``sse41``) are below every CPU this project runs on (AVX2-only EPYC,
AVX-512 EPYC, AMX Xeon), so the tests hold on each; a level above the CPU is faked with the flags."""

from __future__ import annotations

import json

import pytest

from ptopt.core import isa
from ptopt.core.errors import UsageError
from ptopt.validate.api import validate
from ptopt.validate.latency import LatencyOptions
from tests.helpers import assert_refused
from tests.validate.conftest import FACTORY, FAST

QUICK = LatencyOptions(min_iters=2, min_seconds=0.01, warmup_iters=1, warmup_seconds=0.0, rounds=2)
AVX2_ONLY = {"sse4_1", "sse4_2", "avx", "avx2", "fma"}
AMX = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "amx_tile",
                   "amx_int8", "amx_bf16"}  # fmt: skip


# -- the levels -----------------------------------------------------------------------------------------
def test_levels_reached_and_their_caps():
    assert isa.top_level(AVX2_ONLY) == "avx2" and isa.top_level(AMX) == "amx"
    assert isa.check_levels("avx2,avx, sse41", AVX2_ONLY) == ["avx2", "avx", "sse41"]
    assert isa.check_levels(["native", "avx512_vnni", "native"], AMX) == ["native", "avx512_vnni"]
    env = isa.child_env("avx512_vnni", {"ONEDNN_MAX_CPU_ISA": "AVX2", "PATH": "/bin"})
    assert env == {"PATH": "/bin", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI", "ATEN_CPU_CAPABILITY": "avx512",
                   "MKL_ENABLE_INSTRUCTIONS": "AVX512_E1", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_E1"}  # fmt: skip
    assert isa.child_env("native", {"ATEN_CPU_CAPABILITY": "default"}) == {}  # an inherited cap is dropped


@pytest.mark.parametrize(
    "value, match",
    [("avx9", "unknown CPU level"), ("", "name at least one"), ("avx512_vnni", "cannot run AVX-512 VNNI code"),
     ("avx2,amx", "lacks avx512f")],
    ids=["unknown", "empty", "above-this-cpu", "one-of-several-above"],
)  # fmt: skip
def test_bad_levels_refused(value, match):
    with pytest.raises(UsageError, match=match):
        isa.check_levels(value, AVX2_ONLY)


@pytest.mark.parametrize(
    "libraries, level, vendor, verdict",
    [(("mlas",), "avx", None, "ignores"), (("aten", "onednn", "mkl"), "avx2", "GenuineIntel", "follows"),
     (("aten", "onednn", "mkl"), "avx2", "AuthenticAMD", "partly"), (("onednn", "mlas"), "avx2", None, "partly"),
     (("aten", "onednn", "fbgemm"), "sse41", None, "partly"), (("onednn", "inductor"), "avx2", None, "partly")],
    ids=["onnxruntime", "torch-intel", "torch-amd-mkl", "openvino", "fbgemm-below-avx2", "aoti"],
)  # fmt: skip
def test_coverage_of_each_runtime(libraries, level, vendor, verdict):
    cov = isa.coverage(libraries, level, vendor)
    assert cov.verdict == verdict
    assert (cov.note("rt", level) == "") == (verdict == "follows")


def test_aoti_kernels_compiled_above_a_level_cannot_run_there():
    assert not isa.vec_isa_reaches("AVX2", "avx") and isa.vec_isa_reaches("AVX2", "avx2")
    assert not isa.vec_isa_reaches("AMX_TILE", "avx512_bf16") and isa.vec_isa_reaches("avx512", "amx")
    assert isa.vec_isa_reaches("", "sse41")  # unknown: not refused


def test_aoti_isa_as_torch_writes_it_names_every_extension():
    """A package's ``AOTI_CPU_ISA`` is ``str(pick_vec_isa()).upper()``: ``AVX512 AVX512_VNNI`` on a VNNI CPU,
    ``AVX512 AVX512_VNNI AMX_TILE`` on an AMX one (read as unknown before, so such a package ran at avx2)."""
    from torch._inductor import cpu_vec_isa as vec

    vnni, amx = str(vec.VecAVX512VNNI()).upper(), str(vec.VecAMX()).upper()
    assert (isa.vec_isa_level(vnni), isa.vec_isa_level(amx)) == ("avx512_vnni", "amx")
    assert not isa.vec_isa_reaches(vnni, "avx2") and not isa.vec_isa_reaches(vnni, "avx512")
    assert isa.vec_isa_reaches(vnni, "avx512_vnni") and not isa.vec_isa_reaches(amx, "avx512_bf16")
    assert (
        isa.vec_isa_level(str(vec.VecAVX2()).upper()) == "avx2"
        and isa.vec_isa_level("INVALID_VEC_ISA") is None
    )


def test_children_share_the_timing_budget():
    from ptopt.validate.isa import child_latency

    lat = LatencyOptions(min_iters=10, min_seconds=3.0, rounds=15)
    assert child_latency(lat, 1) is lat
    half = child_latency(lat, 2)
    assert (half.min_seconds, half.min_iters, half.rounds, half.warmup_iters) == (1.5, 5, 7, lat.warmup_iters)
    assert (
        child_latency(LatencyOptions(min_iters=1, min_seconds=0.5, rounds=2), 4).rounds == 2
    )  # never below 1


def test_cpu_difference_in_words():
    rec = {
        "model": "Xeon",
        "int8_flags": ["avx2", "fma", "avx512f", "avx512_vnni", "amx_int8"],
        "level": "amx",
    }
    line = isa.mismatch_line(
        "m.int8.xml", rec, "ptopt validate R m.int8.xml --data D --isa {level}", AVX2_ONLY
    )
    assert "checked on Xeon (level amx)" in line and "this CPU lacks avx512f, avx512_vnni, amx_int8" in line
    assert line.endswith("--isa avx2")
    assert isa.difference({"int8_flags": ["avx2", "fma"]}, AVX2_ONLY) is None
    assert isa.difference({}, AVX2_ONLY) is None  # a sidecar from before: nothing said


# -- validate --isa ---------------------------------------------------------------------------------------
def test_every_model_at_a_capped_level_in_a_child(artifacts, tmp_path):
    res = validate(
        FACTORY, [artifacts["torchscript"], artifacts["onnx"]], artifacts["data"], batch_sizes=(1, 8), threads=1,
        latency=QUICK, isa=["sse41"], max_accuracy_drop=5, markdown_path=tmp_path / "r.md",
        report_path=tmp_path / "r.html",
    )  # fmt: skip
    assert res.passed, res.failed_gates
    ts, onnx = res.entry("tiny.ts.pt"), res.entry("tiny.onnx")
    fig = ts["by_isa"]["sse41"]
    assert fig["emulated"] and fig["error"] is None and fig["coverage"]["verdict"] in ("partly", "follows")
    assert fig["metric"] == pytest.approx(ts["metric"], abs=0.02) and fig["agreement"]["min_cosine"] > 0.999
    assert fig["accuracy_drop"] is not None and set(fig["speedup"]) == {"1", "8"}
    assert res.reference["by_isa"]["sse41"]["latency"]["8"]["p50_ms"] > 0
    assert (
        onnx["by_isa"]["sse41"].get("ignored") and "ignores the sse41 cap" in onnx["by_isa"]["sse41"]["note"]
    )
    assert {g["gate"] for g in ts["gates"]} == {"max-accuracy-drop", "max-accuracy-drop@sse41"}
    assert not any(g.get("isa") for g in onnx["gates"])  # an ignored level is not gated
    assert res.data["isa"]["children"]["sse41"]["aten_capability"] == "DEFAULT"  # the cap reached the child
    assert res.data["isa"]["child_timing"] == {
        "min_seconds": 0.01,
        "min_iters": 2,
        "rounds": 2,
    }  # one child: all
    md, page = (tmp_path / "r.md").read_text(), (tmp_path / "r.html").read_text()
    for text in (md, page):
        assert "Per CPU level" in text and "emu" in text and "ignores cap" in text
    # the level's top-1 agreement is a column (a failing --min-agreement@LEVEL showed no figure)
    from ptopt.validate.reports import facts

    head, rows = facts.isa_head(res.data), facts.isa_rows(res.data)
    ts_row = next(r for r in rows if r[:2] == ["tiny.ts.pt", "sse41"])
    assert head[5] == "agree" and ts_row[5].endswith("%") and len(ts_row) == len(head)
    assert all(len(r) == len(head) for r in rows)


@pytest.mark.skipif(
    not isa.reaches("avx512") or isa.openvino_bf16_capped_away(),
    reason="a bf16 OpenVINO IR runs in bf16 on an AVX-512 CPU only (uncapped below it)",
)
def test_a_bf16_openvino_ir_runs_in_f32_at_a_level_below_avx512(artifacts, tmp_path):
    """Under an AVX2 cap OpenVINO's CPU plugin (2026.4) still reports bf16, picks it and fails (zero output
    rows); a CPU without AVX-512 runs the IR in f32, and so does the child at that level, saying so."""
    pytest.importorskip("openvino")
    import ptopt

    ir = tmp_path / "m.bf16.xml"
    ptopt.export(FACTORY, "openvino", ir, precision="bf16", input_shapes="1x1x8x8")
    res = validate(
        FACTORY, [ir], artifacts["data"], batch_sizes=(1,), threads=1, latency=QUICK, isa=["avx2"],
        max_accuracy_drop=5,
    )  # fmt: skip
    fig = res.entry("m.bf16.xml")["by_isa"]["avx2"]
    assert fig["error"] is None and fig["metric"] is not None, fig
    assert fig["agreement"]["min_cosine"] > 0.9999  # f32 kernels: the reference's outputs, not bf16's
    assert "m.bf16.xml is a bf16 IR: at avx2 it runs in f32" in fig["note"]
    assert res.passed, res.failed_gates


def test_cli_a_level_that_crashes_is_named_and_the_rest_reported(cli, artifacts):
    code, out, err = cli(
        "validate", FACTORY, "tests.validate.fns:dies_at_avx", artifacts["torchscript"], "--data", artifacts["data"],
        "--isa", "avx", "--batch-sizes", "4", "--threads", "1", "--json", "r.json", *FAST,
    )  # fmt: skip
    assert code == 1, err  # the model that dies there fails runs@avx; nothing else is lost
    assert "per CPU level (--isa)" in out and "emu" in out and "FAIL: runs@avx" in " ".join(out.split())
    assert "--isa avx: 3 model(s) in a child process" in err and "the child process died (SIGSEGV)" in err
    data = json.loads(open("r.json").read())
    dies, ts = data["artifacts"]
    assert "SIGSEGV" in dies["by_isa"]["avx"]["error"] and "at avx" in dies["by_isa"]["avx"]["error"]
    assert dies["metric"] is not None  # its native figures stand
    assert ts["by_isa"]["avx"]["error"] is None and ts["by_isa"]["avx"]["metric"] is not None  # run again
    assert [g["gate"] for g in data["gate_results"] if not g["passed"]] == ["runs@avx"]
    assert data["isa"]["levels"] == ["avx"] and data["isa"]["children"]["avx"]["crash"]


@pytest.mark.parametrize(
    "extra, match",
    [(("--isa", "avx9"), "unknown CPU level"), (("--isa", "amx"), "this CPU cannot run AMX"),
     (("--isa", "avx", "--device", "cuda"), ""), (("--isa", ""), "--isa '': names nothing"),
     (("--isa", " , "), "names nothing")],
    ids=["unknown-level", "above-this-cpu", "not-on-a-gpu", "empty (it ran without levels)", "commas"],
)  # fmt: skip
def test_cli_bad_isa_refused(cli, artifacts, monkeypatch, tmp_path, extra, match):
    monkeypatch.setattr(isa, "cpu_flags", lambda: set(AVX2_ONLY))
    assert_refused(cli, "validate", FACTORY, artifacts["torchscript"], "--data", artifacts["data"], *extra,
                   "--json", "r.json", match=match, where=tmp_path)  # fmt: skip


def test_api_bad_isa_refused(artifacts, monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags", lambda: set(AVX2_ONLY))
    assert_refused(validate, FACTORY, artifacts["torchscript"], artifacts["data"], isa=["avx512"],
                   match="cannot run AVX-512 code", error=UsageError)  # fmt: skip


# -- the CPU an artifact was checked on -------------------------------------------------------------------
def _fake_checked_on(path, flags):
    side = path.with_name(path.name + ".ptopt.json")
    data = json.loads(side.read_text())
    data["cpu"] = {"model": "Some Xeon", "vendor": "GenuineIntel", "int8_flags": flags, "level": "amx"}
    side.write_text(json.dumps(data))


def test_an_int8_artifact_from_another_cpu_says_so(cli, tmp_path, capsys, artifacts):
    import ptopt
    from ptopt.core.modelref import load_model

    res = ptopt.quantize(FACTORY, mode="dynamic", output=tmp_path / "m.int8.pt", progress=False)
    assert res.artifact.cpu == isa.cpu_record() and res.artifact.cpu["int8_flags"]
    _fake_checked_on(tmp_path / "m.int8.pt", ["fma"])  # a CPU without avx2: unlike every CPU the tests run on
    loaded = load_model(tmp_path / "m.int8.pt")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was checked on Some Xeon (level amx)" in err
    assert "it has avx2" in err and "which that one had not" in err
    assert "--isa " in err and loaded.info["cpu_note"] == err.strip()
    load_model(tmp_path / "m.int8.pt")
    assert capsys.readouterr().err == ""  # once per file
    code, out, err = cli("validate", FACTORY, tmp_path / "m.int8.pt", "--data", artifacts["data"], "--batch-sizes",
                         "2", *FAST)  # fmt: skip
    assert code == 0, err
    said = " ".join(out.split())  # the footer wraps at the table's width
    assert f"ptopt validate {FACTORY} {tmp_path / 'm.int8.pt'} --data {artifacts['data']} --isa" in said


def test_the_notes_name_the_level_the_main_table_was_measured_at():
    """The main table's figures are this CPU's own level, uncapped: only the ``emu`` note named that level;
    a note now says which level the main table is, and that ``native`` rows are the same figures."""
    from ptopt.validate.reports.facts import isa_notes

    data = {"isa": {"levels": ["avx", "native"], "native_level": "avx2", "children": {}},
            "reference": {"name": "ref", "role": "reference"}, "artifacts": []}  # fmt: skip
    notes = isa_notes(data)
    want = (
        "the main table: this CPU's own level (avx2), uncapped, measured in this process (the per-level rows "
    )
    assert want + "at native are the same figures)" in notes


def test_the_main_table_note_minds_inherited_caps():
    """With a cap inherited from the environment this process is capped, and its top level ran in a child
    (``is_native`` is false): the main table is not "uncapped", nor the same figures as that level's rows."""
    from ptopt.validate.reports.facts import isa_notes

    data = {"isa": {"levels": ["avx2", "native"], "native_level": "avx2", "children": {},
                    "inherited_caps": {"ONEDNN_MAX_CPU_ISA": "AVX"}},
            "reference": {"name": "ref", "role": "reference"}, "artifacts": []}  # fmt: skip
    (note,) = [n for n in isa_notes(data) if n.startswith("the main table")]
    assert note == (
        "the main table: this CPU's own level (avx2), with the caps it inherited, measured in this process "
        "(the per-level rows at native are the same figures)"
    )
    data["isa"].pop("inherited_caps")
    (note,) = [n for n in isa_notes(data) if n.startswith("the main table")]
    assert "uncapped" in note and "rows at avx2, native are the same figures" in note
