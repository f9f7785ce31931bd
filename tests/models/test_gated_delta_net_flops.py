"""The planner's delta-rule FLOPs against the matmuls Megatron-Core's own chunked rule
runs (``torch_chunk_gated_delta_rule``, counted by torch's FlopCounterMode)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from megatron_mm.plan.costs.gated_delta_net import delta_rule_flops
from megatron_mm.plan.model import LinearAttentionSpec


@pytest.mark.parametrize("seq_len,chunk", [(10, 4), (16, 8)])
def test_delta_rule_matmuls_match_megatron_core(seq_len, chunk):
    from megatron.core.ssm.gated_delta_net.common import torch_chunk_gated_delta_rule

    batch, heads, dk, dv = 2, 3, 4, 5
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(batch, seq_len, heads, dk, generator=gen) for _ in range(2))
    v = torch.randn(batch, seq_len, heads, dv, generator=gen)
    g, beta = -torch.rand(batch, seq_len, heads), torch.rand(batch, seq_len, heads)
    with FlopCounterMode(display=False) as counter:
        torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk)
    la = LinearAttentionSpec(linear_key_head_dim=dk, linear_value_head_dim=dv,
                             linear_num_key_heads=heads, linear_num_value_heads=heads,
                             chunk_size=chunk)
    # the triangular solve is a loop of elementwise products the counter does not see
    chunks = batch * -(-seq_len // chunk) * heads
    solve = chunks * (chunk - 1) * chunk * (2 * chunk - 1) / 3
    assert delta_rule_flops(la, batch, seq_len) - solve == counter.get_total_flops()
