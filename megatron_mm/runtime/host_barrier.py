"""A barrier on the host, through the key-value store the default process group was made
with (torchrun's): a rank waiting there for a peer's long computation (an LLM replica's
greedy decoding under ``--encoder-schedule separate``) holds no collective. A collective
posted instead (the next step's exchange, an all-reduce) would be a ProcessGroupNCCL Work
left unfinished for the whole computation, which NCCL's watchdog aborts past
``--distributed-timeout-minutes``; a store wait has no such limit."""

from __future__ import annotations

import datetime
import itertools

import torch.distributed as dist

# every rank calls the barriers in the same order: the n-th barrier's keys are the same
_BARRIERS = itertools.count()
# one store wait; the barrier waits on past it (a wait that times out logs a line)
_WAIT = datetime.timedelta(minutes=10)


def host_barrier() -> None:
    """Return once every rank of the world has called its this-many-th ``host_barrier``:
    the last to arrive sets a key the others wait for in the store (no polling)."""
    store = dist.distributed_c10d._get_default_store()
    key = f"megatron_mm/host_barrier/{next(_BARRIERS)}"
    if store.add(key, 1) == dist.get_world_size():
        store.set(key + "/all", "1")
    while True:
        try:
            store.wait([key + "/all"], _WAIT)
            return
        except dist.DistStoreError:  # a long decode: wait on
            continue
