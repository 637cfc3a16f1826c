"""``--target aoti``: an AOTInductor package (``.pt2``) compiled with freezing, a dynamic batch from
the InputSpecs, checked at min/opt/max after ``aoti_load_package``, loadable with plain torch.

``--static-batch``: fixed-batch models compiled into the same package beside the dynamic-batch one
(Inductor prepacks convolution weights only at a fixed batch), each checked at its batch, picked by
ptopt's loaders for a batch of exactly that size; plain torch still loads the dynamic model by
default, and each fixed one by name.

Compiling takes ~10-20 s per model on a quiet machine: one package (the CLI's, a dynamic-batch model
and a batch-4 one) is shared by the module, plus one in-memory export (from the compile cache) and
one bf16 package."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.helpers import assert_refused, not_progress, tiny_cnn

DATA = "builtin:digits:test"


def _wrapper_code(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("wrapper.cpp"))).decode()


def _export_tiny(out: Path, cwd: Path) -> subprocess.CompletedProcess:
    """``ptopt export tests.helpers:tiny_cnn --target aoti --dynamic-batch 1:4:16 --static-batch 4 -o OUT``
    as a user runs it."""
    repo = Path(__file__).resolve().parents[2]  # tests.helpers:tiny_cnn must import in the subprocess
    run = subprocess.run(
        [sys.executable, "-m", "ptopt.cli.main", "export", "tests.helpers:tiny_cnn", "--target", "aoti"]
        + ["--dynamic-batch", "1:4:16", "--static-batch", "4", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(repo)),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[Path, str]:
    """``ptopt export tests.helpers:tiny_cnn --target aoti --dynamic-batch 1:4:16 --static-batch 4`` (its
    stdout too): the module's one package, for the dynamic-batch tests and the fixed-batch ones (two
    compiles in one)."""
    out = tmp_path_factory.mktemp("aoti") / "tiny.pt2"
    run = _export_tiny(out, out.parent)
    assert not_progress(run.stderr) == [], run.stderr[-3000:]  # no upstream noise reaches the user
    return out, run.stdout


def test_cli_writes_package_and_sidecar_with_compile_facts(package):
    path, stdout = package
    assert "compile: AOTInductor" in stdout and "parity:" in stdout
    side = json.loads(Path(str(path) + ".ptopt.json").read_text())
    assert side["format"] == "aoti_package" and side["config"]["target"] == "aoti"
    extra = side["extra"]
    assert extra["compile_options"] == {"freezing": True}
    assert extra["torch_version"] == torch.__version__ and extra["compile_seconds"] > 0
    assert extra["compiler"] and extra["cpu_isa"]
    spec = side["inputs"][0]
    assert spec["min_shape"][0] == 1 and spec["opt_shape"][0] == 4 and spec["max_shape"][0] == 16
    parity = side["metrics"]["parity"]
    assert parity["passed"] and set(parity["shapes"]) >= {"min", "opt", "max"}
    # freezing took effect: the convolutions run as oneDNN kernels on pre-packed weights, not as
    # plain aten convolutions on the weights passed in at run time
    code = _wrapper_code(path)
    assert "aoti_torch_cpu_convolution" not in code and "mkldnn" in code
    with zipfile.ZipFile(path) as z:  # the torch version also travels inside the package
        meta = json.loads(z.read(next(n for n in z.namelist() if n.endswith("wrapper_metadata.json"))))
    assert meta["ptopt_torch_version"] == torch.__version__


def test_the_same_export_again_comes_from_the_compile_cache(package, tmp_path):
    """The same program built the same way is compiled once: a second export copies the package from
    ptopt's compile cache ($PTOPT_CACHE_DIR/aoti), says so, and records the first build's seconds."""
    path, _ = package
    out = tmp_path / "again.pt2"
    run = _export_tiny(out, path.parent)  # as the fixture's run: same environment, threads and cache
    assert "from ptopt's compile cache" in run.stdout and "PTOPT_AOTI_CACHE=0" in run.stdout, run.stdout
    extra = json.loads(Path(str(out) + ".ptopt.json").read_text())["extra"]
    assert extra["compile_cache"]["built"] and extra["compile_seconds"] > 0
    assert _wrapper_code(out) == _wrapper_code(path)  # the very package, parity-checked again on export


def test_inspect_describes_a_package_which_has_no_parameters(package, cli):
    """`ptopt inspect m.pt2 --allow-pickle` of an AOTInductor package was an internal error (exit 3:
    'AOTICompiledModel' object has no attribute 'parameters')."""
    path, _ = package
    code, out, err = cli("inspect", path, "--allow-pickle")
    assert code == 0, err
    assert "input:      input: [1..16]x1x8x8 float32" in out, out
    assert "output:     output: 4x10 float32 (from a batch of 4)" in out, out


def test_package_runs_with_plain_torch(package, tmp_path):
    """No ptopt in the loading process: ``torch._inductor.aoti_load_package`` and a call."""
    path, _ = package
    source = tiny_cnn().eval()
    xs = [torch.randn(b, 1, 8, 8) for b in (1, 7, 16)]
    with torch.no_grad():
        torch.save({"xs": xs, "ys": [source(x) for x in xs]}, tmp_path / "io.pt")
    script = (
        "import sys, torch\n"
        "m = torch._inductor.aoti_load_package(sys.argv[1])\n"
        "d = torch.load(sys.argv[2])\n"
        "for x, y in zip(d['xs'], d['ys']):\n"
        "    torch.testing.assert_close(m(x), y, atol=1e-4, rtol=1e-4)\n"
        "assert 'ptopt' not in sys.modules\n"
        "print('ok')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(path), str(tmp_path / "io.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_load_model_dispatches_on_format_and_needs_trust(package, tmp_path):
    from ptopt.core.errors import UnsafePickleError
    from ptopt.core.modelref import load_model

    path, _ = package
    assert_refused(load_model, path, match=("AOTInductor package", "--allow-pickle"), error=UnsafePickleError)
    loaded = load_model(path, allow_pickle=True)
    assert loaded.format == "aoti_package" and loaded.input_specs[0].max_shape[0] == 16
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(loaded.module(x), tiny_cnn().eval()(x), atol=1e-4, rtol=1e-4)
    # without its sidecar the archive itself says what it is
    bare = tmp_path / "bare.pt2"
    shutil.copyfile(path, bare)
    assert load_model(bare, allow_pickle=True).format == "aoti_package"
    # an ExportedProgram .pt2 still loads as one
    ep = torch.export.export(tiny_cnn().eval(), (torch.randn(2, 1, 8, 8),))
    torch.export.save(ep, tmp_path / "ep.pt2")
    assert load_model(tmp_path / "ep.pt2").format == "exported_program"


def _with_torch_version(src: Path, dest: Path, version: str | None) -> Path:
    """A copy of the package whose metadata names another torch (or none)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith("metadata.json"):
                meta = json.loads(data)
                meta.pop("ptopt_torch_version", None)
                if version is not None:
                    meta["ptopt_torch_version"] = version
                data = json.dumps(meta).encode()
            zout.writestr(item, data)
    return dest


@pytest.mark.parametrize("where", ["package", "sidecar"], ids=["in-package", "in-sidecar"])
def test_package_from_another_torch_is_refused_naming_both(package, tmp_path, where):
    from ptopt.core.artifact import sha256_file
    from ptopt.core.errors import ModelLoadError
    from ptopt.core.modelref import load_model
    from ptopt.export.writers import reload

    path, _ = package
    other = tmp_path / "other.pt2"
    if where == "package":
        _with_torch_version(path, other, "2.11.0+cu130")
    else:  # an older package without the key: the sidecar's record decides
        _with_torch_version(path, other, None)
        side = json.loads(Path(str(path) + ".ptopt.json").read_text())
        side["extra"]["torch_version"] = "2.11.0+cu130"
        digest = sha256_file(other)  # a sidecar counts only for the very bytes it describes
        side.update(sha256=digest, hashes={other.name: digest}, path=other.name, files=[other.name])
        Path(str(other) + ".ptopt.json").write_text(json.dumps(side))
    needles = ("built by torch 2.11.0+cu130", f"this is torch {torch.__version__}")
    assert_refused(load_model, other, allow_pickle=True, match=needles, error=ModelLoadError)
    if where == "package":
        assert_refused(reload, other, "aoti_package", match=needles, error=ModelLoadError)


def test_validate_runner_times_and_scores_the_package(package):
    from ptopt.validate.runners import open_runner

    path, _ = package
    runner = open_runner(str(path), allow_pickle=True)
    assert type(runner).__name__ == "AotiRunner" and runner.runtime == "AOTInductor"
    assert runner.format == "aoti_package" and runner.batch_range == (1, 16)
    assert runner.accepts_batch(16) and not runner.accepts_batch(17)
    runner.prepare(1)
    x = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(runner.predict(x), tiny_cnn().eval()(x).detach(), atol=1e-4, rtol=1e-4)
    runner.timed_call(x)()
    assert runner.info["cpu_isa"] and runner.info["torch_version"] == torch.__version__


def test_validate_cli_scores_the_package(package, cli, tmp_path):
    path, _ = package
    code, out, err = cli(
        "validate", "tests.helpers:tiny_cnn", str(path), "--data", DATA, "--allow-pickle",
        "--batch-sizes", "1,8", "--min-iters", "3", "--min-seconds", "0.05", "--rounds", "2",
        "--max-samples", "64", "--json", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    text = json.dumps(report)
    assert "aoti_package" in text and "AOTInductor" in text
    # the export's compile, from the sidecar: this run compiled nothing (it said "torch.compile: ...")
    assert f"AOTInductor: {path.name} was compiled in" in out and "torch.compile:" not in out, out


def test_validate_isa_does_not_run_a_vnni_package_at_a_lower_level(package, cli, tmp_path):
    """A package compiled on an AVX-512 VNNI CPU (``AOTI_CPU_ISA`` ``AVX512 AVX512_VNNI``, faked in the
    sidecar: the real one is this CPU's) cannot run on a CPU at avx: ``runs@avx`` fails, nothing timed."""
    path, _ = package
    pkg = tmp_path / "vnni.pt2"
    shutil.copy(path, pkg)
    side = json.loads(Path(str(path) + ".ptopt.json").read_text())
    side["extra"]["cpu_isa"] = "AVX512 AVX512_VNNI"
    side.update(path=pkg.name, files=[pkg.name], hashes={pkg.name: side["sha256"]})
    Path(str(pkg) + ".ptopt.json").write_text(json.dumps(side))
    code, out, err = cli(
        "validate", "tests.helpers:tiny_cnn", str(pkg), "--data", DATA, "--allow-pickle", "--isa", "avx",
        "--batch-sizes", "1", "--min-iters", "2", "--min-seconds", "0.01", "--rounds", "2",
        "--max-samples", "16", "--threads", "1", "--json", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert code == 1, err
    fig = json.loads((tmp_path / "r.json").read_text())["artifacts"][0]["by_isa"]["avx"]
    assert "compiled for avx512_vnni (AVX512 AVX512_VNNI)" in fig["error"] and not fig.get("latency"), fig
    assert "FAIL: runs@avx" in " ".join(out.split())


def test_inmemory_model_runs_here_and_saves(package, tmp_path):
    import ptopt

    source = tiny_cnn().eval()
    # the package fixture's program and options, at its thread count (part of the cache key: under
    # pytest-xdist this process runs fewer threads than the CLI's subprocess): this comes from the
    # compile cache (two g++ builds fewer)
    side = json.loads(Path(str(package[0]) + ".ptopt.json").read_text())
    torch.set_num_threads(side["extra"]["compile_threads"])  # the autouse fixture restores it
    res = ptopt.export(source, "aoti", input_shapes="4x1x8x8", dynamic_batch="1:4:16", static_batches=4)
    assert "compile_cache" in res.extra
    assert list(tmp_path.iterdir()) == []  # nothing written before save
    x = torch.randn(8, 1, 8, 8)
    torch.testing.assert_close(res.model(x), source(x).detach(), atol=1e-4, rtol=1e-4)
    assert res.format == "aoti_package" and res.metrics["parity"]["passed"]
    art = res.save(tmp_path / "m.pt2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt2", "m.pt2.ptopt.json"]
    assert art.extra["compile_options"] == {"freezing": True} and art.size_bytes > 0


def _no_compiler():
    import torch._inductor.config as inductor_config

    # config.patch, not monkeypatch: undoing a monkeypatch on Inductor's config module deletes the key
    return inductor_config.patch({"cpp.cxx": (None, "ptopt-no-such-cxx")})


@pytest.mark.parametrize(
    "setup, model, match",
    [
        (_no_compiler, "tiny", ("C++ compiler", "ptopt-no-such-cxx")),
        (contextlib.nullcontext, "torchscript", ("TorchScript", "--target aoti")),
    ],
    ids=["no-compiler", "torchscript-source"],
)
def test_bad_input_refused_nothing_written(tmp_path, setup, model, match):
    import ptopt

    source = tiny_cnn().eval()
    if model == "torchscript":
        source = torch.jit.trace(source, torch.randn(2, 1, 8, 8))
    with setup():
        assert_refused(
            ptopt.export,
            source,
            "aoti",
            tmp_path / "m.pt2",
            input_shapes="2x1x8x8",
            match=match,
            where=tmp_path,
        )


def test_package_as_export_source_refused(package, tmp_path):
    import ptopt

    path, _ = package
    assert_refused(
        ptopt.export, str(path), "onnx", tmp_path / "m.onnx", allow_pickle=True,
        match="AOTInductor package", where=tmp_path,
    )  # fmt: skip


def test_load_check_in_a_child_passes_a_good_package(package, monkeypatch):
    """Under an untested torch (forced here), the package is first loaded in a child process; a good
    one then loads here and runs."""
    from ptopt.formats import aoti_files

    monkeypatch.setenv(aoti_files.LOAD_CHECK_ENV, "1")
    monkeypatch.setattr(aoti_files, "_LOADS_SAFELY", {})
    path, _ = package
    model = aoti_files.load_package(path)
    assert len(aoti_files._LOADS_SAFELY) == 1 and model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_a_loader_that_crashes_is_one_message(package, monkeypatch, cli, tmp_path):
    """torch 2.11.0+cu130 dies with SIGSEGV inside aoti_load_package (the GPU machine's image): with the
    child check, the CLI says so in one line (exit 2) instead of dying, and the API raises."""
    from ptopt.core.errors import ModelLoadError
    from ptopt.formats import aoti_files

    monkeypatch.setenv(aoti_files.LOAD_CHECK_ENV, "1")
    monkeypatch.setattr(aoti_files, "_LOADS_SAFELY", {})
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(aoti_files, "CHILD_LOAD", crash)
    monkeypatch.setattr(aoti_files, "CHILD_LOAD_CONTAINER", crash)  # the second way crashes too
    path, _ = package
    match = (
        "crashes with SIGSEGV",
        "child process",
        "model-container runner, tried next, failed too",
        "torch 2.13",
    )
    with pytest.raises(ModelLoadError, match=match[0]):
        aoti_files.load_package(path)
    args = (
        str(path),
        "--allow-pickle",
        "--data",
        DATA,
        "--max-samples",
        "16",
        "--json",
        tmp_path / "r.json",
        "-q",
    )
    assert_refused(cli, "validate", "tests.helpers:tiny_cnn", *args, match=match, where=tmp_path)


def test_where_the_package_loader_crashes_the_container_runner_loads_it(package, monkeypatch, cli, tmp_path):
    """The package loader crashing in the child check (simulated) and torch's model-container runner not:
    the package loads through that runner (``ptopt.formats.aoti_container``) and computes what torch's own
    loader computes, through the API and validate's CLI."""
    from ptopt.formats import aoti_files
    from ptopt.formats.aoti_container import ContainerModel

    monkeypatch.setenv(aoti_files.LOAD_CHECK_ENV, "1")
    monkeypatch.setattr(aoti_files, "_LOADS_SAFELY", {})
    monkeypatch.setattr(aoti_files, "CHILD_LOAD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    path, _ = package
    model = aoti_files.load_package(path)
    # the package's dynamic-batch model (its batch-4 one: test_the_container_runner_loads_every_model_...)
    assert isinstance(model.default, ContainerModel)
    assert list(aoti_files._LOADS_SAFELY.values()) == ["container"]
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(model(x), torch._inductor.aoti_load_package(str(path))(x))
    args = (str(path), "--allow-pickle", "--data", DATA, "--max-samples", "16", "--json", tmp_path / "r.json")
    code, out, err = cli(
        "validate", "tests.helpers:tiny_cnn", *args, "-q", "--batch-sizes", "1", "--min-seconds", "0.05"
    )
    assert code == 0, out + err


def test_a_loader_that_hangs_is_one_message(package, monkeypatch):
    from ptopt.core.errors import ModelLoadError
    from ptopt.formats import aoti_files

    monkeypatch.setenv(aoti_files.LOAD_CHECK_ENV, "1")
    monkeypatch.setattr(aoti_files, "_LOADS_SAFELY", {})
    monkeypatch.setattr(aoti_files, "CHILD_LOAD", "import time; time.sleep(30)")
    monkeypatch.setattr(aoti_files, "CHILD_TIMEOUT_S", 1)
    with pytest.raises(ModelLoadError, match="did not finish loading this package in 1 s"):
        aoti_files.load_package(package[0])


# --static-batch: the fixed-batch model in the package fixture's package


def test_cli_records_and_checks_each_fixed_batch(package):
    path, stdout = package
    side = json.loads(path.with_name(path.name + ".ptopt.json").read_text())
    assert side["extra"]["static_batches"] == [4]
    fixed = side["metrics"]["parity"]["static_batches"]
    assert list(fixed) == ["4"] and fixed["4"]["passed"] and fixed["4"]["cosine"] > 0.9999
    assert "fixed:   batch-size models 4 (cosine" in stdout
    from ptopt.formats.aoti_files import package_models

    assert package_models(path) == ["batch_4", "model"]


def test_loader_runs_a_batch_of_four_on_the_fixed_model(package):
    from ptopt.formats.aoti_files import FixedBatchDispatch, load_package

    path, _ = package
    model = load_package(path)
    assert isinstance(model, FixedBatchDispatch) and set(model.fixed) == {4}
    calls = []
    fixed = model.fixed[4]
    model.fixed[4] = lambda *a: calls.append(a[0].shape[0]) or fixed(*a)
    src = tiny_cnn().eval()
    for b in (3, 4, 8):
        x = torch.randn(b, 1, 8, 8, generator=torch.Generator().manual_seed(b))
        with torch.no_grad():
            torch.testing.assert_close(model(x), src(x), rtol=1e-4, atol=1e-5)
    assert calls == [4]  # only the batch of 4 ran on the fixed-batch model


def test_plain_torch_loads_the_dynamic_model_and_the_fixed_one_by_name(package):
    from torch._inductor.package import load_package

    path, _ = package
    dynamic = torch._inductor.aoti_load_package(str(path))
    assert dynamic(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    assert load_package(str(path), "batch_4")(torch.randn(4, 1, 8, 8)).shape == (4, 10)


def test_the_child_load_check_loads_every_model_of_the_package(package, monkeypatch, tmp_path):
    """Under an untested torch the child process loads the default model and each fixed-batch one: it is
    given their names (here it only records its arguments)."""
    from ptopt.formats import aoti_files

    record = tmp_path / "argv.txt"
    monkeypatch.setenv(aoti_files.LOAD_CHECK_ENV, "1")
    monkeypatch.setattr(aoti_files, "_LOADS_SAFELY", {})
    script = f"import sys, pathlib; pathlib.Path({str(record)!r}).write_text(' '.join(sys.argv[1:]))"
    monkeypatch.setattr(aoti_files, "CHILD_LOAD", script)
    path, _ = package
    aoti_files.check_loads_in_child(path, -1)
    assert record.read_text() == f"{path} -1 batch_4" and len(aoti_files._LOADS_SAFELY) == 1


def test_the_container_runner_loads_every_model_of_the_package(package, monkeypatch):
    """``PTOPT_AOTI_LOADER=container``: the dynamic model and the fixed-batch one run through torch's
    model-container runner, each the same as through torch's package loader."""
    from ptopt.formats import aoti_files
    from ptopt.formats.aoti_container import ContainerModel

    monkeypatch.setenv(aoti_files.LOADER_ENV, "container")
    path, _ = package
    model = aoti_files.load_package(path)
    assert isinstance(model.default, ContainerModel) and set(model.fixed) == {4}
    for batch in (4, 5):
        x = torch.randn(batch, 1, 8, 8)
        torch.testing.assert_close(model(x), torch._inductor.aoti_load_package(str(path))(x))


def test_handler_dispatches_by_batch():
    from ptopt.serve.handler import _by_batch

    run = _by_batch(lambda x: ("dynamic", x.shape[0]), {4: lambda x: ("fixed", x.shape[0])})
    assert run(torch.zeros(4, 2)) == ("fixed", 4) and run(torch.zeros(3, 2)) == ("dynamic", 3)
    assert run(x=torch.zeros(4, 2)) == ("fixed", 4)


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--static-batch", "16"], ("--static-batch 16", "[1, 8]")),
        (["--static-batch", "two"], ("--static-batch: 'two' is not a whole number",)),
        (["--static-batch", "0"], ("positive",)),
    ],
    ids=["outside-range", "not-a-number", "zero"],
)
def test_bad_static_batches_refused(cli, tmp_path, extra, match):
    args = ["export", "tests.helpers:tiny_cnn", "--target", "aoti", "--dynamic-batch", "1:2:8"]
    assert_refused(cli, *args, *extra, "-o", tmp_path / "m.pt2", match=match, where=tmp_path)


def test_static_batch_is_for_aoti_only(tmp_path):
    import ptopt

    assert_refused(
        ptopt.export,
        tiny_cnn(),
        "onnx",
        tmp_path / "m.onnx",
        input_shapes="2x1x8x8",
        static_batches="4",
        match=("--static-batch applies to --target aoti",),
        where=tmp_path,
    )


def test_bf16_package_checks_its_fixed_batch_in_bf16(tmp_path):
    """AOTInductor compiles the bf16 programs for this CPU (the suite's one bf16 package: it also
    stands for ``--precision bf16 --target aoti`` in tests/export/test_export_half.py)."""
    import ptopt

    res = ptopt.export(
        tiny_cnn(), "aoti", tmp_path / "h.pt2", input_shapes="2x1x8x8", dynamic_batch="1:2:8",
        static_batches=4, precision="bf16",
    )  # fmt: skip
    side = json.loads((tmp_path / "h.pt2.ptopt.json").read_text())
    assert side["precision"] == "bf16" and side["inputs"][0]["dtype"] == "bfloat16"
    assert side["metrics"]["parity"]["passed"] and res.extra["device"] == "cpu"
    assert res.metrics["parity"]["static_batches"]["4"]["passed"]
    assert res.model(torch.randn(4, 1, 8, 8).bfloat16()).dtype == torch.bfloat16


def test_static_batch_options_compare_as_sets_of_sizes():
    from ptopt.export.config import ExportConfig, settle_config

    assert ExportConfig(target="aoti", static_batches=4).static_batches == (4,)
    config = ExportConfig(target="aoti", static_batches="32,1")
    assert (
        settle_config(None, config, {"static_batches": [1, 32]}) is not None
    )  # the same sizes: no contradiction


def test_dispatch_copes_with_scalars_and_copies():
    import copy

    from ptopt.formats.aoti_files import FixedBatchDispatch, static_model_batch, static_model_name

    assert static_model_batch(static_model_name(32)) == 32
    assert static_model_batch("batch_x") is None and static_model_batch("model") is None
    d = FixedBatchDispatch(lambda *a: "dynamic", {2: lambda *a: "fixed"})
    assert d(torch.tensor(1.0), torch.zeros(2, 3)) == "fixed"  # a 0-d tensor has no batch: skipped
    assert d(torch.tensor(1.0)) == "dynamic"
    assert copy.copy(d)(torch.zeros(2, 3)) == "fixed"


def test_torchserve_handler_agrees_with_the_format_table(package):
    """The TorchServe handler keeps a self-contained copy of the loaders (it runs without ptopt): it
    loads exactly the formats the table says TorchServe serves, names fixed-batch models as the
    AOTInductor row does, and its package loader gives the row's outputs, batch for batch."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.formats import get_format
    from ptopt.formats.aoti_files import static_model_batch, static_model_name
    from ptopt.serve import handler
    from ptopt.serve.package import servable_formats

    assert set(handler.LOADED_FORMATS) == set(servable_formats("mar"))
    assert all(handler.STATIC_MODEL.format(b) == static_model_name(b) for b in (1, 4, 32))
    assert static_model_batch(handler.STATIC_MODEL.format(7)) == 7
    path, _ = package
    meta = Artifact.load(path).to_dict()
    ours = handler._load_torch(str(path), "aoti_package", meta)
    table = get_format("aoti_package").reload(path)
    for b in (3, 4):
        x = torch.randn(b, 1, 8, 8, generator=torch.Generator().manual_seed(b))
        with torch.no_grad():
            torch.testing.assert_close(ours(x), table(x), rtol=0, atol=0)
