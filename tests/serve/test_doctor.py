"""``ptopt doctor`` reports what serving needs: Java and TorchServe."""

from __future__ import annotations

import json

import pytest

from ptopt.core.features import _java_major


@pytest.mark.parametrize(
    "line, major",
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_402"', 8),
        ('openjdk version "11" 2018-09-25', 11),
    ],
)
def test_java_major(line, major):
    assert _java_major(line) == major


def test_doctor_reports_java_and_torchserve(cli):
    code, stdout, _ = cli("doctor", "--json")
    assert code == 0
    features = json.loads(stdout)["features"]
    for name in ("java", "torchserve"):
        f = features[name]
        assert f["available"] or f["fix"], f  # available, or says how to get it
