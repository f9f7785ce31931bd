"""Patch ``defer_wgrad_local_linears``: under ``--defer-embedding-wgrad-compute`` a local
column-parallel linear other than the output layer computes its own weight gradient,
while the output layer still defers its own (before: "'NoneType' object has no attribute
'append'" in the first forward). Megatron-LM's pretrain with the flag and local linears:
tests/megatron_lm/test_flag_matrix.py; the upstream fix: patches/0009."""

import torch
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import ColumnParallelLinear, layers


def test_upstream_fails(upstream):
    upstream.raised("defer_wgrad_local_linear", "AttributeError",
                    "'NoneType' object has no attribute 'append'",
                    where=("layers.py", "self.embedding_activation_buffer.append("))


class Wgrad:
    """Apex's ``fused_weight_gradient_mlp_cuda`` (``main_grad += grad_output^T input``),
    which the flag requires."""

    @staticmethod
    def wgrad_gemm_accum_fp32(x, dy, main_grad):
        main_grad.add_(dy.t().matmul(x))


def _linear(config, **buffers):
    linear = ColumnParallelLinear(8, 4, config=config, init_method=torch.nn.init.normal_,
                                  bias=False, **buffers)
    linear.weight.main_grad = torch.zeros_like(linear.weight)
    return linear


def _grads(defer: bool):
    """A projection then an output layer; their weights' gradients and the buffers."""
    config = ModelParallelConfig(pipeline_model_parallel_size=2, pipeline_dtype=torch.float32,
                                 gradient_accumulation_fusion=True,
                                 defer_embedding_wgrad_compute=defer,
                                 use_cpu_initialization=True)
    torch.manual_seed(0)
    inputs, grads = [], []
    proj = _linear(config)
    out_layer = _linear(config, embedding_activation_buffer=inputs, grad_output_buffer=grads)
    x = torch.randn(3, 2, 8)
    for _ in range(2):  # two micro-batches
        hidden, _ = proj(x)
        logits, _ = out_layer(hidden.tanh().repeat(1, 1, 2))
        logits.square().sum().backward()
    if defer:  # the pipeline flush (schedules.finish_embedding_wgrad_compute)
        for inp, dy in zip(inputs, grads):
            Wgrad.wgrad_gemm_accum_fp32(inp.flatten(0, 1), dy.flatten(0, 1),
                                        out_layer.weight.main_grad)
    return (proj.weight.main_grad, out_layer.weight.main_grad), (len(inputs), len(grads))


def test_only_the_output_layer_defers_and_the_gradients_equal_no_deferral(gloo_world,
                                                                         monkeypatch):
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", Wgrad, raising=False)
    deferred, buffered = _grads(defer=True)
    expected, unbuffered = _grads(defer=False)
    assert buffered == (2, 2) and unbuffered == (0, 0)
    torch.testing.assert_close(deferred, expected, rtol=1e-6, atol=1e-6)
    assert expected[0].abs().sum() > 0
