"""Patch ``current_stream``: a do-nothing ``torch.cuda.current_stream()`` without CUDA."""

import copy

import pytest
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

CUDA_MISSING = "Torch not compiled with CUDA enabled"


def test_upstream_fails(upstream):
    upstream.raised("current_stream", "AssertionError", CUDA_MISSING)
    # DDP grad sync, once its buffers can be allocated (patch current_device)
    upstream.raised("ddp_grad_sync", "AssertionError", CUDA_MISSING,
                    where=("param_and_grad_buffer.py",
                           "current_stream = torch.cuda.current_stream()"))


def test_stream_methods_do_nothing():
    stream = torch.cuda.current_stream()
    assert stream is torch.cuda.current_stream(0)
    assert stream.wait_event(object()) is None and stream.wait_stream(stream) is None
    assert stream.synchronize() is None


@pytest.mark.parametrize("overlap", [False, True])
def test_ddp_grad_sync(gloo_world, make_tiny, overlap):
    """``start_grad_sync`` of every bucket group runs (explicitly, or from the backward hooks
    with ``overlap_grad_reduce``) and the reduced grads equal plain autograd's."""
    model = make_tiny(0)
    reference = copy.deepcopy(model)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    ddp = DistributedDataParallel(
        model.config, DistributedDataParallelConfig(overlap_grad_reduce=overlap), model)
    if overlap:  # the hooks start the reduction only from the second batch on
        ddp(x).sum().backward()
        ddp.finish_grad_sync()
        ddp.zero_grad_buffer()

    started = []
    for group in ddp.bucket_groups:
        group.start_grad_sync = lambda *a, _f=group.start_grad_sync, **k: (
            started.append(1), _f(*a, **k))[1]
    ddp(x).pow(2).sum().backward()
    if not overlap:
        ddp.start_grad_sync()
    assert len(started) == len(ddp.bucket_groups) > 0
    ddp.finish_grad_sync()

    reference(x).pow(2).sum().backward()
    for p, r in zip(model.parameters(), reference.parameters()):
        assert p.main_grad.device.type == "cpu"
        torch.testing.assert_close(p.main_grad, r.grad, rtol=1e-6, atol=0)
