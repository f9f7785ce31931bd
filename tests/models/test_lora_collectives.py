"""The collectives of LoRA adapters under tensor parallelism, checked in one process: the
initial A's broadcast over the TP group goes on the device the group's backend takes
(NCCL refuses host tensors, which ``--use-cpu-initialization`` builds and gloo accepts)."""

import pytest
import torch
from torch.overrides import TorchFunctionMode


class _Tp2Group:
    """A stand-in TP group of two ranks, this one the first."""

    def size(self):
        return 2

    def rank(self):
        return 0


class _CudaStandIn(TorchFunctionMode):
    """``Tensor.to`` a CUDA device returns a host copy remembered as on the device (this
    machine has none); back to the host, a plain copy."""

    def __init__(self):
        super().__init__()
        self.on_device = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            target = next((a for a in (*args[1:], *kwargs.values())
                           if isinstance(a, (torch.device, str))), None)
            if target is not None and torch.device(target).type == "cuda":
                self.on_device.append(args[0].clone())
                return self.on_device[-1]
            if any(args[0] is t for t in self.on_device):
                return args[0].clone()
        return func(*args, **kwargs)


@pytest.mark.parametrize("linear", ["column", "row"])
def test_initial_broadcast_goes_on_the_nccl_device(gloo_world, monkeypatch, linear):
    import torch.distributed as dist
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import TransformerConfig

    from megatron_mm.config import LoraConfig
    from megatron_mm.models.lora import LoraAdapter

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1,
                               use_cpu_initialization=True)
    init = torch.nn.init.zeros_
    base = (ColumnParallelLinear(8, 6, config=config, init_method=init, bias=False)
            if linear == "column" else
            RowParallelLinear(8, 6, config=config, init_method=init, bias=False,
                              input_is_parallel=True, skip_bias_add=True))
    assert base.weight.device.type == "cpu"  # --use-cpu-initialization: on the host
    base.tp_group = group = _Tp2Group()
    stand_in, sent = _CudaStandIn(), []
    real_backend = dist.get_backend

    def broadcast(tensor, src=None, group=None, async_op=False, **kwargs):
        # NCCL's rule: device tensors only (ProcessGroupNCCL: "Tensors must be CUDA")
        if dist.get_backend(group) == "nccl" and not any(tensor is t
                                                         for t in stand_in.on_device):
            raise RuntimeError("Tensors must be CUDA and dense (a host tensor to NCCL)")
        sent.append(tuple(tensor.shape))

    monkeypatch.setattr(dist, "get_backend",
                        lambda g=None: "nccl" if g is group else real_backend(g))
    monkeypatch.setattr(dist, "get_global_rank", lambda g, r: r)
    monkeypatch.setattr(dist, "broadcast", broadcast)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with stand_in:
        adapter = LoraAdapter(base, ("q_proj",), [base.weight.shape[0]], None,
                              LoraConfig(targets=(), rank=2, alpha=4.0), ("q_proj",))
    assert sent == [(2, 8 if linear == "column" else 16)]  # A whole: [r, in]
    a = adapter.q_proj.lora_A
    assert a.device.type == "cpu" and a.abs().sum() > 0


@pytest.mark.processes
def test_tp_collectives_lora_adds_per_layer():
    """TP=2, one forward and backward, the LLM frozen with and without adapters on all its
    linears: what LoRA adds per LLM layer. Without SP, the row-parallel adapters' forward
    all-reduces (o_proj, down_proj); the column-parallel ones (q/k/v, gate/up) ride on their
    base's input-gradient all-reduce (their input is replicated), where each added one before.
    With SP, each adapter gathers (or reduce-scatters) its rank-sized product forward and
    the reverse backward: 8."""
    from dist_harness import run_distributed
    from lora_runs import lora_collectives

    layers = 2
    counts = run_distributed(lora_collectives, 2, layers)[0]
    added = {sp: sum(counts[(sp, True)].values()) - sum(counts[(sp, False)].values())
             for sp in (False, True)}
    assert added == {False: 2 * layers, True: 8 * layers}, counts
    assert counts[(False, True)].keys() == {"all_reduce"}
