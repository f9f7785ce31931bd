"""Patch ``causal_mask``: the default and sliding-window causal masks built on the CPU."""

import pytest
import torch
from megatron.core.fusions import fused_softmax
from megatron.core.transformer import utils as transformer_utils
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

CUDA_MISSING = "Torch not compiled with CUDA enabled"


def test_upstream_fails(upstream):
    upstream.raised("causal_mask", "AssertionError", CUDA_MISSING,
                    where=("utils.py", 'torch.ones(sq, sq, device="cuda")'))
    upstream.raised("sliding_window_mask", "AssertionError", CUDA_MISSING,
                    where=("utils.py", 'device="cuda"'))


def _sliding_window_reference(sq, skv, window):
    """True = masked. Query i sits at key position i + skv - sq and sees keys within
    ``window[0]`` before and ``window[1]`` after it."""
    mask = torch.ones(sq, skv, dtype=torch.bool)
    for i in range(sq):
        pos = i + skv - sq
        for j in range(skv):
            if pos - window[0] <= j <= pos + window[1]:
                mask[i, j] = False
    return mask


@pytest.mark.parametrize("sq", [1, 2, 7, 16])
def test_default_mask_equals_triu(sq):
    for module in (transformer_utils, fused_softmax):  # fused_softmax imports it by name
        mask = module.get_default_causal_mask(sq)
        assert mask.dtype == torch.bool and mask.device.type == "cpu"
        assert torch.equal(mask, torch.triu(torch.ones(sq, sq), diagonal=1).bool())


@pytest.mark.parametrize("sq,skv,window", [(4, 4, (2, 0)), (5, 5, (1, 1)), (3, 6, (2, 0)),
                                           (6, 6, (0, 0)), (4, 9, (3, 2))])
def test_sliding_window_mask_equals_reference(sq, skv, window):
    for module in (transformer_utils, fused_softmax):
        mask = module.get_sliding_window_causal_mask(sq, skv, window)
        assert torch.equal(mask, _sliding_window_reference(sq, skv, window))


@pytest.mark.parametrize("window", [None, (2, 0)])
def test_local_attention_without_mask_is_causal(gloo_world, window):
    """Local-spec ``DotProductAttention`` builds the mask itself when ``attention_mask`` is
    None; compare with torch's scaled_dot_product_attention."""
    sq, b, heads, dim = 6, 2, 2, 8
    config = TransformerConfig(num_layers=1, hidden_size=heads * dim, num_attention_heads=heads,
                               attention_dropout=0.0, window_size=window,
                               use_cpu_initialization=True)
    attention = DotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                    attention_type="self")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sq, b, heads, dim, generator=gen) for _ in range(3))
    out = attention(q, k, v, attention_mask=None)

    # [s, b, h, d] -> [b, h, s, d]
    q_, k_, v_ = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    if window is None:
        ref = torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
    else:
        allowed = ~_sliding_window_reference(sq, sq, window)
        ref = torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, attn_mask=allowed)
    ref = ref.permute(2, 0, 1, 3).reshape(sq, b, heads * dim)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
