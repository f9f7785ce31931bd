"""FlexAttention (forward, the only direction torch runs on CPU) equals dense attention on
the reference mask for every mask family (causal, prefix-LM, media embedded in text,
packed samples mixing them), whole and split over CP=2 and CP=4 ranks by our assignment
and by zigzag; its block masks come from the O(S) codes on the device and mark exactly the
tiles the planner counts."""

import numpy as np
import pytest
import torch

from megatron_mm.models.context_parallel import context_parallel_mask
from megatron_mm.models.flex_attention import FlexAttention, MaskCodes, block_mask
from megatron_mm.plan.context_parallel.attention_mask import dense_allowed, tile_map
from megatron_mm.reproductions.mask_families import FAMILIES, family_codes

pytestmark = pytest.mark.slow  # compiles flex_attention (dynamic shapes: once)

S, HEADS, GROUPS, DIM, CP_BLOCK = 300, 4, 2, 16, 32


def _dense(q, k, v, codes):
    allow = torch.from_numpy(dense_allowed(codes))  # [B, S, S]
    kk, vv = (x.repeat_interleave(HEADS // GROUPS, 2) for x in (k, v))
    scores = torch.einsum("qbhd,kbhd->bhqk", q, kk) / DIM ** 0.5
    probs = torch.softmax(scores.masked_fill(~allow[:, None], float("-inf")), -1)
    return torch.einsum("bhqk,kbhd->qbhd", probs, vv).reshape(q.shape[0], q.shape[1], -1)


@pytest.fixture(scope="module")
def attention(gloo_world):
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=HEADS * DIM, num_attention_heads=HEADS,
                               num_query_groups=GROUPS, kv_channels=DIM, attention_dropout=0.0)
    return FlexAttention(config, 1, None, "self")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_flex_equals_dense_whole_and_split(attention, family):
    codes = np.stack([family_codes(family, S, seed) for seed in (0, 1)])
    g = torch.Generator().manual_seed(3)
    q = torch.randn(S, 2, HEADS, DIM, generator=g)
    k, v = (torch.randn(S, 2, GROUPS, DIM, generator=g) for _ in range(2))
    ref = _dense(q, k, v, codes)
    with torch.no_grad():
        whole = attention(q, k, v, MaskCodes(torch.from_numpy(codes)))
        torch.testing.assert_close(whole, ref, rtol=1e-5, atol=1e-5)
        if family == "causal":  # no mask: causal; and a one-token sequence
            torch.testing.assert_close(attention(q, k, v, None), ref, rtol=1e-5, atol=1e-5)
            one = attention(q[:1], k[:1], v[:1], MaskCodes(torch.from_numpy(codes[:, :1])))
            torch.testing.assert_close(one, ref[:1], rtol=1e-5, atol=1e-5)
        for cp in (2, 4):
            for method in ("ours", "zigzag"):
                covered = []
                for rank in range(cp):
                    cpm = context_parallel_mask(codes, cp, rank, method, CP_BLOCK, None, "cpu")
                    # the keys as the all-gather leaves them: every token, global order
                    out = attention._runs(q[cpm.local], k, v, cpm, HEADS // GROUPS)
                    torch.testing.assert_close(out.reshape(len(cpm.local), 2, -1),
                                               ref[cpm.local], rtol=1e-5, atol=1e-5,
                                               msg=lambda m: f"CP={cp} {method} {rank}: {m}")
                    covered += cpm.local.tolist()
                assert sorted(covered) == list(range(S))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_block_mask_marks_the_planned_tiles(family):
    codes = np.stack([family_codes(family, 1000, seed) for seed in (0, 1)])
    mask = block_mask(torch.from_numpy(codes), block=128)
    computed = mask.to_dense()[:, 0].bool().numpy()  # [B, nq, nk]: partial or full
    np.testing.assert_array_equal(computed, tile_map(codes, 128))
    # Full tiles (no mask evaluated) only where every pair is allowed, and some there are.
    full = np.zeros_like(computed)
    counts, indices = mask.full_kv_num_blocks[:, 0], mask.full_kv_indices[:, 0]
    allowed = dense_allowed(codes)
    for b in range(2):
        for i in range(computed.shape[1]):
            for j in indices[b, i, :counts[b, i]].tolist():
                full[b, i, j] = True
                tile = allowed[b, i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
                # (a short last query block may be full; a short key tile never is)
                assert tile.all() and tile.shape[1] == 128, (b, i, j)
    assert full.any()
    # Nothing of the mask is S x S: its tensors are per tile or per token.
    assert all(t.numel() <= 2 * 8 * 8 for t in mask.as_tuple() if isinstance(t, torch.Tensor))


def test_block_mask_reads_nothing_back_to_the_host():
    """Built from the codes where they live: no value of a device tensor is read on the
    host (the counter of tests/host_syncs.py), for a whole batch and a CP rank's rows."""
    from host_syncs import count_during

    codes = torch.from_numpy(np.stack([family_codes("packed", 1000, s) for s in (0, 1)]))
    rows = torch.arange(100, 600)
    for args in ((codes,), (codes, rows)):
        mask, counter = count_during(lambda: block_mask(*args))
        assert counter.found == [] and mask.kv_num_blocks.shape[:2] == (2, 1)


def test_one_kernel_over_all_heads_and_one_causal_block_mask(gloo_world, monkeypatch):
    """Without CP every head runs in one kernel (KV heads grouped only to overlap a CP
    gather: 4 KV groups once ran 2 kernels and a cat per layer), and the causal mask (no
    mask object) builds its BlockMask once for every layer of the batch; the result is
    the dense causal attention's. Dynamo's recompile limit is a clear error, not its eager
    fallback (which would materialise the scores)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models import flex_attention as fa

    from megatron_mm.models import cp_attention

    heads, groups = HEADS, GROUPS  # the compiled kernel's shapes (inductor's CPU template
    # fails on some others); one KV head a step: 2 kernels a layer before
    monkeypatch.setattr(cp_attention, "KV_HEADS_PER_STEP", 1)
    config = TransformerConfig(num_layers=1, hidden_size=heads * DIM, num_attention_heads=heads,
                               num_query_groups=groups, kv_channels=DIM, attention_dropout=0.0)
    attention = fa.FlexAttention(config, 1, None, "self")
    kernels, builds = [], []
    compiled, build = fa._compiled, fa.block_mask
    monkeypatch.setattr(fa, "_compiled", lambda *a, **k: kernels.append(a[0].shape[1])
                        or compiled(*a, **k))
    monkeypatch.setattr(fa, "block_mask", lambda *a, **k: builds.append(1) or build(*a, **k))
    g = torch.Generator().manual_seed(5)
    q = torch.randn(S, 2, heads, DIM, generator=g)
    k, v = (torch.randn(S, 2, groups, DIM, generator=g) for _ in range(2))
    with torch.no_grad():
        layers = [attention(q, k, v, None) for _ in range(2)]  # two layers, one batch
    assert kernels == [heads, heads], kernels  # one kernel a layer, every head in it
    assert len(builds) == 1, builds
    ref = _dense_heads(q, k, v, np.zeros((2, S), dtype=np.int64), heads // groups)
    for out in layers:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # the limit: one kernel more than Dynamo may hold (float64: another guard set)
    held = fa.compile_count()
    assert 1 <= held <= torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=held), torch.no_grad():
        with pytest.raises(fa.FlexRecompileLimit, match="past Dynamo's recompile limit"):
            attention(q.double(), k.double(), v.double(), None)
    assert fa.compile_count() == held


def _dense_heads(q, k, v, codes, per_group):
    allow = torch.from_numpy(dense_allowed(codes))
    kk, vv = (x.repeat_interleave(per_group, 2) for x in (k, v))
    scores = torch.einsum("qbhd,kbhd->bhqk", q, kk) / DIM ** 0.5
    probs = torch.softmax(scores.masked_fill(~allow[:, None], float("-inf")), -1)
    return torch.einsum("bhqk,kbhd->qbhd", probs, vv).reshape(q.shape[0], q.shape[1], -1)
