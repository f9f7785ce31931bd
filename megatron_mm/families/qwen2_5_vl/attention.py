"""The Qwen2.5-VL tower's variable-length attention: two routes from the same host segments.

Attention segments (in the window-permuted patch order, ``qwen2_5_vl_grid``): one per
window for the window layers, one per frame for the full-attention layers
(``--vision-fullatt-block-indexes``). Both routes are built on the host from the grids and
moved to the device with the batch, so no forward reads a device value:

- local (``--transformer-impl local``): each patch's segment id per kind, [2, P] int32
  (an O(P) copy); the [2, 1, P, P] block-diagonal masks (True = masked, Megatron-Core's
  convention) are compared out of them on the device, once per bound batch.
- Transformer Engine: Megatron-Core ``PackedSeqParams(qkv_format="thd", cu_seqlens_q/kv,
  max_seqlen_q/kv)`` per kind; cu_seqlens go to the device with the batch and max_seqlen
  are Python ints, so TE reads nothing back. No P x P mask exists.

Why the layers carry ``VisionAttentionSegments`` rather than a THD ``PackedSeqParams``:
Megatron-Core's ``TransformerBlock`` / ``TransformerLayer`` hand one ``packed_seq_params``
to every layer (window and full layers need different ones), and a ``"thd"`` one makes
``Attention`` rotate q / k per sequence (``apply_rotary_pos_emb`` with cu_seqlens: the
unfused path reads cu_seqlens back with ``.tolist()`` / ``.item()``, TE's fused THD kernel
restarts the positions at every sequence, which is wrong for the tower's per-patch angles).
The carrier says ``qkv_format="sbhd"``: the layer keeps [P, 1, heads, dim] and rotates each
patch by its own angles exactly as the local path does; only the core attention
(``SegmentedAttention``) picks its kind's THD params and runs TE's varlen kernel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import FrozenSet, Sequence

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from ...models.host_copy import to_device

WINDOW, FULL = 0, 1  # index of each kind in the stacked ids / masks


def segment_ids(seqlens: Sequence[int]) -> torch.Tensor:
    """[P] int32 (host): the segment each position belongs to."""
    return torch.repeat_interleave(torch.arange(len(seqlens), dtype=torch.int32),
                                   torch.tensor(list(seqlens), dtype=torch.long))


def segment_masks(ids: torch.Tensor, pad: int = 0) -> torch.Tensor:
    """[K, P] segment ids -> [K, 1, P + pad, P + pad] bool, True where masked; ``pad``
    trailing positions form a segment of their own (sequence-parallel padding: no real
    patch attends to it). Runs where ``ids`` is (the device): no value is read back."""
    if pad:
        ids = torch.nn.functional.pad(ids, (0, pad), value=-1)
    return (ids[:, :, None] != ids[:, None, :])[:, None]


def thd_params(seqlens: Sequence[int]) -> PackedSeqParams:
    """TE's THD description of ``seqlens`` (host): each segment attends within itself."""
    cu = torch.zeros(len(seqlens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(list(seqlens), dtype=torch.long).cumsum(0)
    longest = max(seqlens)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           max_seqlen_q=longest, max_seqlen_kv=longest)


@dataclass
class VisionAttentionSegments:
    """What the tower's layers pass as ``packed_seq_params``: each kind's THD params for the
    core attention; ``qkv_format`` "sbhd" keeps Megatron-Core's attention (rotary, shapes)
    on the unpacked [P, 1, ...] layout (see the module docstring)."""

    window: PackedSeqParams
    full: PackedSeqParams
    qkv_format: str = "sbhd"

    @classmethod
    def from_seqlens(cls, window_seqlens, frame_seqlens) -> "VisionAttentionSegments":
        return cls(thd_params(window_seqlens), thd_params(frame_seqlens))

    def to(self, device) -> "VisionAttentionSegments":
        def move(p: PackedSeqParams) -> PackedSeqParams:
            cu = to_device(p.cu_seqlens_q, device)
            return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                   max_seqlen_q=p.max_seqlen_q, max_seqlen_kv=p.max_seqlen_kv)
        return VisionAttentionSegments(move(self.window), move(self.full))


class SegmentedAttention:
    """Mixed in before a core attention that takes THD ``PackedSeqParams`` (TE's
    ``TEDotProductAttention``): this layer's kind of segments, q / k / v as [P, heads, dim]
    and the output back as [P, 1, heads x dim]. ``full_attention_layers``: 0-based layer
    indices that attend over whole frames."""

    # One packed sequence (TE's THD varlen): what ``models/attention_backends`` reads.
    packed_thd = True

    def __init__(self, *args, full_attention_layers: FrozenSet[int] = frozenset(), **kwargs):
        super().__init__(*args, **kwargs)
        # layer_number: Megatron-Core's, 1-based and global (pipeline offsets added).
        self.full_attention = kwargs["layer_number"] - 1 in full_attention_layers

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None, **kwargs):
        if not isinstance(packed_seq_params, VisionAttentionSegments):
            raise ValueError("the Qwen2.5-VL vision attention on Transformer Engine takes the "
                             "batch's VisionAttentionSegments as packed_seq_params")
        if attention_mask is not None or attention_bias is not None:
            raise ValueError("the THD vision attention takes no mask or bias: its segments "
                             "say who attends to whom")
        if query.shape[1] != 1:
            raise ValueError(f"the vision tower runs one packed sequence (batch 1), got "
                             f"query of shape {tuple(query.shape)}")
        params = packed_seq_params.full if self.full_attention else packed_seq_params.window
        out = super().forward(query.squeeze(1), key.squeeze(1), value.squeeze(1), None,
                              attn_mask_type=AttnMaskType.padding, attention_bias=None,
                              packed_seq_params=params, **kwargs)
        return out.reshape(out.shape[0], 1, -1)


@functools.lru_cache(maxsize=None)
def te_segmented_attention() -> type:
    """``SegmentedAttention`` over Megatron-Core's ``TEDotProductAttention`` (imported only
    when the TE spec is asked for)."""
    from megatron.core.extensions.transformer_engine import TEDotProductAttention

    return type("SegmentedTEDotProductAttention", (SegmentedAttention, TEDotProductAttention),
                {"__module__": __name__})


@dataclass
class PreparedAttention:
    """One batch's attention segments for either route: ``ids`` [2, P] int32 (each patch's
    window, frame) and their THD ``segments``; on the host until ``to``."""

    ids: torch.Tensor
    segments: VisionAttentionSegments

    @classmethod
    def from_seqlens(cls, window_seqlens, frame_seqlens) -> "PreparedAttention":
        ids = torch.stack([segment_ids(window_seqlens), segment_ids(frame_seqlens)])
        return cls(ids, VisionAttentionSegments.from_seqlens(window_seqlens, frame_seqlens))

    def to(self, device) -> "PreparedAttention":
        return PreparedAttention(to_device(self.ids, device), self.segments.to(device))

    def layer_inputs(self, thd: bool, pad: int = 0) -> dict:
        """The layers' ``attention_mask`` / ``packed_seq_params``: the segments (THD), or
        the stacked [2, 1, P + pad, P + pad] masks, built once per ``pad`` and kept."""
        if thd:
            if pad:
                raise ValueError("the THD vision attention takes no sequence-parallel "
                                 "padding (--sequence-parallel needs --transformer-impl local)")
            return {"attention_mask": None, "packed_seq_params": self.segments}
        masks = self.__dict__.setdefault("_masks", {})
        if pad not in masks:
            masks[pad] = segment_masks(self.ids, pad)
        return {"attention_mask": masks[pad]}
