"""Patch ``tensor_type_str``: ``tensor.type()`` equals both the CPU and the CUDA type name."""

import pytest
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer


def test_upstream_fails(upstream):
    assert upstream.value("tensor_type") == "torch.FloatTensor"
    upstream.raised("clip_grad_type", "AssertionError",
                    where=("clip_grads.py", "assert param.grad.type() == 'torch.cuda.FloatTensor'"))
    upstream.raised("distopt_build", "TypeError",
                    "Wrapped parameters must be one of torch.cuda.FloatTensor",
                    where=("distrib_optimizer.py", "raise TypeError("))


def test_type_name_compares_equal_to_cpu_and_cuda_names():
    t = torch.zeros(2)
    assert t.type() == "torch.cuda.FloatTensor" and t.type() == "torch.FloatTensor"
    assert "torch.cuda.FloatTensor" == t.type()
    assert not (t.type() != "torch.cuda.FloatTensor")
    assert t.type() != "torch.cuda.HalfTensor" and t.type() != "torch.DoubleTensor"
    assert t.type() not in ["torch.cuda.HalfTensor", "torch.cuda.BFloat16Tensor"]
    assert torch.zeros(1, dtype=torch.bfloat16).type() in ["torch.cuda.HalfTensor",
                                                            "torch.cuda.BFloat16Tensor"]
    assert isinstance(t.type(), str) and str(t.type()) == "torch.FloatTensor"
    assert torch.zeros(1, dtype=torch.int64).type() == "torch.cuda.LongTensor"


def test_conversions_still_convert():
    t = torch.tensor([1.5, 2.5])
    assert t.type(torch.float64).dtype == torch.float64
    assert t.type("torch.DoubleTensor").dtype == torch.float64
    assert t.type(dtype=torch.int32).dtype == torch.int32
    assert torch.equal(t.type(torch.float64), t.double())
    with pytest.raises((AssertionError, RuntimeError, TypeError)):
        t.type("torch.cuda.FloatTensor")  # an actual move to CUDA still fails


def test_clip_grad_by_total_norm(gloo_world):
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.full((3,), 2.0)
    clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=4.0)
    torch.testing.assert_close(param.grad, torch.full((3,), 2.0 / (4.0 + 1e-6)))


def test_distributed_optimizer_accepts_cpu_fp32_params(gloo_world, make_tiny):
    model = make_tiny(0)
    ddp = DistributedDataParallel(
        model.config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, use_distributed_optimizer=True), [ddp])
    assert isinstance(opt.chained_optimizers[0], DistributedOptimizer)
