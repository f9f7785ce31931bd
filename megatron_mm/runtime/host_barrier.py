"""A barrier on the host, through the key-value store the default process group was made
with (torchrun's): a rank waiting there for a peer's computation (an LLM replica's greedy
decoding under ``--encoder-schedule separate``) holds no collective, so no NCCL ``Work``
stays open for the watchdog to abort; the ranks meet in the store instead.

The wait has the same bound as a collective: ``--distributed-timeout-minutes``
(Megatron-LM's flag, the default process group's timeout, which its store carries). A
rank that skips a barrier (or dies, or runs longer than that between two barriers) ends
the wait of the others with an error naming the ranks that did not arrive, instead of a
wait for ever."""

from __future__ import annotations

import datetime
import itertools
from typing import Optional

import torch.distributed as dist

# every rank calls the barriers in the same order: the n-th barrier's keys are the same
_BARRIERS = itertools.count()
_PREFIX = "megatron_mm/host_barrier"


class HostBarrierTimeout(RuntimeError):
    """Some ranks did not reach a host barrier within the deadline."""


def host_barrier(timeout: Optional[datetime.timedelta] = None) -> None:
    """Return once every rank of the world has called its this-many-th ``host_barrier``:
    the last to arrive sets a key the others wait for in the store (no polling). Past
    ``timeout`` (default: the store's, i.e. ``--distributed-timeout-minutes``) raises
    ``HostBarrierTimeout`` naming the ranks missing."""
    store = dist.distributed_c10d._get_default_store()
    n = next(_BARRIERS)
    key = f"{_PREFIX}/{n}"
    store.set(f"{key}/rank{dist.get_rank()}", "1")  # who arrived, for the error
    if store.add(key, 1) == dist.get_world_size():
        store.set(key + "/all", "1")
    timeout = store.timeout if timeout is None else timeout
    try:
        store.wait([key + "/all"], timeout)
    except dist.DistStoreError:
        missing = [r for r in range(dist.get_world_size())
                   if not store.check([f"{key}/rank{r}"])]
        minutes = timeout.total_seconds() / 60
        raise HostBarrierTimeout(
            f"rank {dist.get_rank()}: host barrier {n}: ranks {missing} did not arrive "
            f"within {minutes:g} min (--distributed-timeout-minutes): a rank skipped the "
            "barrier, failed, or its work since the last barrier (a validation's decoding) "
            "takes longer; raise --distributed-timeout-minutes for the last") from None
