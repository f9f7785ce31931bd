"""Context-parallel core attention for any mask, without Transformer Engine.

A drop-in for Megatron-Core's ``DotProductAttention`` in the layer spec. Each CP rank holds
the queries, keys and values of its own tokens (any subset of the sequence, as the token
assignment gives it). Per group of a few key/value heads it all-gathers K and V over the CP
group (asynchronously: the next group's gather runs under this group's attention), puts
them in global order, and runs each run of its local queries against only the
key interval those queries attend (``ContextParallelMask.runs``), with the mask evaluated
at global positions: the work per rank is the attention tiles the plan counted. In
backward the gather's gradient is reduce-scattered back to the owners of the keys.

Without a ``ContextParallelMask`` (inference, or a batch that is not split) it is plain
attention with the given dense mask (None = causal), on whatever tokens it is handed.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.module import MegatronModule

from .context_parallel import ContextParallelMask, allowed
from .cp_gather import GatherSequence, PendingGather

# Key/value heads gathered at a time: bounds each all-gather's buffer. The next group's
# gather is in flight while this group's attention runs. Autograd still keeps every group's
# gathered K/V until backward (no re-gather in backward; the attention probabilities it
# keeps are larger).
KV_HEADS_PER_STEP = 2


class ContextParallelAttention(MegatronModule):
    """Core attention (Megatron-Core's signature): [s, b, heads, dim] in, [s, b, h] out."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None,
                 pg_collection=None):
        super().__init__(config=config)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.head_dim = config.kv_channels
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(self.head_dim)
        p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.dropout = torch.nn.Dropout(p)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        assert attention_bias is None and packed_seq_params is None, (
            "ContextParallelAttention takes its mask as a ContextParallelMask")
        cpm = attention_mask if isinstance(attention_mask, ContextParallelMask) else None
        per_group = self.heads // self.groups
        steps = [(g0, min(self.groups, g0 + KV_HEADS_PER_STEP))
                 for g0 in range(0, self.groups, KV_HEADS_PER_STEP)]
        split = cpm is not None and not cpm.replicated

        def start(g0, g1):  # K and V of these heads, in flight
            return [PendingGather(x[:, :, g0:g1], cpm.counts, cpm.order, cpm.group)
                    for x in (key, value)]
        pending = start(*steps[0]) if split else None
        outputs = []
        for i, (g0, g1) in enumerate(steps):
            q = query[:, :, g0 * per_group:g1 * per_group]
            k, v = key[:, :, g0:g1], value[:, :, g0:g1]
            if cpm is None:
                outputs.append(self._dense(q, k, v, attention_mask, per_group))
                continue
            if split:
                current, pending = pending, (start(*steps[i + 1]) if i + 1 < len(steps)
                                             else None)
                k = GatherSequence.apply(k, current[0], cpm.group)
                v = GatherSequence.apply(v, current[1], cpm.group)
            outputs.append(self._runs(q, k, v, cpm, per_group))
        out = torch.cat(outputs, dim=2)  # [s, b, heads, dim]
        return out.reshape(out.shape[0], out.shape[1], -1)

    def _attend(self, q, k, v, allow, per_group):
        """q [sq, b, hq, d], k/v [sk, b, hk, d], allow [b, sq, sk] -> [sq, b, hq, d]."""
        k = k.repeat_interleave(per_group, dim=2)
        v = v.repeat_interleave(per_group, dim=2)
        scores = torch.einsum("qbhd,kbhd->bhqk", q, k).float() * self.softmax_scale
        scores = scores.masked_fill(~allow[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        if self.dropout.p > 0:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = self.dropout(probs)
        return torch.einsum("bhqk,kbhd->qbhd", probs, v)

    def _runs(self, q, k, v, cpm: ContextParallelMask, per_group):
        pieces = []
        for start, end, lo, hi in cpm.runs:
            pos_q = cpm.local[start:end]
            pos_k = torch.arange(lo, hi, device=pos_q.device)
            allow = allowed(cpm.codes[:, pos_q], pos_q, cpm.codes[:, lo:hi], pos_k)
            pieces.append(self._attend(q[start:end], k[lo:hi], v[lo:hi], allow, per_group))
        return torch.cat(pieces)

    def _dense(self, q, k, v, attention_mask, per_group):
        s = q.shape[0]
        if attention_mask is None:
            allow = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()[None]
        else:
            allow = ~attention_mask[:, 0]
        return self._attend(q, k, v, allow.expand(q.shape[1], s, s), per_group)
