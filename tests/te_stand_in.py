"""A stand-in for Megatron-Core's ``TEDotProductAttention`` on CPU (Transformer Engine is
not installed): it checks its arguments as Megatron-Core's wrapper and TE's
``DotProductAttention.forward`` do for ``qkv_format="thd"`` (TE >= 1.10 / 2.x), then
computes the varlen causal attention of each ``cu_seqlens`` segment, so a packed run
through the THD code path can be compared with the local masked path.

What is checked, from the sources: Megatron-Core's ``TEDotProductAttention.forward``
(``megatron/core/extensions/transformer_engine.py``: the ``PackedSeqParams`` fields it
forwards, ``causal`` -> ``padding_causal`` for THD) and TE's
``DotProductAttention.forward`` (q / k / v 3-D for THD, a ``padding`` mask type,
``cu_seqlens_q`` / ``cu_seqlens_kv`` 1-D of one shape and int32, ``batch_size =
len(cu_seqlens_q) - 1``; ``max_seqlen`` None makes TE read cu_seqlens on the host, and
``pad_between_seqs`` None, with padded cu_seqlens, compare them on the device, which the
step must not: refused here), the heads and head dim per partition and the GQA groups.
"""

from __future__ import annotations

import math

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule


class StandInTEDotProductAttention(MegatronModule):
    """Megatron-Core's ``TEDotProductAttention`` signature; THD and causal sbhd only."""

    def __init__(self, config, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout=None, softmax_scale=None,
                 k_channels=None, v_channels=None, cp_comm_type: str = "p2p",
                 pg_collection=None):
        super().__init__(config=config)
        tp = config.tensor_model_parallel_size
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.head_dim = config.kv_channels
        self.scale = softmax_scale or 1.0 / math.sqrt(self.head_dim)
        self.attn_mask_type = attn_mask_type
        self.qkv_format = "sbhd"
        self.calls = {"thd": 0, "sbhd": 0}

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None, num_splits=None):
        mask_type = attn_mask_type or self.attn_mask_type
        if packed_seq_params is None:
            assert attention_mask is None and mask_type == AttnMaskType.causal
            self.calls["sbhd"] += 1
            s, b = query.shape[:2]
            out = [self._attend(query[:, i], key[:, i], value[:, i]) for i in range(b)]
            return torch.stack(out, 1).reshape(s, b, -1)
        assert type(packed_seq_params) is PackedSeqParams, type(packed_seq_params)
        assert packed_seq_params.qkv_format == "thd", packed_seq_params.qkv_format
        # Megatron-Core: THD runs TE's padding variants (flash / cuDNN need is_padding)
        assert mask_type == AttnMaskType.causal, mask_type
        mask_type = AttnMaskType.padding_causal
        assert "padding" in mask_type.name
        assert attention_mask is None and attention_bias is None
        assert all(x.dim() == 3 for x in (query, key, value)), \
            "Queries, keys and values must be 3D tensors when qkv_format = thd!"
        cu_q, cu_kv = packed_seq_params.cu_seqlens_q, packed_seq_params.cu_seqlens_kv
        assert cu_q is not None and cu_kv is not None
        assert cu_q.shape == cu_kv.shape and cu_q.dim() == 1, \
            "cu_seqlens_q and cu_seqlens_kv must both have shape [batch_size + 1]!"
        assert cu_q.dtype == torch.int32 and cu_kv.dtype == torch.int32, \
            "cu_seqlens_q and cu_seqlens_kv must both be in dtype torch.int32!"
        assert cu_q.device == query.device, (cu_q.device, query.device)
        for name in ("max_seqlen_q", "max_seqlen_kv"):
            value_ = getattr(packed_seq_params, name)
            assert isinstance(value_, int), f"{name}={value_!r}: TE would read cu_seqlens"
        assert packed_seq_params.pad_between_seqs is False, \
            "pad_between_seqs None: TE would compare cu_seqlens on the device"
        t = query.shape[0]
        assert query.shape[1:] == (self.heads, self.head_dim), query.shape
        assert key.shape == value.shape == (t, self.groups, self.head_dim), key.shape
        # the kernel's part (here on the host, as a kernel reads its own arguments)
        bounds = cu_q.tolist()
        assert bounds == cu_kv.tolist() and bounds[0] == 0 and bounds[-1] == t, bounds
        lengths = [b - a for a, b in zip(bounds, bounds[1:])]
        assert max(lengths) <= packed_seq_params.max_seqlen_q
        self.calls["thd"] += 1
        out = [self._attend(query[a:b], key[a:b], value[a:b])
               for a, b in zip(bounds, bounds[1:])]
        return torch.cat(out).reshape(t, -1)

    def _attend(self, q, k, v):
        """Causal attention of one sequence: q [s, heads, d], k / v [s, groups, d]."""
        rep = self.heads // self.groups
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * self.scale
        s = q.shape[0]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)
