"""Patch ``l2_norm``: a CPU ``local_multi_tensor_l2_norm`` for Megatron's gradient clipping."""

import torch
from megatron.core import utils as megatron_utils
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, clip_grads, get_megatron_optimizer


def test_upstream_fails(upstream):
    upstream.raised("l2_norm", "AssertionError", "Torch not compiled with CUDA enabled",
                    where=("utils.py", 'l2_cuda = torch.tensor([float(l2_reduced)], '
                                       'dtype=torch.float, device="cuda")'))


def _grads():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen) for shape in ((3, 4), (7,), (2, 2, 5), (1,))]


def test_equals_vector_norm_over_all_tensors(gloo_world):
    grads = _grads()
    assert clip_grads.l2_norm_impl is megatron_utils.local_multi_tensor_l2_norm
    reference = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    norm, per_tensor = megatron_utils.local_multi_tensor_l2_norm(
        2048 * 32, torch.zeros(1, dtype=torch.int), [grads[:2], grads[2:]], False)
    assert norm.shape == (1,) and norm.dtype == torch.float32 and per_tensor is None
    torch.testing.assert_close(norm[0], reference, rtol=1e-6, atol=0)
    # clip_grads calls it through the multi-tensor applier
    torch.testing.assert_close(torch.as_tensor(clip_grads.get_grad_norm_fp32(grads)),
                               reference, rtol=1e-6, atol=0)
    assert clip_grads.get_grad_norm_fp32([]) == 0.0


def test_optimizer_clips_to_the_reference_norm(gloo_world, make_tiny):
    """``MegatronOptimizer.clip_grad_norm`` (the step of an FP32Optimizer with clip_grad)."""
    model = make_tiny(0)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=0.5), [ddp])
    ddp(torch.randn(5, 4, generator=torch.Generator().manual_seed(1))).pow(2).sum().backward()
    ddp.finish_grad_sync()
    reference = torch.linalg.vector_norm(
        torch.cat([p.main_grad.flatten() for p in model.parameters()]))
    assert reference > 0.5

    ok, grad_norm, _ = opt.step()
    assert ok
    torch.testing.assert_close(torch.as_tensor(grad_norm), reference, rtol=1e-6, atol=0)
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(clipped, torch.tensor(0.5), rtol=1e-5, atol=0)
