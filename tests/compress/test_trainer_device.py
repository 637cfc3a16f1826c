"""The trainer's --device goes through ``ptopt.core.device.resolve_device`` (one parser for every
stage); under torchrun a plain ``cuda`` is the rank's own GPU."""

from __future__ import annotations

import pytest
import torch

from ptopt.compress import distributed
from ptopt.core.errors import UsageError
from tests.helpers import assert_refused


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_trainer_devices_are_checked_by_core(monkeypatch):
    assert distributed.resolve_device("auto") == torch.device("cpu")
    assert_refused(
        distributed.resolve_device, "cuda", match="torch.cuda.is_available() is False", error=UsageError
    )
    assert_refused(distributed.resolve_device, "tpu", match="unknown device 'tpu'", error=UsageError)


def test_torchrun_rank_picks_its_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.resolve_device("cuda") == torch.device("cuda", 1)
    assert distributed.resolve_device("cuda:0") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "2")  # more ranks than GPUs: the core check names what torch sees
    assert_refused(distributed.resolve_device, "cuda", match="no such GPU", error=UsageError)
