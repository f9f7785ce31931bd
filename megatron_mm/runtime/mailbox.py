"""Point-to-point exchanges between pipeline ranks, as ``plan/schedules/p2p.py`` lays them out.

At each point of the schedule a rank's sends and receives go out together in one
``batch_isend_irecv`` (as Megatron-Core's p2p does), in the plan's order, which both sides
compute alike (NCCL matches a pair's messages by order). A receiver allocates each message
from its ``Spec``, which it knows from its own copy of the micro-batch: no header, no host
sync. Its sends finish in the background (their buffers live until ``finish``); a
received message is waited for when it is taken (``take``), just before the action that
uses it: a receive posted early (the plan posts by the schedule's timeline) does not stall
the rank while the message is still on its way. What is waited for is the ``Work`` that
carries the message: NCCL coalesces a batch into one, and a received tensor holds its data
only once that one is waited for, so there it is the whole batch's, sends included; gloo
gives one per op and fills each receive's tensor when its own ``Work`` completes, so there
it is the receive's alone. Waiting there for the batch's sends too would wait, for a
message that has arrived, until each send's receiver posts its receive (gloo moves a send's
data only then, on its own thread): a send in a batch whose receive the peer posts an
action later held the batch's receives back by that action. NCCL runs a rank's exchanges
one after another on its own stream whatever the host waits for, so this changes no order.
``MEGATRON_MM_EMULATE_NCCL_COALESCING=1`` gives gloo NCCL's one ``Work`` per batch
(``nccl_coalescing.py``).

``MEGATRON_MM_STRICT_P2P=1`` (every multi-process test sets it): an exchange also waits for
its sends. Gloo completes a send only once the receiver has posted the matching receive,
which is what NCCL does for large messages (and NCCL runs a rank's exchanges one after
another on one stream), so an ordering that would hang on NCCL hangs here as well: after
``MEGATRON_MM_STRICT_P2P_TIMEOUT`` seconds (default 300) a wait raises, naming the
exchange's messages.
"""

from __future__ import annotations

import datetime
import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .nccl_coalescing import batch_isend_irecv

Key = Tuple[str, int, int]  # (what, micro-batch, chunk or encoder piece)


class Spec(NamedTuple):
    """What a receiver allocates for a message (None instead: nothing to carry)."""

    shape: Tuple[int, ...]
    dtype: torch.dtype


def spec_of(tensor: Optional[torch.Tensor]) -> Optional[Spec]:
    return None if tensor is None else Spec(tuple(tensor.shape), tensor.dtype)


def allocate(spec: Optional[Spec], device: torch.device) -> Optional[torch.Tensor]:
    return None if spec is None else torch.empty(spec.shape, dtype=spec.dtype, device=device)


def strict_p2p() -> bool:
    """Whether sends wait for their receives (``MEGATRON_MM_STRICT_P2P=1``)."""
    return os.environ.get("MEGATRON_MM_STRICT_P2P", "0") == "1"


def strict_timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=float(os.environ.get("MEGATRON_MM_STRICT_P2P_TIMEOUT",
                                                           "300")))


class P2PTimeout(RuntimeError):
    """A strict-mode wait ran out: the exchange's order would hang on NCCL."""


_STARTED = set()  # pipeline groups that have run a collective


class Mailbox:
    def __init__(self, group, device: torch.device):
        self.group, self.device = group, device
        self.ranks = dist.get_process_group_ranks(group)  # group rank -> global rank
        self.strict = strict_p2p()
        if dist.get_backend(group) == "nccl" and id(group) not in _STARTED:
            # NCCL: a batch_isend_irecv that is a group's first collective needs every
            # rank of the group in it (torch.distributed's docs); ours involve only peers
            dist.barrier(group=group)
            _STARTED.add(id(group))
        self.batches: List[List[dist.Work]] = []  # each exchange's works, until finish
        self.alive: List[torch.Tensor] = []  # the sends' buffers, until then
        self.arriving: Dict[Key, List[dist.Work]] = {}  # received key -> its batch's works

    def exchange(self, sends: Sequence[Tuple[int, Key, Optional[torch.Tensor], Optional[Spec]]],
                 recvs: Sequence[Tuple[int, Key, Optional[Spec]]]
                 ) -> Dict[Key, Optional[torch.Tensor]]:
        """Send each ``(peer, key, tensor, spec)`` (``spec``: what the receiver expects; a
        mismatch is an error here, not a hang or garbage there) and receive each
        ``(peer, key, spec)``, all in one batch; returns the received tensors by key."""
        ops, names = [], []
        for peer, key, tensor, spec in sends:
            if spec_of(tensor) != spec:
                raise RuntimeError(f"pipeline message {key} to pipeline rank {peer} is "
                                   f"{spec_of(tensor)} but its receiver expects {spec} "
                                   "(runtime/message_specs.py)")
            if tensor is not None and tensor.numel():
                payload = tensor.detach().contiguous()
                ops.append(dist.P2POp(dist.isend, payload, self.ranks[peer], self.group))
                self.alive.append(payload)
                names.append(f"send of {key} to pipeline rank {peer}")
        received: Dict[Key, Optional[torch.Tensor]] = {}
        op_of: Dict[Key, int] = {}  # received key -> its op's place in the batch
        for peer, key, spec in recvs:
            tensor = allocate(spec, self.device)
            received[key] = tensor
            if tensor is not None and tensor.numel():
                op_of[key] = len(ops)
                ops.append(dist.P2POp(dist.irecv, tensor, self.ranks[peer], self.group))
                names.append(f"receive of {key} from pipeline rank {peer}")
        works = batch_isend_irecv(ops) if ops else []
        if self.strict:
            self._wait(works, names)
            return received
        # NCCL coalesces the batch into ONE Work: its received keys share it. Gloo gives
        # one per op, in the ops' order: a received key waits for its receive's alone (the
        # batch's sends for ``finish``). Each list is emptied once waited for: a gloo
        # ``Work`` waited for twice waits for another message.
        if len(works) == len(ops):  # (a batch of one op: the same either way)
            own = {key: [works[i]] for key, i in op_of.items()}
            rest = set(op_of.values())
            self.batches += [[w for i, w in enumerate(works) if i not in rest], *own.values()]
            self.arriving.update(own)
        else:
            batch = list(works)
            self.batches.append(batch)
            self.arriving.update((key, batch) for key in op_of)
        return received

    def take(self, key: Key) -> None:
        """Wait until message ``key`` (received by an earlier exchange) has arrived: for
        the works that carry it (its batch's one on NCCL, its receive's on gloo)."""
        _wait_all(self.arriving.pop(key, []))

    def _wait(self, works: Sequence[dist.Work], names: Sequence[str]) -> None:
        timeout = strict_timeout()
        for work in works:
            try:
                work.wait(timeout)
            except RuntimeError as e:
                raise P2PTimeout(
                    f"pipeline rank {dist.get_rank(self.group)}: an exchange did not complete "
                    f"within {timeout.total_seconds():g} s with sends that wait for their "
                    f"receives (MEGATRON_MM_STRICT_P2P=1): {'; '.join(names)}. On NCCL this "
                    f"order hangs. ({e})") from e
        self.alive.clear()

    def finish(self) -> None:
        """Wait for every send and receive (end of the iteration)."""
        for batch in self.batches:
            _wait_all(batch)
        self.arriving.clear()
        self.batches.clear()
        self.alive.clear()


def _wait_all(batch: List[dist.Work]) -> None:
    for work in batch:
        work.wait()
    batch.clear()  # the batch's other keys find it waited for
