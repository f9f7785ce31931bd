"""The device timer (``runtime/timer.py``): perf_counter off CUDA; on CUDA, events and
synchronisation, so a figure is the device's work and not its kernel launches. No GPU
here: the CUDA path runs against recording stand-ins for ``torch.cuda``'s calls."""

import time

import pytest
import torch

from megatron_mm.runtime import timer as timer_module
from megatron_mm.runtime.timer import DeviceTimer, device_clock


@pytest.fixture
def cuda_calls(monkeypatch):
    """torch.cuda's event, stream and synchronize calls, recorded in order."""
    calls = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.id = sum(1 for c in calls if c[0] == "event")
            calls.append(("event", self.id))

        def record(self, stream):
            calls.append(("record", self.id, stream))

        def synchronize(self):
            calls.append(("event.synchronize", self.id))

        def elapsed_time(self, end):
            calls.append(("elapsed_time", self.id, end.id))
            return 250.0  # milliseconds, as CUDA reports them

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: f"stream of {device}")
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: calls.append(("synchronize", str(device))))
    return calls


def test_cuda_interval_is_timed_by_events_and_waits_for_the_end(cuda_calls):
    timer = DeviceTimer("cuda:1").start()
    assert cuda_calls == [("event", 0), ("record", 0, "stream of cuda:1")]
    assert timer.stop() == 0.25
    assert cuda_calls[2:] == [("event", 1), ("record", 1, "stream of cuda:1"),
                              ("event.synchronize", 1), ("elapsed_time", 0, 1)]


def test_cuda_timestamp_waits_for_the_device(cuda_calls, monkeypatch):
    monkeypatch.setattr(timer_module.time, "perf_counter",
                        lambda: cuda_calls.append(("perf_counter",)) or 7.0)
    assert device_clock(torch.device("cuda", 0)) == 7.0
    assert cuda_calls == [("synchronize", "cuda:0"), ("perf_counter",)]


def test_cpu_uses_perf_counter_and_never_touches_cuda(cuda_calls):
    timer = DeviceTimer("cpu").start()
    time.sleep(0.02)
    assert timer.stop() >= 0.02
    device_clock("cpu")
    device_clock(None)
    assert cuda_calls == []
    with pytest.raises(AssertionError, match="before start"):
        timer.stop()
