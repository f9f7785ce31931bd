"""Patch ``moe_host_splits``: Megatron-Core's all-to-all token dispatcher without CUDA
(its side stream, and split sizes that ``all_to_all_single`` takes). The uneven
all-to-all itself runs on gloo in the expert-parallel equivalence tests
(tests/training/test_expert_parallel.py)."""

import numpy as np
import torch
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
from megatron.core.transformer.transformer_config import TransformerConfig


def test_upstream_fails(upstream):
    upstream.raised("moe_dispatcher", "RuntimeError", "torch.cuda.Stream requires CUDA",
                    where=("token_dispatcher.py", "torch.cuda.Stream()"))
    # Host split sizes stay tensors, which all_to_all_single refuses.
    assert upstream.results["moe_split_sizes"] == {"value": "Tensor"}
    upstream.raised("all_to_all_tensor_splits", "TypeError", "output_split_sizes")


def test_split_sizes_reach_the_host_as_numpy():
    from megatron.core.transformer.moe import token_dispatcher

    sizes = token_dispatcher.maybe_move_tensor_to_cpu(torch.tensor([1, 2]), as_numpy=True)
    assert isinstance(sizes, np.ndarray) and sizes.tolist() == [1, 2]
    kept = torch.tensor([3])  # without as_numpy: upstream's (a host tensor stays itself)
    assert token_dispatcher.maybe_move_tensor_to_cpu(kept) is kept
    assert moe_utils.maybe_move_tensor_to_cpu is not token_dispatcher.maybe_move_tensor_to_cpu


def test_moe_layer_with_the_alltoall_dispatcher(gloo_world):
    """An MoE layer on the all-to-all dispatcher runs forward and backward on the CPU and
    equals its experts applied by hand."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                               num_moe_experts=4, moe_ffn_hidden_size=8, moe_router_topk=2,
                               moe_token_dispatcher_type="alltoall", add_bias_linear=False,
                               use_cpu_initialization=True, pipeline_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(num_experts=4).submodules.mlp
    torch.manual_seed(0)
    layer = spec(config=config)
    assert isinstance(layer, MoELayer)
    assert isinstance(layer.token_dispatcher, MoEAlltoAllTokenDispatcher)
    x = torch.randn(5, 2, 16, requires_grad=True)
    out, _ = layer(x)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    # by hand: softmax over each token's top-2 logits, weighted sum of those experts
    flat = x.detach().reshape(-1, 16)
    logits = flat @ layer.router.weight.detach().t()
    top, idx = logits.topk(2, dim=-1)
    probs = top.softmax(-1)
    want = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for k in range(2):
            expert = layer.experts.local_experts[int(idx[t, k])]
            want[t] += probs[t, k] * expert(flat[t:t + 1])[0][0].detach()
    torch.testing.assert_close(out.detach().reshape(-1, 16), want, rtol=1e-5, atol=1e-6)
