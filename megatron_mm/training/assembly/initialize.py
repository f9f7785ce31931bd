"""Process groups and seeds, as Megatron-LM's ``initialize_megatron`` sets them up."""

from __future__ import annotations

import datetime
import os
import random

import numpy as np
import torch
from megatron.core import parallel_state, tensor_parallel

from ...models.host_copy import to_device
from ...runtime.encoder_replicas import create_encoder_replicas
from ...runtime.separate_placement import initialize_separate_parallel
from .build_settings import distributed_backend
from .separate_world import separate_ranks


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def batch_to_device(batch: dict, media: bool = True) -> dict:
    """The model's inputs on the device (``non_blocking``, from pinned memory); the media
    only where the model chunk reads them (``media=False``: an empty dict, the layout
    carries their counts)."""
    dev = device()
    out = dict(batch)
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        out[key] = to_device(batch[key], dev)
    out["media"] = ({k: to_device(v, dev) for k, v in batch["media"].items()}
                    if media else {})
    return out


def initialize_distributed(parallel, encoder_schedule=None):
    """torch.distributed (NCCL with CUDA, gloo without) and Megatron-Core's groups from the
    ``parallel`` group; returns the encoder replicas' groups (``encoder_schedule``'s
    encoder TP below the LLM's) or None."""
    if not torch.distributed.is_initialized():
        backend = distributed_backend(parallel)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # A plain `python script.py` is a 1-rank world; its address is not put into the
        # environment, where processes this one starts would take it for theirs.
        single = ({} if "MASTER_ADDR" in os.environ else
                  dict(init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1))
        torch.distributed.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(minutes=parallel.distributed_timeout_minutes),
            **single)
    if encoder_schedule is not None and encoder_schedule.encoder_schedule == "separate":
        # the encoder ranks' grid and the LLM's at their rank offset
        initialize_separate_parallel(separate_ranks(
            parallel, encoder_schedule, torch.distributed.get_world_size()),
            parallel.virtual_pipeline_model_parallel_size)
        return None
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        context_parallel_size=parallel.context_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        # The experts' own grid (TP x EP x expert-DP x PP); an object without the flags
        # (the converter's compare): none.
        expert_model_parallel_size=getattr(parallel, "expert_model_parallel_size", 1),
        expert_tensor_parallel_size=getattr(parallel, "expert_tensor_parallel_size", None))
    # An encoder TP below the LLM's (--encoder-schedule coarse|bubble): its replicas' groups.
    if encoder_schedule is None or encoder_schedule.encoder_schedule == "megatron":
        return None
    etp = encoder_schedule.encoder_tensor_model_parallel_size
    return (create_encoder_replicas(etp)
            if etp is not None and etp < parallel.tensor_model_parallel_size else None)


def set_random_seed(seed: int) -> None:
    """Megatron's rule: the seed differs per pipeline stage, the TP streams per TP rank."""
    seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def shutdown_distributed(barrier: bool = True) -> None:
    """Destroy the process groups before the interpreter exits (``barrier``: once every
    rank is done). Left to interpreter teardown, gloo's worker threads can still hold work
    and the process aborts with "terminate called without an active exception" (SIGABRT)
    after a run that succeeded (pytorch/pytorch#190489), which a scheduler reads as a
    failed job. Without ``barrier``: on an error, where peers may never get there."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if barrier:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()
