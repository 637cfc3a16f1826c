"""Optional features report only what is true of this install."""

from __future__ import annotations

import pytest

from ptopt.core import features


@pytest.mark.parametrize(
    "version,available,says",
    [("0.18.0", True, "quantize --engine pt2e"), (None, False, "not installed")],
    ids=["installed", "missing"],
)
def test_torchao_names_the_engine_that_uses_it(monkeypatch, version, available, says):
    monkeypatch.setattr(features, "package_version", lambda name: version if name == "torchao" else None)
    f = features.check_torchao()
    assert (f.available, f.version) == (available, version) and says in f.detail
    assert "--engine pt2e" in f.detail  # the one place that uses it: compress/quantize/engine_pt2e.py
    assert f.fix == ("" if available else "pip install 'ptopt[torchao]'")
