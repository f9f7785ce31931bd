"""Patch ``checkpoint_object_args``: Megatron-Core's recompute takes arguments that are not
tensors (context parallelism's attention mask) and gives the gradients of no recompute."""

import torch
from megatron.core import tensor_parallel


class Codes:
    """An attention mask that is not a tensor, as ``ContextParallelMask`` is."""

    def __init__(self, scale):
        self.scale = scale


def test_upstream_fails(upstream):
    upstream.raised("checkpoint_object_arg", "TypeError", "save_for_backward can only save",
                    where=("random.py", "return CheckpointFunction.apply("))


def _layer(x, codes, w):
    return torch.tanh(x @ w) * codes.scale


def test_recompute_with_an_object_argument_equals_no_recompute():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    codes = Codes(0.5)
    _layer(x, codes, w).pow(2).sum().backward()
    expected = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    seen = []

    def run(x, codes, w):
        seen.append(codes)
        return _layer(x, codes, w)

    tensor_parallel.checkpoint(run, False, x, codes, w).pow(2).sum().backward()
    assert seen == [codes, codes]  # the forward, then the recompute in backward
    torch.testing.assert_close((x.grad, w.grad), expected, rtol=0, atol=0)
