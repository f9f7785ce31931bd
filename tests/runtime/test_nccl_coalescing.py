"""NCCL's coalesced batch_isend_irecv on gloo (``MEGATRON_MM_EMULATE_NCCL_COALESCING=1``):
one Work per batch, and a received tensor holds garbage until that Work is waited for;
without the variable, gloo's one Work per op."""

import os

import pytest
import torch
import torch.distributed as dist

from dist_harness import run_distributed
from megatron_mm.runtime.nccl_coalescing import batch_isend_irecv

pytestmark = pytest.mark.processes


def _swap(rank, emulate):
    os.environ["MEGATRON_MM_EMULATE_NCCL_COALESCING"] = "1" if emulate else "0"
    dist.init_process_group("gloo")
    peer = 1 - rank
    got = torch.zeros(8, dtype=torch.int64)
    works = batch_isend_irecv([dist.P2POp(dist.isend, torch.full((8,), rank + 5), peer),
                               dist.P2POp(dist.irecv, got, peer)])
    dist.barrier()  # the peer's message has been sent
    before = got.tolist()
    for work in works:
        work.wait()
    return len(works), before, got.tolist()


@pytest.mark.parametrize("emulate", [False, True], ids=["gloo", "nccl-coalescing"])
def test_one_work_per_batch_and_data_only_after_its_wait(emulate):
    for rank, (works, before, after) in enumerate(run_distributed(_swap, 2, emulate)):
        assert after == [(1 - rank) + 5] * 8
        if emulate:
            assert works == 1 and before == [torch.iinfo(torch.int64).max] * 8
        else:
            assert works == 2
