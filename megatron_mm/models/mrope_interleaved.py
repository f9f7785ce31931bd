"""Interleaved M-RoPE (Qwen3-VL's ``mrope_interleaved``): a head's rotary frequencies are
dealt to the temporal, height and width positions in turn (T H W T H W ...) rather than in
three contiguous sections as Megatron-Core's ``MultimodalRotaryEmbedding`` does.

Frequency j rotates by the height position when ``j % 3 == 1`` and ``j < 3 * section[1]``,
by the width position when ``j % 3 == 2`` and ``j < 3 * section[2]``, else by the temporal
one (transformers' ``Qwen3VLTextRotaryEmbedding.recomposition_frequencies``).
"""

from __future__ import annotations

from typing import List, Optional

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import (
    MultimodalRotaryEmbedding,
    get_pos_emb_on_this_cp_rank,
)


def interleaved_axes(half: int, mrope_section, device=None) -> torch.Tensor:
    """[half] long: the position axis (0 T, 1 H, 2 W) of each rotary frequency, made on
    ``device`` (filled there: no host data to copy)."""
    axes = torch.zeros(half, dtype=torch.long, device=device)
    for axis in (1, 2):
        axes[axis:3 * mrope_section[axis]:3] = axis
    return axes


class InterleavedMultimodalRotaryEmbedding(MultimodalRotaryEmbedding):
    """``MultimodalRotaryEmbedding`` with the frequencies interleaved over T, H, W; the same
    call and output ([S, B, 1, kv_channels], non-interleaved rotation halves).

    The frequencies' axes are made once per section and device, on the device: made on the
    host and copied in each forward, they cost a blocking host-to-device copy per LLM
    forward on CUDA."""

    def _axes(self, half: int, mrope_section, device) -> torch.Tensor:
        cache = self.__dict__.setdefault("_interleaved_axes", {})
        key = (half, tuple(int(s) for s in mrope_section), device)
        if key not in cache:
            cache[key] = interleaved_axes(half, mrope_section, device)
        return cache[key]

    def forward(self, position_ids: torch.Tensor, mrope_section: List[int],
                cp_group: Optional[torch.distributed.ProcessGroup] = None) -> torch.Tensor:
        if self.rotary_interleaved or self.seq_len_interpolation_factor is not None:
            raise ValueError("interleaved M-RoPE takes neither rotary_interleaved nor "
                             "seq_len_interpolation_factor")
        seq = position_ids.to(device=self.inv_freq.device, dtype=self.inv_freq.dtype)
        freqs = seq[..., None] * self.inv_freq  # [3, B, S, half]
        axes = self._axes(freqs.shape[-1], mrope_section, freqs.device)
        freqs = freqs.gather(0, axes.expand(1, *freqs.shape[1:])).squeeze(0)  # [B, S, half]
        emb = torch.cat((freqs, freqs), dim=-1)[..., None, :].transpose(0, 1).contiguous()
        if cp_group is None:
            cp_group = self.cp_group
        if cp_group is not None and cp_group.size() > 1:
            emb = get_pos_emb_on_this_cp_rank(emb, 0, cp_group)
        return emb
