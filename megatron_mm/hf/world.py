"""A one-process gloo world with TP = PP = 1: conversion builds and saves the whole model
there; Megatron-Core's distributed checkpoint then reshards it at load time."""

from __future__ import annotations

import contextlib
import socket

import torch


@contextlib.contextmanager
def single_rank_world(seed: int = 1234):
    from megatron_mm.startup import require_prepared

    require_prepared(__name__)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    owns_group = not torch.distributed.is_initialized()
    if owns_group:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                             rank=0, world_size=1)
    elif torch.distributed.get_world_size() != 1:
        raise RuntimeError("conversion runs in one process, not in a multi-rank world")
    try:
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(seed)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        if owns_group:
            torch.distributed.destroy_process_group()
