"""An output whose suffix is not what the command writes is refused before any work, from the CLI and the
Python API alike, and the message points to the file name or the command that does what was asked
(``export --target onnx -o out.pt`` once wrote ONNX into a ``.pt``, exit 0)."""

from __future__ import annotations

import pytest

import ptopt
from ptopt.core.errors import UsageError
from tests.helpers import assert_refused, tiny_cnn

FACTORY = "tests.helpers:tiny_cnn"

CASES = [
    (
        ("export", FACTORY, "--target", "onnx"),
        lambda out: ptopt.export(tiny_cnn(), "onnx", output=out),
        "out.pt",
        ("an ONNX file is named .onnx", "use "),
    ),
    (
        ("export", FACTORY, "--target", "torchscript"),
        lambda out: ptopt.export(tiny_cnn(), "torchscript", output=out),
        "out.onnx",
        ("file is named .pt",),
    ),
    (
        ("quantize", FACTORY, "--mode", "dynamic"),
        lambda out: ptopt.quantize(tiny_cnn(), "dynamic", output=out),
        "x.onnx",
        ("quantize writes int8 TorchScript (.pt)", "ptopt export MODEL --target onnx --precision int8"),
    ),
]


@pytest.mark.parametrize(
    "args, twin, name, match", CASES, ids=["onnx-as-pt", "torchscript-as-onnx", "quantize-onnx"]
)
def test_a_suffix_that_does_not_match_is_refused(cli, tmp_path, args, twin, name, match):
    out = tmp_path / name
    assert_refused(cli, *args, "-o", out, match=match, where=tmp_path)
    assert_refused(lambda: twin(out), match=match, where=tmp_path, error=UsageError)
