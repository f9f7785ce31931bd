"""A barrier on the host, through the key-value store the default process group was made
with (torchrun's): a rank waiting there for a peer's long computation (an LLM replica's
greedy decoding under ``--encoder-schedule separate``) holds no collective. A collective
posted instead (the next step's exchange, an all-reduce) would be a ProcessGroupNCCL Work
left unfinished for the whole computation, which NCCL's watchdog aborts past
``--distributed-timeout-minutes``; a store wait has no such limit."""

from __future__ import annotations

import itertools
import time

import torch.distributed as dist

# every rank calls the barriers in the same order: the n-th barrier's key is the same
_BARRIERS = itertools.count()


def host_barrier(poll_s: float = 0.005) -> None:
    """Return once every rank of the world has called its this-many-th ``host_barrier``."""
    store = dist.distributed_c10d._get_default_store()
    key = f"megatron_mm/host_barrier/{next(_BARRIERS)}"
    store.add(key, 1)
    while store.add(key, 0) < dist.get_world_size():  # add 0: read the count
        time.sleep(poll_s)
