"""ContextParallelAttention against dense attention on the reference mask, for every mask
family, CP=2 and CP=4 and each token assignment: outputs and the gradients of queries,
keys and values (reduce-scattered back to each key's owner). Runs inside a 4-rank world
another test already launches (tests/training/test_context_parallel.py), so it costs no
process start of its own; ``assert_attention_errors`` judges what it returns."""

import numpy as np
import torch

FAMILIES = ("causal", "prefix_lm", "encoder_embedded", "packed")
# three KV groups: two gathers per layer (KV_HEADS_PER_STEP = 2), the second in flight
S, BLOCK, HEADS, GROUPS, DIM = 40, 4, 6, 3, 8


def _dense(q, k, v, codes):
    from megatron_mm.plan.context_parallel.attention_mask import dense_allowed

    allow = torch.from_numpy(dense_allowed(codes))  # [B, S, S]
    kk = k.repeat_interleave(HEADS // GROUPS, 2)
    vv = v.repeat_interleave(HEADS // GROUPS, 2)
    scores = torch.einsum("qbhd,kbhd->bhqk", q, kk) / DIM ** 0.5
    probs = torch.softmax(scores.masked_fill(~allow[:, None], float("-inf")), -1)
    return torch.einsum("bhqk,kbhd->qbhd", probs, vv).reshape(q.shape[0], q.shape[1], -1)


def check_attention(rank: int) -> dict:
    """Every rank of a 4-rank world (megatron-core state initialised) calls this."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_mm.models.context_parallel import context_parallel_mask
    from megatron_mm.models.cp_attention import ContextParallelAttention
    from megatron_mm.reproductions.mask_families import family_codes

    groups = {4: torch.distributed.new_group([0, 1, 2, 3]),
              2: [torch.distributed.new_group([0, 1]), torch.distributed.new_group([2, 3])]}
    config = TransformerConfig(num_layers=1, hidden_size=HEADS * DIM, num_attention_heads=HEADS,
                               num_query_groups=GROUPS, kv_channels=DIM,
                               attention_dropout=0.0)
    attn = ContextParallelAttention(config, 1, None, "self")
    errors = {}
    for family in FAMILIES:
        codes = np.stack([family_codes(family, S, seed) for seed in (0, 1)])
        g = torch.Generator().manual_seed(7)
        q = torch.randn(S, 2, HEADS, DIM, generator=g, requires_grad=True)
        k = torch.randn(S, 2, GROUPS, DIM, generator=g, requires_grad=True)
        v = torch.randn(S, 2, GROUPS, DIM, generator=g, requires_grad=True)
        w = torch.randn(S, 2, HEADS * DIM, generator=g)
        ref = _dense(q, k, v, codes)
        (ref * w).sum().backward()
        for cp, method, length in [(2, "ours", S), (4, "ours", S), (4, "zigzag", S),
                                   (4, "lpt", S), (4, "ours", 10)]:
            group = groups[4] if cp == 4 else groups[2][rank // 2]
            cp_rank = rank if cp == 4 else rank % 2
            c = codes[:, :length]
            cpm = context_parallel_mask(c, cp, cp_rank, method, BLOCK, group, "cpu")
            idx = cpm.local
            ql, kl, vl = (t.detach()[idx].clone().requires_grad_() for t in (q, k, v))
            if length == S:
                out = attn(ql, kl, vl, cpm)
                (out * w[idx]).sum().backward()
                expect = ref[idx]
                grads = [(ql.grad, q.grad[idx]), (kl.grad, k.grad[idx]), (vl.grad, v.grad[idx])]
            else:  # too short: every rank holds every token, nothing is gathered
                out = attn(ql, kl, vl, cpm)
                expect = _dense(*(t.detach()[:length] for t in (q, k, v)), c)
                grads = []
            err = [float((out - expect).abs().max())]
            err += [float((a - b).abs().max()) for a, b in grads]
            errors[(family, cp, method, length)] = (max(err), list(cpm.counts), cpm.replicated)
    return errors


def assert_attention_errors(ranks: list) -> None:
    unequal = False
    for errors in ranks:
        for case, (err, counts, replicated) in errors.items():
            assert err < 1e-5, (case, err)
            assert replicated == (case[3] < S), case
            unequal |= len(set(counts)) > 1
    assert unequal, "no case gave ranks unequal token counts"
