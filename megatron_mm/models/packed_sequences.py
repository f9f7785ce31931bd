"""Packed samples (``--data-balance``) on Transformer Engine: TE's THD varlen attention.

A packed micro-batch is one row [1, S] of several samples (``data/packing.py``:
``cu_seqlens``, int32, made on the host by the balancer's plan). The local path isolates
the samples with a dense block-diagonal causal mask; TE's ``DotProductAttention`` takes
them as ``qkv_format="thd"`` instead: q / k / v as [t, heads, dim], ``cu_seqlens_q`` /
``cu_seqlens_kv`` (int32, [samples + 1], on the device) and ``max_seqlen_q`` /
``max_seqlen_kv`` (Python ints: TE reads no device value for them), mask type
``padding_causal`` (Megatron-Core's ``TEDotProductAttention`` turns ``causal`` into it
for THD). No S x S mask exists.

Why the layers get a ``PackedSequences`` (``qkv_format="sbhd"``, the THD params inside)
rather than the THD ``PackedSeqParams`` itself: with a ``"thd"`` one Megatron-Core's
``Attention`` rotates q / k per sample (``apply_rotary_pos_emb`` with cu_seqlens: the
unfused path reads cu_seqlens back with ``.tolist()`` / ``.item()``; TE's fused THD kernel
restarts each sample's positions from freqs [max_seqlen], which M-RoPE's per-token 3-D
positions are not) and ``GPTModel`` sizes RoPE by ``max_seqlen``. The carrier keeps the
layer on [S, 1, ...] and says ``max_seqlen = S``, so RoPE (positions 0..S-1) and M-RoPE
(the batch's position ids) rotate exactly as on the local path; only the core attention
(``THDAttention``) squeezes q / k / v to [t, heads, dim] and runs TE's varlen kernel with
the THD params.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from .host_copy import to_device


@dataclass
class PackedSequences(PackedSeqParams):
    """What the LLM's layers take as ``packed_seq_params`` for one packed row: ``thd``,
    TE's description of its samples; the fields Megatron-Core reads outside the core
    attention keep it on the unpacked [S, 1, ...] layout (module docstring)."""

    thd: Optional[PackedSeqParams] = None
    # The dense block-diagonal mask of the local full-attention layers of a hybrid LLM,
    # whose Gated DeltaNet layers take ``thd`` (models/linear_attention.py); None: TE's THD.
    mask: Optional[torch.Tensor] = None
    # ``thd``'s cu_seqlens on the host, kept when the carrier moves to the device: FLA's
    # varlen kernels take it (``cu_seqlens_cpu``) instead of reading the device copy back
    cu_seqlens_cpu: Optional[torch.Tensor] = None

    def to(self, device) -> "PackedSequences":
        cu = to_device(self.thd.cu_seqlens_q, device)
        thd = dataclasses.replace(self.thd, cu_seqlens_q=cu, cu_seqlens_kv=cu)
        return dataclasses.replace(self, thd=thd)


def packed_sequences(cu_seqlens: torch.Tensor) -> PackedSequences:
    """The carrier of one packed row from its host ``cu_seqlens`` ([samples + 1] int32,
    the last one the row's length S)."""
    cu = cu_seqlens.detach().cpu().to(torch.int32)
    lengths = (cu[1:] - cu[:-1]).tolist()
    if cu.dim() != 1 or len(cu) < 2 or int(cu[0]) != 0 or min(lengths) < 1:
        raise ValueError(f"cu_seqlens must rise from 0 in steps >= 1, got {cu.tolist()}")
    longest, total = max(lengths), int(cu[-1])
    # no padding between samples (a padding tail is a sample of its own): said, so that
    # TE does not compare padded and plain cu_seqlens on the device to find out
    thd = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                          max_seqlen_q=longest, max_seqlen_kv=longest, pad_between_seqs=False)
    return PackedSequences(qkv_format="sbhd", max_seqlen_q=total, max_seqlen_kv=total, thd=thd,
                           cu_seqlens_cpu=cu)


class THDAttention:
    """Mixed in before a core attention with TE's THD contract (Megatron-Core's
    ``TEDotProductAttention``): with a ``PackedSequences`` q / k / v [S, 1, heads, dim]
    run as [S, heads, dim] under its THD params, the output back as [S, 1, heads x dim];
    anything else (an unpacked batch: validation, generation) goes through unchanged."""

    # One packed sequence (TE's THD varlen): what ``models/attention_backends`` reads.
    packed_thd = True

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None, **kwargs):
        if not isinstance(packed_seq_params, PackedSequences):
            return super().forward(query, key, value, attention_mask, attn_mask_type,
                                   attention_bias=attention_bias,
                                   packed_seq_params=packed_seq_params, **kwargs)
        if attention_mask is not None or attention_bias is not None:
            raise ValueError("THD attention over packed samples takes no mask or bias: "
                             "cu_seqlens say who attends to whom")
        if query.shape[1] != 1:
            raise ValueError(f"packed samples run as one row (batch 1), got query of shape "
                             f"{tuple(query.shape)}")
        out = super().forward(query.squeeze(1), key.squeeze(1), value.squeeze(1), None,
                              attn_mask_type=AttnMaskType.causal, attention_bias=None,
                              packed_seq_params=packed_seq_params.thd, **kwargs)
        return out.reshape(out.shape[0], 1, -1)


@functools.lru_cache(maxsize=None)
def thd_attention(base: type) -> type:
    """``THDAttention`` over ``base`` (Megatron-Core's ``TEDotProductAttention`` in the
    specs; a stand-in with TE's contract in the CPU tests)."""
    return type(f"THD{base.__name__}", (THDAttention, base), {"__module__": __name__})
