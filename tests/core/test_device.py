"""``ptopt.core.device``: the one parser of --device, moving/casting batches, and the device-aware
timer (CUDA events on a GPU, host time on the CPU). CUDA itself is faked where a test needs it."""

from __future__ import annotations

import pytest
import torch

from ptopt.core import timing
from ptopt.core.device import half_specs, resolve_device, to_device, to_host
from ptopt.core.errors import UsageError
from ptopt.core.inputspec import InputSpec
from tests.helpers import assert_refused

needs_no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal where CUDA is absent"
)


@pytest.mark.parametrize(
    "spec, want", [(None, "cpu"), ("cpu", "cpu"), (" CPU ", "cpu"), (torch.device("cpu"), "cpu")]
)
def test_cpu_specs(spec, want):
    assert resolve_device(spec) == torch.device(want)


@needs_no_cuda
def test_auto_is_cpu_without_cuda():
    assert resolve_device("auto") == torch.device("cpu")
    assert_refused(resolve_device, "auto", allow_auto=False, match="unknown device 'auto'", error=UsageError)


@needs_no_cuda
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_says_what_torch_sees(spec):
    built = "built with CUDA" if torch.version.cuda else "built without CUDA"
    assert_refused(
        resolve_device,
        spec,
        match=(f"device '{spec}'", "torch.cuda.is_available() is False", built, "use --device cpu"),
        error=UsageError,
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tpu", "unknown device 'tpu'"),
        ("gpu0", "unknown device 'gpu0'"),
        ("meta", "runs models on cpu or cuda"),
    ],
    ids=["tpu", "gpu0", "meta"],
)
def test_unknown_device_strings(spec, message):
    assert_refused(resolve_device, spec, match=message, error=UsageError)


def test_index_that_does_not_exist(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert_refused(
        resolve_device, "cuda:2", match=("no such GPU", "2 CUDA device(s) (cuda:0, cuda:1)"), error=UsageError
    )


def test_to_device_casts_floats_only_and_to_host_gives_float32():
    x = {"ids": torch.arange(4).view(2, 2), "x": torch.randn(2, 3)}
    y = to_device(x, "cpu", torch.bfloat16)
    assert y["ids"].dtype == torch.int64 and y["x"].dtype == torch.bfloat16
    out = to_host((y["x"], [y["ids"]]))
    assert out[0].dtype == torch.float32 and out[1][0].dtype == torch.int64


def test_half_specs_keep_integer_inputs():
    specs = [InputSpec.static("x", (1, 3), "float32"), InputSpec.static("ids", (1, 3), "int64")]
    assert [s.dtype for s in half_specs(specs, "bf16")] == ["bfloat16", "int64"]
    assert [s.dtype for s in half_specs(specs, "fp16")] == ["float16", "int64"]
    assert half_specs(specs, "fp32") == specs


class _FakeEvent:
    """Stands in for torch.cuda.Event(enable_timing=True): a clock that advances 2.5 ms per call."""

    log: list[str] = []
    clock = 0.0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.t = None

    def record(self, stream=None):
        _FakeEvent.clock += 2.5
        self.t = _FakeEvent.clock
        _FakeEvent.log.append("record")

    def synchronize(self):
        _FakeEvent.log.append("event.synchronize")

    def elapsed_time(self, end):
        return end.t - self.t


@pytest.fixture
def fake_cuda(monkeypatch):
    import contextlib

    _FakeEvent.log, _FakeEvent.clock = [], 0.0
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: _FakeEvent.log.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    return _FakeEvent.log


def test_cuda_timer_times_with_events_not_host_clock(fake_cuda):
    calls = []
    stats = timing.measure_latency(
        lambda: calls.append(1), min_iters=4, min_seconds=0, warmup_iters=2, warmup_seconds=0, device="cuda:0"
    )
    # each sample: start event, the call, end event, wait for the end event; its time is the events'
    assert stats["p50_ms"] == pytest.approx(2.5) and stats["iterations"] == 4
    assert fake_cuda[0] == "synchronize"  # the warm-up's queued work is waited for first
    assert fake_cuda[1:4] == ["record", "record", "event.synchronize"]
    assert len(calls) == 6


def test_interleaved_uses_each_keys_timer(fake_cuda):
    stats = timing.measure_interleaved(
        {"gpu": lambda: None, "cpu": lambda: None},
        rounds=2,
        min_iters=2,
        min_seconds=0,
        warmup_iters=1,
        warmup_seconds=0,
        devices={"gpu": torch.device("cuda", 0)},
    )
    assert stats["gpu"]["timer"] == "cuda_events" and stats["gpu"]["p50_ms"] == pytest.approx(2.5)
    assert stats["cpu"]["timer"] == "host" and stats["cpu"]["p50_ms"] < 2.5
