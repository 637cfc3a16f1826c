"""Every config round-trips through its dict form (JSON and YAML, as sidecars and recipes carry it),
and a bad config dict is a UsageError naming what is wrong."""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil

import pytest
import yaml

from ptopt.core.config import Config, config_from_dict, register_config
from ptopt.core.errors import UsageError
from tests.helpers import assert_refused

STAGES = ("core", "compress", "export", "validate", "serve", "models")


def _all_configs() -> list[type[Config]]:
    """Every concrete config class in ptopt: import every module, then walk Config's subclasses.
    A class with subclasses is a shared base (QuantConfig, PruneConfig), not a technique's config."""
    for stage in STAGES:
        pkg = importlib.import_module(f"ptopt.{stage}")
        for info in pkgutil.walk_packages(pkg.__path__, f"ptopt.{stage}."):
            importlib.import_module(info.name)
    found, todo = [], [Config]
    while todo:
        cls = todo.pop()
        subs = cls.__subclasses__()
        todo += subs
        if not subs and cls is not Config and not cls.__module__.startswith("tests."):
            found.append(cls)
    return sorted(found, key=lambda c: c.type_name)


CONFIGS = _all_configs()


def test_the_walk_finds_every_technique():
    names = {c.type_name for c in CONFIGS}
    assert names >= {"train", "distill", "export", "quantize-static", "quantize-dynamic", "quantize-qat"}
    assert names >= {"prune-l1-unstructured", "prune-global", "prune-structured", "accuracy-goal"}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.type_name)
def test_config_round_trips(cls):
    config = cls()
    data = config.to_dict()
    assert data["type"] == cls.type_name
    assert config_from_dict(data) == config
    assert config_from_dict(json.loads(json.dumps(data))) == config  # a sidecar
    assert config_from_dict(yaml.safe_load(yaml.safe_dump(data))) == config  # a recipe step


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.type_name)
def test_config_is_frozen(cls):
    field = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cls(), field, None)


@dataclasses.dataclass(frozen=True)
class _Probe(Config):
    type_name = "test-probe"
    size: int = 1
    shape: tuple[int, ...] = (1, 2)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")


register_config(_Probe)


def test_lists_become_tuples_on_the_way_back():
    assert config_from_dict({"type": "test-probe", "shape": [3, 4]}) == _Probe(shape=(3, 4))


def test_registering_another_class_under_a_taken_name_is_an_error():
    other = dataclasses.make_dataclass("Other", [], bases=(Config,), frozen=True)
    other.type_name = "test-probe"
    with pytest.raises(RuntimeError, match="registered twice"):
        register_config(other)


@pytest.mark.parametrize(
    "data,match",
    [
        (["type", "train"], "a config must be a mapping with a 'type' key"),
        ({"epochs": 2}, "a config must be a mapping with a 'type' key"),
        ({"type": "nope"}, "unknown config type 'nope' (known: "),
        (
            {"type": "test-probe", "colour": "red"},
            "config 'test-probe' has no option(s) colour; it takes size",
        ),
        ({"type": "test-probe", "size": 0}, "config 'test-probe': size must be >= 1, got 0"),
    ],
    ids=["not-a-mapping", "no-type", "unknown-type", "unknown-field", "invalid-value"],
)
def test_bad_config_dicts_are_refused(tmp_path, data, match):
    assert_refused(config_from_dict, data, match=match, where=tmp_path, error=UsageError)
