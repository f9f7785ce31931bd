"""``--exit-signal-handler``: Megatron-LM's ``DistributedSignalHandler``.

The handler only records that the signal arrived; the training loop asks after each
iteration whether any rank got it (one all-reduce), so every rank stops after the same
iteration, saves the same checkpoint and exits cleanly. Slurm and torchrun deliver
SIGTERM to every rank, but not at the same instant: the agreement is what makes the
checkpoint consistent.
"""

from __future__ import annotations

import signal

import torch

from ...runtime.collective_device import collective_device


class DistributedSignalHandler:
    def __init__(self, sig: signal.Signals = signal.SIGTERM):
        self.sig = sig
        self._received = False
        self._original = None

    def __enter__(self) -> "DistributedSignalHandler":
        self._received = False
        self._original = signal.getsignal(self.sig)
        signal.signal(self.sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _handler(self, signum, frame) -> None:
        self._received = True

    def release(self) -> None:
        if self._original is not None:
            signal.signal(self.sig, self._original)
            self._original = None

    def any_received(self) -> bool:
        """Whether any rank has received the signal (a collective: every rank calls)."""
        flag = torch.tensor([int(self._received)], dtype=torch.int32, device=collective_device())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())
