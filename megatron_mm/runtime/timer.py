"""Timers whose figures are the device's work, not its kernel launches.

A CUDA kernel returns to the host as soon as it is queued, so ``perf_counter`` around GPU
code measures launches. Every timer whose figures feed a plan (layer profiles, partition
trials, the executor's timeline) goes through here: on CUDA an interval is measured with
CUDA events and a timestamp is taken after ``torch.cuda.synchronize``; on any other device
both are ``time.perf_counter``.
"""

from __future__ import annotations

import time
from typing import Optional, Union

import torch

DeviceLike = Union[torch.device, str, None]


def _cuda(device: DeviceLike) -> Optional[torch.device]:
    """``device`` as a CUDA device (None: not a CUDA device)."""
    if device is None:
        return None
    device = torch.device(device)
    return device if device.type == "cuda" else None


def synchronize(device: DeviceLike) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for off CUDA)."""
    cuda = _cuda(device)
    if cuda is not None:
        torch.cuda.synchronize(cuda)


def device_clock(device: DeviceLike) -> float:
    """A timestamp (seconds, ``perf_counter``'s clock) after ``device``'s queued work."""
    synchronize(device)
    return time.perf_counter()


class DeviceTimer:
    """Seconds of one interval on ``device``: ``start()``, the work, ``stop()``.

    On CUDA, two events on the current stream; ``stop`` waits for the second. Elsewhere,
    ``perf_counter``.
    """

    def __init__(self, device: DeviceLike):
        self.cuda = _cuda(device)
        self._begin = None

    def start(self) -> "DeviceTimer":
        if self.cuda is None:
            self._begin = time.perf_counter()
        else:
            self._begin = torch.cuda.Event(enable_timing=True)
            self._begin.record(torch.cuda.current_stream(self.cuda))
        return self

    def stop(self) -> float:
        assert self._begin is not None, "DeviceTimer.stop() before start()"
        begin, self._begin = self._begin, None
        if self.cuda is None:
            return time.perf_counter() - begin
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.cuda))
        end.synchronize()
        return begin.elapsed_time(end) / 1e3  # milliseconds -> seconds
