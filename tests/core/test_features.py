"""Optional features report only what is true of this install."""

from __future__ import annotations

import pytest

from ptopt.core import features


@pytest.mark.parametrize(
    "version,available,says",
    [("0.18.0", True, "installed; no ptopt technique uses it yet"), (None, False, "not installed")],
    ids=["installed", "missing"],
)
def test_torchao_claims_no_engine_that_nothing_uses(monkeypatch, version, available, says):
    monkeypatch.setattr(features, "package_version", lambda name: version if name == "torchao" else None)
    f = features.check_torchao()
    assert (f.available, f.version) == (available, version) and says in f.detail
    assert "PT2E" not in f.detail and "engine available" not in f.detail
    assert f.fix == ("" if available else "pip install 'ptopt[torchao]'")
