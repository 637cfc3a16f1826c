"""No code runs from a model file without --allow-pickle.

The crafted files are real: a tiny CNN exported with ``torch.export.save``, then one part replaced by
a payload that creates a marker file when torch loads it (``open(marker, "w")`` from a pickle's
``__reduce__``, or ``Path(marker).touch()`` in a shape expression that sympy evaluates). A test
proves each payload really runs under plain ``torch.export.load``; the others prove ptopt refuses the
file before torch reads it, so the marker is never created.
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from ptopt.core.errors import ModelLoadError, UnsafePickleError
from ptopt.core.modelref import load_model
from ptopt.core.safety import check_model_file, pickle_globals, quiet_upstream, safe_shape_expression
from tests.helpers import assert_refused, tiny_cnn


class _CreatesFile:
    """Unpickling this calls ``open(marker, "w")``: code chosen by the file, not by the loader."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _torch_save_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def good_pt2(tmp_path_factory) -> Path:
    model = tiny_cnn().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (model.example_inputs(2),), dynamic_shapes={"x": {0: batch}})
    path = tmp_path_factory.mktemp("pt2") / "good.pt2"
    torch.export.save(ep, str(path))
    return path


def _rewrite(src: Path, dst: Path, edit) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = edit(info.filename.split("/", 1)[1], zin.read(info))
            if data is not None:
                zout.writestr(info, data)
    return dst


def _edit_weight(marker: Path, good_pt2: Path):
    with zipfile.ZipFile(good_pt2) as z:
        root = z.namelist()[0].split("/", 1)[0]
        cfg = json.loads(z.read(f"{root}/data/weights/model_weights_config.json"))
    target = cfg["config"]["fc.bias"]["path_name"]

    def edit(name: str, data: bytes) -> bytes:
        if name == "data/weights/model_weights_config.json":
            cfg["config"]["fc.bias"]["use_pickle"] = True
            return json.dumps(cfg).encode()
        if name == f"data/weights/{target}":
            return _torch_save_bytes(_CreatesFile(marker))
        return data

    return edit


def _edit_sample_inputs(marker: Path, good_pt2: Path):
    def edit(name: str, data: bytes) -> bytes:
        # torch reads these with weights_only=True and, when that fails, again without it
        return _torch_save_bytes(_CreatesFile(marker)) if name.startswith("data/sample_inputs/") else data

    return edit


def _edit_shape_expression(marker: Path, good_pt2: Path):
    def edit(name: str, data: bytes) -> bytes:
        if name != "models/model.json":
            return data
        doc = json.loads(data)
        size = doc["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0]["as_expr"]
        size["expr_str"] = f"__import__('pathlib').Path({str(marker)!r}).touch() or s0"
        return json.dumps(doc).encode()

    return edit


CRAFTED = {
    "pickled-weight": _edit_weight,
    "pickled-sample-inputs": _edit_sample_inputs,
    "eval-in-shape": _edit_shape_expression,
}


@pytest.fixture(params=sorted(CRAFTED), ids=sorted(CRAFTED))
def crafted(request, good_pt2, tmp_path) -> tuple[Path, Path]:
    """(a .pt2 that runs code when torch loads it, the marker file that code would create)."""
    marker = tmp_path / "marker" / "code-ran"
    marker.parent.mkdir()
    path = _rewrite(good_pt2, tmp_path / f"{request.param}.pt2", CRAFTED[request.param](marker, good_pt2))
    return path, marker


def test_the_crafted_files_really_run_code_under_plain_torch(crafted):
    path, marker = crafted
    with pytest.raises(Exception), quiet_upstream():  # noqa: B017, PT011 - torch fails after the payload ran
        torch.export.load(str(path))
    assert marker.exists(), "the fixture is not malicious: the refusal tests below would prove nothing"


def test_python_loader_refuses_before_torch_reads_the_file(crafted, tmp_path):
    path, marker = crafted
    assert_refused(load_model, path, match=("refusing to load", "--allow-pickle"), error=UnsafePickleError)
    assert not marker.exists()


@pytest.mark.parametrize(
    "command",
    [
        ("inspect", "{model}"),
        ("quantize", "{model}", "--mode", "dynamic", "-o", "out.pt"),
        ("validate", "{model}", "{model}", "--data", "builtin:digits:test", "--json", "v.json"),
        ("export", "{model}", "--target", "onnx", "-o", "out.onnx"),
    ],
    ids=["inspect", "quantize", "validate", "export"],
)
def test_cli_refuses_crafted_pt2(cli, crafted, command):
    path, marker = crafted
    args = [a.format(model=path) for a in command]
    if command[0] == "validate":  # validate says "checking MODEL" on stderr before it loads it
        code, _, err = cli(*args)
        assert code == 2 and "Traceback" not in err, err
        assert "refusing to load" in err.splitlines()[-1] and "--allow-pickle" in err, err
        assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, "marker"])
    else:
        assert_refused(cli, *args, match=("refusing to load", "--allow-pickle"), where=path.parent)
    assert not marker.exists()


def test_tampered_sidecar_parent_is_checked_too(cli, good_pt2, tmp_path):
    """``export int8.pt --target onnx`` loads the fp32 parent its sidecar names: the same check applies."""
    from ptopt.core.artifact import Artifact
    from ptopt.core.inputspec import specs_from_example

    marker = tmp_path / "marker"
    evil = _rewrite(good_pt2, tmp_path / "parent.pt2", _edit_weight(marker, good_pt2))
    model = tiny_cnn().eval()
    int8 = tmp_path / "model.int8.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(model, model.example_inputs(2)).save(str(int8))
    Artifact(
        int8,
        "torchscript",
        inputs=specs_from_example(model.example_inputs(2)),
        precision="int8",
        config={"calib_data": "builtin:digits:train"},
        parent={"path": str(evil), "sha256": "0" * 64},
    ).finalize()
    assert_refused(
        cli,
        "export",
        int8,
        "--target",
        "onnx",
        "-o",
        tmp_path / "out.onnx",
        match=("parent", "--allow-pickle"),
    )
    assert not marker.exists()


def test_allow_pickle_is_the_only_way_through(crafted, good_pt2):
    path, marker = crafted
    check_model_file(path, allow_pickle=True)  # the user vouches for the file: not checked
    assert not marker.exists()
    x = tiny_cnn().example_inputs(3)
    want = tiny_cnn().eval()(x)
    for allow in (False, True):  # a normal file loads either way and computes the same thing
        loaded = load_model(good_pt2, allow_pickle=allow)
        assert loaded.format == "exported_program"
        torch.testing.assert_close(loaded.module(x), want)


def test_other_code_bearing_archives_are_refused(good_pt2, tmp_path):
    aoti = _rewrite(good_pt2, tmp_path / "aoti.pt2", lambda n, d: d)
    with zipfile.ZipFile(aoti, "a") as z:  # what aoti_compile_and_package adds: a shared library
        z.writestr(z.namelist()[0].split("/")[0] + "/data/aotinductor/model/model.so", b"\x7fELF")
    assert_refused(check_model_file, aoti, match=("AOTInductor", "native code", "--allow-pickle"))

    twice = _rewrite(good_pt2, tmp_path / "twice.pt2", lambda n, d: d)
    with warnings.catch_warnings(), zipfile.ZipFile(twice, "a") as z:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name: that is the point
        z.writestr(z.namelist()[0].split("/")[0] + "/models/model.json", b"{}")
    assert_refused(check_model_file, twice, match="twice")

    opaque = _rewrite(
        good_pt2,
        tmp_path / "opaque.pt2",
        lambda n, d: (
            json.dumps({"config": {"c": {"path_name": "opaque_obj_0", "use_pickle": False}}}).encode()
            if n == "data/constants/model_constants_config.json"
            else d
        ),
    )
    assert_refused(
        check_model_file, opaque, match=("opaque_obj_0", "--allow-pickle"), error=UnsafePickleError
    )


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\x00garbage\xff" * 500, "not a .pt2 archive (not a zip file)"),
        ("zip-not-pt2", "not a .pt2 archive (no models/*.json"),
        ("corrupt-json", "not a loadable ExportedProgram"),
    ],
    ids=["random-bytes", "zip-not-pt2", "corrupt-program"],
)
@pytest.mark.parametrize("runner", ["cli", "run_ptopt"])
def test_inspect_of_a_broken_pt2_prints_one_line(request, runner, good_pt2, tmp_path, content, match):
    path = tmp_path / "broken.pt2"
    if content == "zip-not-pt2":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("a.txt", "hello")
    elif content == "corrupt-json":
        _rewrite(good_pt2, path, lambda n, d: b"{not json" if n == "models/model.json" else d)
    else:
        path.write_bytes(content)
    assert_refused(request.getfixturevalue(runner), "inspect", path, match=match, where=tmp_path)


def test_torchscript_unpickler_resolves_no_python(tmp_path):
    """Why TorchScript archives need no check: a ``data.pkl`` naming ``io.open`` does not load."""
    marker = tmp_path / "marker"
    model = tiny_cnn().eval()
    good = tmp_path / "good.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(model).save(str(good))
    evil = _rewrite(
        good,
        tmp_path / "evil.pt",
        lambda n, d: pickle.dumps(_CreatesFile(marker), protocol=2) if n == "data.pkl" else d,
    )
    assert_refused(load_model, evil, match="corrupt TorchScript archive", error=ModelLoadError)
    assert not marker.exists()


def _p(obj, protocol):
    return pickle.dumps(obj, protocol=protocol)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_pickle_globals_sees_every_import(protocol, tmp_path):
    from collections import OrderedDict

    got = list(pickle_globals(_p(OrderedDict(a=1), protocol)))
    assert got == [("collections", "OrderedDict")]
    got = list(pickle_globals(_p(_CreatesFile(tmp_path / "m"), protocol)))
    assert ("io", "open") in got
    assert list(pickle_globals(_p({"a": [1, 2.0, "x", b"y"]}, 4))) == []


def test_pickle_globals_unknown_stack_global_is_none():
    # STACK_GLOBAL whose names come from a non-string memo slot: not knowable statically
    crafted = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00K\x01\x94h\x00h\x00\x93."
    assert None in list(pickle_globals(crafted))
    assert list(pickle_globals(b"not a pickle")) == [None]


@pytest.mark.parametrize(
    "expr, ok",
    [
        ("Symbol('s77', positive=True, integer=True)", True),
        (
            "Max(Integer(2), Add(Mul(Integer(2), Symbol('s39', positive=True, integer=True)), Integer(-1)))",
            True,
        ),
        ("FloorDiv(s0, 2) + Mod(u1, 3) * 4 >= 0", True),
        ("oo", True),
        ("__import__('os').system('true')", False),
        ("s0.__class__", False),
        ("Symbol('s0').__class__", False),
        ("(lambda: 0)()", False),
        ("[s0][0]", False),
        ("open('x')", False),
        ("Integer('1') + s0", False),
        ("Symbol('__import__')", False),
        ("exec", False),
        ("Symbol(**{'name': 's0'})", False),
        ("s0; s1", False),
    ],
)
def test_safe_shape_expression(expr, ok):
    assert safe_shape_expression(expr) is ok
