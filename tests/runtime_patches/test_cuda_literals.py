"""Patch ``cuda_literals``: ``device="cuda"`` / ``pin_memory=True`` tensor factories inside
the schedules, optimizer and rope_utils modules become CPU ones."""

import copy
import importlib
import importlib.util

import pytest
import torch
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func, schedules

from megatron_mm.runtime_patches import cuda_literals


def test_upstream_fails(upstream):
    upstream.raised("schedule_no_pipelining", "AssertionError",
                    "Torch not compiled with CUDA enabled",
                    where=("schedules.py", 'total_num_tokens = torch.zeros([], dtype=torch.int, '
                                           'device="cuda")'))
    upstream.raised("rope_cp", "RuntimeError", "pin_memory=True requires a CUDA",
                    where=("rope_utils.py", "cp_idx = torch.tensor("))


def test_forward_backward_no_pipelining(gloo_world, make_tiny):
    model = make_tiny(0)
    reference = copy.deepcopy(model)
    batches = [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def forward_step(data_iterator, m):
        out = m(next(data_iterator))

        def loss_func(output):
            loss = output.pow(2).mean()
            return loss, {"loss": loss.detach().clone()}  # the schedule divides ``loss``

        return out, loss_func

    func = get_forward_backward_func()
    assert func is schedules.forward_backward_no_pipelining
    losses = func(forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
                  num_microbatches=len(batches), seq_length=3, micro_batch_size=3)

    expected = []
    for batch in batches:
        loss = reference(batch).pow(2).mean()
        (loss / len(batches)).backward()
        expected.append(loss.detach())
    assert torch.equal(torch.stack([d["loss"] for d in losses]), torch.stack(expected))
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=0)


def test_scoped_to_the_named_modules():
    from megatron_mm.runtime_patches import training_cuda

    # one proxy, but where training_cuda gives a module (rerun_state_machine, once
    # Megatron-LM's loop is imported) its own, with a torch.cuda of its own too
    proxies = {id(importlib.import_module(name).torch) for name in cuda_literals.MODULES
               if importlib.util.find_spec(name) is not None
               and name not in training_cuda.CUDA}
    assert len(proxies) == 1 and schedules.torch is not torch
    assert all(isinstance(importlib.import_module(name).torch, cuda_literals._CpuTorch)
               for name in cuda_literals.MODULES if importlib.util.find_spec(name))
    assert schedules.torch.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
    assert schedules.torch.tensor([1.0], device=torch.device("cuda", 0)).device.type == "cpu"
    assert not rope_utils.torch.tensor([1, 2], device="cpu", pin_memory=True).is_pinned()
    assert schedules.torch.cat is torch.cat and schedules.torch.Tensor is torch.Tensor
    with pytest.raises((AssertionError, RuntimeError)):  # global torch is left alone
        torch.zeros(1, device="cuda")


def test_rope_pos_emb_on_cp_rank(gloo_world):
    """``get_pos_emb_on_this_cp_rank`` (pin_memory=True, then .cuda()) at CP size 1."""
    emb = torch.randn(8, 1, 1, 4)
    out = rope_utils.get_pos_emb_on_this_cp_rank(emb, 0, gloo_world.get_context_parallel_group())
    assert torch.equal(out, emb)


def test_fp32_optimizer_scale(gloo_world, make_tiny):
    """``FP32Optimizer.__init__``: ``self._scale = torch.tensor(..., device='cuda')``."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    model = make_tiny(0)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3), [ddp])
    assert type(opt.chained_optimizers[0]).__name__ == "FP32Optimizer"
    assert torch.equal(opt.get_loss_scale(), torch.tensor([1.0]))
