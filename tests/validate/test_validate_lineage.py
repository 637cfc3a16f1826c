"""Lineage: an artifact made from another model than the reference (its sidecar's parent chain never
meets the reference's) is flagged in every report, never ranked best, and fails ``--strict-lineage``;
artifacts made from the reference (directly or through another artifact) and siblings are not."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

import ptopt
from ptopt.core.artifact import Artifact
from ptopt.core.modelref import load_model
from ptopt.validate.lineage import lineage
from tests.validate.conftest import FACTORY, FAST, _specs

OTHER = "tests.validate.test_validate_lineage:other_cnn"


def other_cnn() -> torch.nn.Module:
    """Another model taking the same inputs (a different seed and width)."""
    from tests.helpers import TinyCNN

    torch.manual_seed(1)
    return TinyCNN(width=4)


def _torchscript(path, ref, parent=None):
    """A TorchScript artifact of MODEL ``ref`` whose sidecar names ``parent`` (default: ``ref``'s record)."""
    lm = load_model(ref)
    traced = torch.jit.trace(lm.module.eval(), torch.randn(2, 1, 8, 8))
    torch.jit.save(traced, str(path))
    Artifact(path, "torchscript", _specs(), parent=parent or lm.parent_record()).finalize()
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("lineage")
    mine = _torchscript(d / "mine.pt", FACTORY)
    return {
        "mine": mine,
        # made from mine.pt: its chain is mine.pt -> the factory
        "grandchild": _torchscript(
            d / "grandchild.pt", FACTORY, parent={"path": str(mine), "format": "torchscript"}
        ),
        "sibling": _torchscript(d / "sibling.pt", FACTORY),
        "other": _torchscript(d / "other.pt", OTHER),
        "dir": d,
    }


@pytest.mark.parametrize(
    "artifact, reference, verdict",
    [
        ("mine", FACTORY, "descends"),
        ("grandchild", FACTORY, "descends"),
        ("grandchild", "mine", "descends"),
        ("sibling", "mine", "related"),
        ("other", FACTORY, "other"),
        ("other", "mine", "other"),
    ],
    ids=["child", "grandchild", "grandchild-of-file", "sibling", "other-model", "other-vs-file"],
)
def test_verdicts(made, artifact, reference, verdict):
    art = Artifact.load(made[artifact])
    ref = made.get(reference, reference)
    assert lineage(art.parent, made[artifact], ref)["verdict"] == verdict


def test_weights_and_memory_and_missing_parents(made, tmp_path):
    art = Artifact.load(made["mine"])
    weights = tmp_path / "w.pt"
    torch.save(load_model(FACTORY).module.state_dict(), weights)
    # the same factory with other weights is another model; in memory nothing can be said
    assert lineage(art.parent, made["mine"], FACTORY, weights)["verdict"] == "other"
    assert lineage(art.parent, made["mine"], torch.nn.Linear(2, 2))["verdict"] == "unknown"
    gone = lineage({"path": str(tmp_path / "gone.pt"), "sha256": "0" * 64}, made["mine"], FACTORY)
    assert gone["verdict"] == "unknown" and "is not here" in gone["why"]


def test_every_report_flags_another_models_artifact_and_strict_fails_it(cli, made, tmp_path, digits_small):
    reports = {"--json": "r.json", "--junit": "r.xml", "--markdown": "r.md", "--report": "r.html"}
    args = [f for k, v in reports.items() for f in (k, tmp_path / v)]
    common = ("--data", "builtin:digits:test", "--batch-sizes", "1", "--max-samples", "40", *FAST)
    code, out, err = cli("validate", FACTORY, made["mine"], made["other"], *common, *args)
    assert code == 0, err
    flag = "lineage: other.pt was made from " + OTHER
    assert flag in out and "≠" in out and "not from the reference tests.helpers:tiny_cnn" in out
    data = json.loads((tmp_path / "r.json").read_text())
    by_name = {e["name"]: e for e in data["artifacts"]}
    assert (
        by_name["other.pt"]["lineage"]["verdict"] == "other"
        and by_name["mine.pt"]["lineage"]["verdict"] == "descends"
    )
    assert data["best"] != "other.pt" and any(flag in n for n in data["notes"])
    for report in ("r.md", "r.html"):
        assert flag in (tmp_path / report).read_text(), report
    case = ET.parse(tmp_path / "r.xml").find(".//testcase[@name='lineage']")
    assert case is not None and case.get("classname").endswith("other.pt") and case.find("failure") is None

    strict = ("--strict-lineage", "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml")
    code, out, err = cli("validate", FACTORY, made["other"], *common, *strict)
    assert code == 1 and "other.pt: lineage: made from " + OTHER in err
    assert ET.parse(tmp_path / "r.xml").find(".//testcase[@name='lineage']/failure") is not None
    assert json.loads((tmp_path / "r.json").read_text())["gates"]["strict_lineage"] is True


def test_python_api_strict_lineage(made):
    args = (FACTORY, [made["grandchild"], made["other"]], "builtin:digits:test")
    fast = dict(batch_sizes=[1], max_samples=40, min_iters=3, min_seconds=0.01, rounds=2)
    res = ptopt.validate(*args, strict_lineage=True, **fast)
    assert not res.passed and [g["artifact"] for g in res.failed_gates] == ["other.pt"]
    assert {e["name"]: e["lineage"]["verdict"] for e in res.entries} == {
        "grandchild.pt": "descends",
        "other.pt": "other",
    }
    assert res.best == "grandchild.pt"
