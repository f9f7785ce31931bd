import pytest


@pytest.fixture(scope="module")
def cuda_world():
    """A 1-rank NCCL world on GPU 0, model parallel state TP=PP=1, RNG tracker seeded."""
    import torch
    from dist_harness import one_rank_world

    torch.cuda.set_device(0)
    with one_rank_world("nccl") as parallel_state:
        yield parallel_state
