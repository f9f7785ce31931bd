"""Patch ``output_gate_eager``: Megatron-Core's gated attention output (``Attention.
_apply_output_gate``, a ``torch.compile`` method upstream) runs eagerly without CUDA, and
computes x * sigmoid(gate) in fp32, cast back."""

import torch
from megatron.core.transformer.attention import Attention


def test_eager_and_equal_to_the_gate():
    gate_fn = Attention._apply_output_gate
    assert not hasattr(gate_fn, "_torchdynamo_orig_callable")  # no longer compiled
    x = torch.randn(5, 2, 8, dtype=torch.bfloat16)
    gate = torch.randn(5, 2, 2, 4, dtype=torch.bfloat16)
    out = gate_fn(None, x, gate)
    assert out.dtype == torch.bfloat16
    want = (x.float() * torch.sigmoid(gate.float().reshape(5, 2, 8))).to(torch.bfloat16)
    assert torch.equal(out, want)
