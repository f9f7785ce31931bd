import pytest


@pytest.fixture(scope="module")
def cuda_world():
    """A 1-rank NCCL world on GPU 0, model parallel state TP=PP=1, RNG tracker seeded."""
    import megatron_mm.models  # noqa: F401
    import torch
    from dist_harness import free_port
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    torch.cuda.set_device(0)
    owns_group = not torch.distributed.is_initialized()
    if owns_group:
        torch.distributed.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    yield parallel_state
    parallel_state.destroy_model_parallel()
    if owns_group:
        torch.distributed.destroy_process_group()
