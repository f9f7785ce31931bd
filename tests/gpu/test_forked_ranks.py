"""A rank forked by the test harness's fork server (which preloads the package) runs CUDA
and NCCL: nothing preloaded initialised CUDA (``tests/test_preload.py`` checks the calls on
any machine; this runs a rank). Needs CUDA, not Transformer Engine."""

import pytest
from dist_harness import run_distributed

pytestmark = pytest.mark.processes


def _all_reduce(rank):
    import torch

    torch.cuda.set_device(rank)
    torch.distributed.init_process_group("nccl")
    x = torch.full((4,), float(rank + 1), device="cuda")
    torch.distributed.all_reduce(x)
    return x.cpu().tolist()


def test_forked_rank_runs_nccl_on_cuda(cuda):
    assert run_distributed(_all_reduce, 1) == [[1.0] * 4]
