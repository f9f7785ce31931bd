"""Qwen3-VL's learned position table resampled to each grid, on the host.

The tower learns a square table of ``side x side`` position embeddings; every frame of an
item of grid (t, h, w) takes it bilinearly resized to h x w (``align_corners=True``), each
patch a weighted sum of 4 table rows. Which rows and weights depends on the grids alone,
so they are built here from Python ints (the arithmetic of transformers'
``get_vision_interpolation_indices_and_weights``, float32) and the forward only gathers
and sums: ``(table[index] * weight[..., None]).sum(1)``.
"""

from __future__ import annotations

from typing import List, Tuple

import torch


def _axis_taps(n: int, side: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """[n, 2] table indices and weights of positions 0..n-1 on an axis resized from
    ``side`` (align_corners: the ends map onto the ends)."""
    index = torch.arange(n, dtype=torch.float32)
    src = index * (side - 1) / torch.clamp(torch.tensor(n - 1), min=1)
    floor = torch.floor(src)
    offsets = torch.arange(0, 2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def position_taps(grids: List[Tuple[int, int, int]], side: int,
                  merge: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """[patches, 4] long table rows and [patches, 4] float32 weights of every patch of
    ``grids``, in the processor's order (items, frames, merge units row-major, the
    ``merge x merge`` patches of a unit row-major)."""
    indices, weights = [], []
    for t, h, w in grids:
        rows = torch.arange(h).reshape(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        cols = torch.arange(w).reshape(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        rows = rows.permute(0, 2, 1, 3).reshape(-1)
        cols = cols.permute(0, 2, 1, 3).reshape(-1)
        h_taps, h_weights = _axis_taps(h, side)
        w_taps, w_weights = _axis_taps(w, side)
        index = (h_taps[rows][:, :, None] * side + w_taps[cols][:, None, :]).reshape(-1, 4)
        weight = (h_weights[rows][:, :, None] * w_weights[cols][:, None, :]).reshape(-1, 4)
        indices.append(index.repeat(t, 1))
        weights.append(weight.repeat(t, 1))
    return torch.cat(indices), torch.cat(weights)
