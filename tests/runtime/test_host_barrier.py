"""``host_barrier`` on gloo: every rank arriving returns; a rank that skips one ends the
others' wait after the process group's timeout (``--distributed-timeout-minutes``) with
an error naming it (before: a wait for ever)."""

import pytest
from dist_harness import run_distributed

pytestmark = pytest.mark.processes

TIMEOUT_S = 2


def _rank_two_skips_the_second_barrier(rank):
    import datetime
    import time

    import torch.distributed as dist

    from megatron_mm.runtime.host_barrier import HostBarrierTimeout, host_barrier

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    store = dist.distributed_c10d._get_default_store()
    host_barrier()  # all three arrive
    out = {}
    if rank == 2:  # skips the second; stays until the others have given up
        store.wait(["test/done0", "test/done1"], datetime.timedelta(seconds=120))
    else:
        start = time.monotonic()
        try:
            host_barrier()
        except HostBarrierTimeout as e:
            out["error"] = str(e)
        out["waited_s"] = time.monotonic() - start
        store.set(f"test/done{rank}", "1")
    dist.barrier()
    return out


def test_a_rank_skipping_a_barrier_is_named_after_the_timeout():
    ranks = run_distributed(_rank_two_skips_the_second_barrier, 3)
    for rank in (0, 1):
        assert "ranks [2] did not arrive" in ranks[rank]["error"], ranks[rank]
        assert "--distributed-timeout-minutes" in ranks[rank]["error"]
        assert ranks[rank]["waited_s"] >= TIMEOUT_S
