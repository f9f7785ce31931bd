"""Patch ``gated_delta_net``: CPU stand-ins for flash-linear-attention's kernels in
Megatron-Core's Gated DeltaNet, checked against transformers' own torch reference
(Qwen3.5's ``torch_chunk_gated_delta_rule`` and its causal-convolution fallback), per
sample of ``cu_seqlens``."""

import torch
import torch.nn.functional as F

from megatron_mm.runtime_patches import gated_delta_net as patch

LENGTHS = (37, 90)


def test_upstream_lacks_fla_and_the_patch_is_in():
    from megatron.core.ssm.gated_delta_net import common, gdn

    assert patch.UPSTREAM["HAVE_FLA"] is False and patch.UPSTREAM["causal_conv1d"] is None
    assert common.HAVE_FLA and common.chunk_gated_delta_rule is patch.chunk_gated_delta_rule
    assert gdn.causal_conv1d is patch.causal_conv1d and common.l2norm is patch.l2norm


def _inputs(t, heads=2, k=8, v=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, key = (torch.randn(1, t, heads, k, generator=gen) for _ in range(2))
    value = torch.randn(1, t, heads, v, generator=gen)
    g = -F.softplus(torch.randn(1, t, heads, generator=gen))
    beta = torch.rand(1, t, heads, generator=gen)
    return q, key, value, g, beta


def test_rule_equals_transformers_per_sample():
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    q, k, v, g, beta = _inputs(sum(LENGTHS))
    cu = torch.tensor([0, LENGTHS[0], sum(LENGTHS)], dtype=torch.int32)
    ours, state = patch.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu,
                                               use_qk_l2norm_in_kernel=True)
    assert state is None
    start = 0
    for n in LENGTHS:
        s = slice(start, start + n)
        want, _ = torch_chunk_gated_delta_rule(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s],
                                               use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(ours[:, s], want, rtol=1e-5, atol=1e-5)
        start += n


def test_causal_conv_restarts_at_each_sample():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, sum(LENGTHS), 6, generator=gen)
    weight = torch.randn(6, 4, generator=gen)
    cu = torch.tensor([0, LENGTHS[0], sum(LENGTHS)], dtype=torch.int32)
    ours, _ = patch.causal_conv1d(x, weight, None, activation="silu", cu_seqlens=cu)
    conv = torch.nn.Conv1d(6, 6, 4, groups=6, padding=3, bias=False)
    conv.weight.data = weight[:, None]
    start = 0
    for n in LENGTHS:  # transformers' fallback: F.silu(conv(x)[..., :t]) on [B, D, t]
        piece = x[:, start:start + n].transpose(1, 2)
        want = F.silu(conv(piece)[..., :n]).transpose(1, 2)
        torch.testing.assert_close(ours[:, start:start + n], want, rtol=1e-5, atol=1e-6)
        start += n


def test_short_samples_run_in_small_chunks_and_equal_chunks_of_64(monkeypatch):
    """A sample of at most SHORT tokens runs the torch rule in chunks of 16 (about 10x
    faster on CPU at the demos' 80 tokens), a longer one in FLA's 64; the output and the
    gradients equal the rule in chunks of 64."""
    from megatron.core.ssm.gated_delta_net import common

    chunks = []
    upstream = common.torch_chunk_gated_delta_rule

    def spy(*args, chunk_size=64, **kwargs):
        chunks.append(chunk_size)
        return upstream(*args, chunk_size=chunk_size, **kwargs)

    monkeypatch.setattr(common, "torch_chunk_gated_delta_rule", spy)
    n = (80, patch.SHORT + 1)
    cu = torch.tensor([0, n[0], sum(n)], dtype=torch.int32)
    inputs = [x.requires_grad_() for x in _inputs(sum(n))]
    out, _ = patch.chunk_gated_delta_rule(*inputs, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    assert chunks == [16, 64]
    out.square().sum().backward()
    start = 0
    for length in n:
        s = slice(start, start + length)
        part = [x.detach()[:, s].clone().requires_grad_() for x in inputs]
        want, _ = upstream(*part, use_qk_l2norm_in_kernel=True)  # chunks of 64
        torch.testing.assert_close(out[:, s], want, rtol=1e-5, atol=1e-5)
        want.square().sum().backward()
        for x, p in zip(inputs, part):
            torch.testing.assert_close(x.grad[:, s], p.grad, rtol=1e-4, atol=1e-5)
        start += length
