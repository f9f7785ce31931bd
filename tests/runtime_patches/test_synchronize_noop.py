"""Patch ``synchronize_noop``: ``torch.cuda.synchronize`` does nothing without CUDA."""

import torch
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing import ShardedTensor
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

CUDA_MISSING = "Torch not compiled with CUDA enabled"


def test_upstream_fails(upstream):
    upstream.raised("synchronize", "AssertionError", CUDA_MISSING)
    upstream.raised("p2p_sync", "AssertionError", CUDA_MISSING,
                    where=("p2p_communication.py", "torch.cuda.synchronize()"))
    upstream.raised("dist_checkpoint_save", "AssertionError", CUDA_MISSING,
                    where=("filesystem_async.py", "torch.cuda.synchronize()"))


def test_synchronize_is_a_noop():
    assert torch.cuda.synchronize() is None
    assert torch.cuda.synchronize(0) is None


def test_batched_p2p_sync(gloo_world, tiny_config):
    """``P2PCommunicator._communicate`` synchronizes after batched p2p (both flags default on)."""
    assert tiny_config.batch_p2p_comm and tiny_config.batch_p2p_sync
    comm = P2PCommunicator(pp_group=gloo_world.get_pipeline_model_parallel_group(),
                           config=tiny_config)
    recv_prev, recv_next, reqs = comm._communicate(
        tensor_send_next=None, tensor_send_prev=None, recv_prev=False, recv_next=False,
        tensor_shape=(2, 3))
    assert recv_prev is None and recv_next is None


def test_dist_checkpoint_round_trip(gloo_world, tmp_path):
    """``dist_checkpointing`` save (``filesystem_async.preload_tensors``) and load."""
    weight = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    dist_checkpointing.save(
        {"w": ShardedTensor.from_rank_offsets("w", weight.clone(), replica_id=0)}, str(tmp_path))
    template = {"w": ShardedTensor.from_rank_offsets("w", torch.zeros(4, 3), replica_id=0)}
    loaded = dist_checkpointing.load(template, str(tmp_path))
    assert torch.equal(loaded["w"], weight)
