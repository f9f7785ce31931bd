import socket

import pytest


@pytest.fixture(scope="module")
def one_rank_world():
    """A 1-rank gloo world with Megatron-Core's parallel state (TP = PP = 1)."""
    import megatron_mm.models  # noqa: F401  (CPU patches before megatron.core)
    import torch
    from megatron.core import parallel_state, tensor_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    yield
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
